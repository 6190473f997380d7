// DCP ownership (the host parts of mla/dcp.hpp) and the checks that W ranks run the same step.
#include "core/dcp.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mla/error.hpp"

namespace mla {
namespace dcp {

void validate(const LayerConfig& cfg, const DcpInfo& d) {
  MLA_REQUIRE(d.size >= 1, "dcp.size: expected >= 1, got ", d.size);
  MLA_REQUIRE(cfg.tp_size % d.size == 0, "dcp.size: expected a divisor of tp_size = ", cfg.tp_size,
              " (G = N*W gathered heads must divide the model's ", cfg.total_heads, " heads), got ", d.size);
  MLA_REQUIRE(d.rank >= 0 && d.rank < d.size, "dcp.rank: expected in [0, ", d.size, "), got ", d.rank);
  MLA_REQUIRE(d.interleave >= 1, "dcp.interleave: expected >= 1, got ", d.interleave);
}

void slot_mapping(const DcpInfo& d, std::span<const int32_t> seq_lens, int qlen,
                  std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices, int page_size,
                  std::span<int64_t> out) {
  const int64_t b_count = int64_t(seq_lens.size());
  MLA_REQUIRE(qlen >= 1, "slot_mapping: qlen expected >= 1, got ", qlen);
  MLA_REQUIRE(page_size >= 1, "slot_mapping: page_size expected >= 1, got ", page_size);
  MLA_REQUIRE(int64_t(kv_indptr.size()) == b_count + 1, "slot_mapping: kv_indptr expected ", b_count + 1,
              " entries, got ", kv_indptr.size());
  MLA_REQUIRE(int64_t(out.size()) == b_count * qlen, "slot_mapping: out expected ", b_count * qlen,
              " entries, got ", out.size());
  for (int64_t b = 0; b < b_count; ++b) {
    const int64_t len = seq_lens[b];
    int64_t* slots = out.data() + b * qlen;
    if (len == 0) {  // an empty (padding) request writes nothing
      std::fill(slots, slots + qlen, int64_t(-1));
      continue;
    }
    MLA_REQUIRE(len >= qlen, "slot_mapping: seq_lens[", b, "] = ", len, " expected 0 or >= qlen = ", qlen);
    const int64_t first = kv_indptr[b], pages = int64_t(kv_indptr[b + 1]) - first;
    MLA_REQUIRE(first >= 0 && pages >= 0 && kv_indptr[b + 1] <= int64_t(kv_indices.size()),
                "slot_mapping: kv_indptr[", b, "..", b + 1, "] = [", first, ", ", kv_indptr[b + 1],
                ") expected a range within kv_indices' ", kv_indices.size(), " entries");
    const int64_t local = dcp::local_length(d, len);
    MLA_REQUIRE(pages * page_size >= local, "slot_mapping: request ", b, " has ", pages, " pages of ", page_size,
                " rows on rank ", d.rank, ", expected room for its ", local, " local rows");
    for (int i = 0; i < qlen; ++i) slots[i] = slot_of(d, len - qlen + i, kv_indices.data() + first, page_size);
  }
}

std::vector<int64_t> slot_mapping(const DcpInfo& d, std::span<const int32_t> seq_lens, int qlen,
                                  std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                                  int page_size) {
  std::vector<int64_t> out(seq_lens.size() * size_t(std::max(qlen, 0)));
  slot_mapping(d, seq_lens, qlen, kv_indptr, kv_indices, page_size, out);
  return out;
}

}  // namespace dcp

namespace detail {

void validate_dcp_options(const LayerConfig& cfg, const LayerOptions& opts, Device layer_device) {
  const DcpInfo& d = opts.dcp;
  dcp::validate(cfg, d);
  if (d.size == 1) return;
  MLA_REQUIRE(opts.comm != nullptr, "LayerOptions.comm: dcp.size ", d.size, " needs a communicator");
  MLA_REQUIRE(opts.comm->size() == d.size, "LayerOptions.comm: size() expected dcp.size = ", d.size, ", got ",
              opts.comm->size());
  MLA_REQUIRE(opts.comm->rank() == d.rank, "LayerOptions.comm: rank() expected dcp.rank = ", d.rank, ", got ",
              opts.comm->rank());
  MLA_REQUIRE(opts.comm->device() == layer_device, "LayerOptions.comm: device() expected ",
              device_name(layer_device), " (the layer's), got ", device_name(opts.comm->device()));
}

namespace {

// What every rank must agree on, in a fixed-size blob for all_gather_host.
struct StepFingerprint {
  int32_t ok = 1;         // this rank's own validation passed
  int32_t tokens = 0;     // S
  int32_t qlen = 0;
  int32_t batch = 0;
  int32_t has_seq_lens = 0;
  uint64_t seq_lens_hash = 0;
  char error[216] = {};   // this rank's validation error, truncated
};

uint64_t fnv1a(const int32_t* v, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x = uint32_t(v[i]);
    for (int k = 0; k < 4; ++k, x >>= 8) h = (h ^ (x & 0xFF)) * 1099511628211ull;
  }
  return h;
}

}  // namespace

void check_step_agreement(const LayerOptions& opts, const StepMeta& meta, const std::string& local_error) {
  if (opts.dcp.size == 1 || opts.comm == nullptr) {
    if (!local_error.empty()) throw Error(local_error);
    return;
  }
  Communicator& comm = *opts.comm;
  // Under CUDA-graph capture the step is recorded, not run: it was (or will be) checked eagerly.
  if (!comm.can_block(opts.cuda_stream)) {
    if (!local_error.empty()) throw Error(local_error);
    return;
  }
  StepFingerprint mine;
  mine.ok = local_error.empty() ? 1 : 0;
  std::memcpy(mine.error, local_error.data(), std::min(local_error.size(), sizeof(mine.error) - 1));
  if (meta.seq_lens.rank == 1) {
    mine.batch = int32_t(meta.seq_lens.shape[0]);
    mine.qlen = meta.qlen;
    mine.tokens = int32_t(meta.tokens());
    // seq_lens are compared where the host can read them without a device copy.
    const bool host = meta.seq_lens.device == Device::cpu && meta.seq_lens.data != nullptr &&
                      meta.seq_lens.dtype == DType::i32;
    if (!meta.seq_lens_host.empty()) {
      mine.has_seq_lens = 1;
      mine.seq_lens_hash = fnv1a(meta.seq_lens_host.data(), int64_t(meta.seq_lens_host.size()));
    } else if (host) {
      std::vector<int32_t> v(mine.batch);
      for (int b = 0; b < mine.batch; ++b) v[b] = meta.seq_lens.ptr<int32_t>()[b * meta.seq_lens.stride[0]];
      mine.has_seq_lens = 1;
      mine.seq_lens_hash = fnv1a(v.data(), mine.batch);
    }
  }
  std::vector<StepFingerprint> all(comm.size());
  comm.all_gather_host(&mine, all.data(), sizeof(StepFingerprint));
  // Every rank evaluates the same gathered data in the same order: all throw, or none.
  for (int q = 0; q < comm.size(); ++q) {
    if (all[q].ok) continue;
    if (q == comm.rank()) throw Error(local_error);
    detail::fail("dcp: rank ", q, " of ", comm.size(), " rejected the step, so no rank runs it: ", all[q].error);
  }
  const StepFingerprint& r0 = all[0];
  for (int q = 1; q < comm.size(); ++q) {
    const StepFingerprint& f = all[q];
    MLA_REQUIRE(f.tokens == r0.tokens && f.qlen == r0.qlen && f.batch == r0.batch,
                "dcp: ranks disagree on the step: rank 0 has S = ", r0.tokens, ", qlen = ", r0.qlen, ", B = ",
                r0.batch, "; rank ", q, " has S = ", f.tokens, ", qlen = ", f.qlen, ", B = ", f.batch);
    MLA_REQUIRE(!(f.has_seq_lens && r0.has_seq_lens) || f.seq_lens_hash == r0.seq_lens_hash,
                "dcp: ranks disagree on the step: rank ", q, "'s seq_lens differ from rank 0's (they must be the "
                "global lengths, the same on every rank)");
  }
}

void gather_query(const LayerConfig& cfg, const LayerOptions& opts, const TensorView& q, void* stream) {
  if (opts.dcp.size == 1) return;
  const int64_t n = cfg.heads(), row = cfg.row_dim(), elem = int64_t(dtype_size(q.dtype));
  MLA_REQUIRE(q.rank == 3 && (q.shape[2] <= 1 || q.stride[2] == 1) && (q.shape[1] <= 1 || q.stride[1] == row),
              "pre: the DCP query gather needs each token's heads packed (q.stride = [*, ", row, ", 1]), got ",
              q.str());
  char* base = static_cast<char*>(q.data);
  const int64_t chunk = n * row * elem;
  opts.comm->all_gather_rows({.send = base + opts.dcp.rank * chunk, .send_stride = q.stride[0] * elem,
                              .recv = base, .recv_stride = q.stride[0] * elem, .rows = q.shape[0],
                              .chunk_bytes = chunk},
                             stream);
}

namespace {
int64_t splits_of(const TensorView& o) { return o.rank == 4 ? o.shape[0] : 1; }
}  // namespace

std::vector<int64_t> exchanged_o_shape(const LayerConfig& cfg, const LayerOptions& opts, const TensorView& o) {
  return {opts.dcp.size * splits_of(o), o.shape[o.rank - 3], cfg.heads(), cfg.kv_lora_rank};
}
std::vector<int64_t> exchanged_lse_shape(const LayerConfig& cfg, const LayerOptions& opts, const TensorView& o) {
  return {opts.dcp.size * splits_of(o), o.shape[o.rank - 3], cfg.heads()};
}

void exchange_partials(const LayerConfig& cfg, const LayerOptions& opts, const AttendOutputs& attn,
                       const AttendOutputs& mine, void* stream) {
  const TensorView &o = attn.o, &lse = attn.lse;
  const int64_t n = cfg.heads(), l = cfg.kv_lora_rank, w = opts.dcp.size;
  const int64_t splits = splits_of(o), s = o.shape[o.rank - 3];
  const int64_t oe = int64_t(dtype_size(o.dtype)), le = int64_t(dtype_size(lse.dtype));
  const int d = o.rank - 3;  // o's token dimension (lse's too)
  MLA_REQUIRE(o.stride[d + 2] == 1 && (o.shape[d + 1] <= 1 || o.stride[d + 1] == l) &&
                  (lse.shape[d + 1] <= 1 || lse.stride[d + 1] == 1),
              "post: the DCP combine needs each token's heads packed (o.stride[..., ", l,
              ", 1], lse.stride[..., 1]), got o ", o.str(), ", lse ", lse.str());
  MLA_REQUIRE(mine.o.is_contiguous() && mine.lse.is_contiguous() && mine.o.dtype == o.dtype &&
                  mine.o.numel() == w * splits * s * n * l && mine.lse.numel() == w * splits * s * n,
              "post: the DCP combine's destination must be contiguous [", w * splits, ", ", s, ", ", n, ", ", l,
              "] ", dtype_name(o.dtype), " and [", w * splits, ", ", s, ", ", n, "] f32, got ", mine.o.str(), " and ",
              mine.lse.str());
  // Rows are tokens of every split: one collective per tensor when the splits are evenly spaced
  // (a contiguous [splits, S, G, L]), else one per split.
  const bool one_call = splits == 1 || (o.stride[0] == s * o.stride[1] && lse.stride[0] == s * lse.stride[1]);
  const int64_t calls = one_call ? 1 : splits, rows = one_call ? splits * s : s;
  char* recv_o = static_cast<char*>(mine.o.data);
  char* recv_lse = static_cast<char*>(mine.lse.data);
  for (int64_t c = 0; c < calls; ++c) {
    const char* send_o = static_cast<const char*>(o.data) + (o.rank == 4 ? c * o.stride[0] * oe : 0);
    const char* send_lse = static_cast<const char*>(lse.data) + (lse.rank == 3 ? c * lse.stride[0] * le : 0);
    opts.comm->all_to_all_rows({.send = send_o, .send_stride = o.stride[d] * oe,
                                .recv = recv_o + c * s * n * l * oe, .recv_block_stride = splits * s * n * l * oe,
                                .recv_stride = n * l * oe, .rows = rows, .chunk_bytes = n * l * oe},
                               stream);
    opts.comm->all_to_all_rows({.send = send_lse, .send_stride = lse.stride[d] * le,
                                .recv = recv_lse + c * s * n * le, .recv_block_stride = splits * s * n * le,
                                .recv_stride = n * le, .rows = rows, .chunk_bytes = n * le},
                               stream);
  }
}

}  // namespace detail
}  // namespace mla
