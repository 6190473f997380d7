// The CPU attend stage (SPEC.md, attend): paged MLA decode attention over this rank's cache.
//
// Each cache row of a request is read from memory once for all G heads and all Q queries. A work
// item is (request, chunk of its local keys); it walks its keys in blocks of kBlock rows:
// convert the block once into scratch, fp32 or (AVX512-BF16) raw bf16 values, prefetching the next
// block's scattered pages meanwhile; score it against every query row (G*Q rows; sm_scale and
// q_scale folded into the fp32 copy of q, or applied to the bf16 scores), fold the scores into each row's online-softmax state (core/softmax_state.hpp) and accumulate
// P.V into fp32 accumulators. The inner kernels are per instruction set (attend_kernels.hpp).
// The causal mask in global positions (DCP-aware) makes each query's visible keys a prefix of the
// local keys, so a row stops at its prefix; no key past the request's local length is read, so
// NaN in a page tail or an unused page never reaches the arithmetic.
//
// Work items run under OpenMP, longest first. Rank-4 outputs get one item per (request, chunk)
// with the chunking SPEC.md fixes; rank-3 outputs may be split internally (num_splits) and merged
// through the same softmax state as every other merge.
#include <immintrin.h>  // _mm_prefetch
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/softmax_state.hpp"
#include "cpu/attend_kernels.hpp"
#include "cpu/stages.hpp"
#include "mla/dcp.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"

namespace mla::cpu {
namespace {

constexpr int kBlock = 64;       // keys dequantized per block: 64 rows of 576 fp32 = 144 KiB (L2)
constexpr int kMinChunk = 512;   // shortest chunk worth a work item of its own (rank-3 outputs)
constexpr int kMaxAutoSplits = 64;
// Cap on the fp32 partials of an internal split ([parts, rows, 512]): at G*Q = 1024 query rows a
// partial is 2 MiB, so the plan coarsens its chunks rather than allocate hundreds of MiB.
constexpr int64_t kMaxPartialBytes = int64_t(32) << 20;
// Below this much work (key rows x query rows, about 50 us on one core) the threads' wake-up and
// barrier cost more than they save, and a loaded machine makes them cost far more: run on one.
constexpr int64_t kMinParallelCost = int64_t(64) * 64 * 12;

// ---- work items -------------------------------------------------------------------------------

struct Geometry {
  int qlen, g, rows;   // rows = qlen * g query rows per request, row r = i*g + h
  int row_dim, width;  // 576 and L = 512
  int page_size;
  DcpInfo dcp;
};

// Where a work item's normalized result goes: an o/lse view (rank 3, or one split of rank 4), or
// the fp32 scratch of an internal split ([rows, width] and [rows], contiguous).
struct Destination {
  void* o = nullptr;
  DType o_dtype = DType::f32;
  int64_t o_s = 0, o_h = 0, o_l = 0;  // strides of token, head, latent column
  float* lse = nullptr;
  int64_t lse_s = 0, lse_h = 0;
};

struct WorkItem {
  int b;
  int64_t lo, hi;   // local keys [lo, hi) of request b
  Destination dst;
  int64_t token0;   // query i of request b goes to token token0 + i of dst
  int64_t cost;
};

struct Scratch {
  std::vector<float> q, keys, s, acc, o_row;
  std::vector<uint16_t> q16, keys16;  // raw bf16 values for the kernels' bf16 trio
  std::vector<SoftmaxState> state;
  void reserve(const Geometry& geo, bool bf16_keys) {
    q.resize(bf16_keys ? 0 : size_t(geo.rows) * geo.row_dim);
    q16.resize(bf16_keys ? size_t(geo.rows) * geo.row_dim : 0);
    keys16.resize(bf16_keys ? size_t(kBlock) * geo.row_dim : 0);
    keys.resize(bf16_keys ? 0 : size_t(kBlock) * geo.row_dim);
    s.resize(size_t(geo.rows) * kBlock);
    acc.resize(size_t(geo.rows) * geo.width);
    o_row.resize(geo.width);
    state.resize(geo.rows);
  }
};

struct Inputs {
  const TensorView& q;
  const TensorView& pages;
  const int32_t* seq_lens;  // host copies, contiguous
  const int32_t* kv_indptr;
  const int32_t* kv_indices;
  float q_mul;    // sm_scale * q_scale (fp8 query) folded into the fp32 copy of q
  float k_scale;  // 1 for a bf16 cache
  // The kernels' bf16 trio: keys kept as raw bf16 values, scores scaled by q_mul * k_scale
  // afterwards, o by k_scale.
  bool bf16_keys;
};

void write_row(const Destination& d, int64_t s, int h, const float* o, int width, float lse) {
  d.lse[s * d.lse_s + h * d.lse_h] = lse;
  if (d.o_dtype == DType::f32) {
    float* dst = static_cast<float*>(d.o) + s * d.o_s + h * d.o_h;
    if (d.o_l == 1) std::memcpy(dst, o, sizeof(float) * width);
    else for (int c = 0; c < width; ++c) dst[c * d.o_l] = o[c];
  } else {
    uint16_t* dst = static_cast<uint16_t*>(d.o) + s * d.o_s + h * d.o_h;
    for (int c = 0; c < width; ++c) dst[c * d.o_l] = float_to_bf16(o[c]);
  }
}

void run_item(const AttendKernels& kern, const Inputs& in, const Geometry& geo, const WorkItem& item, Scratch& sc) {
  const int b = item.b, rows = geo.rows, row_dim = geo.row_dim, width = geo.width;
  const int64_t global_len = in.seq_lens[b];

  // Each query's visible keys are the prefix [0, visible[i]) of the local keys.
  int64_t visible[8] = {};
  int64_t end = item.lo;
  for (int i = 0; i < geo.qlen; ++i) {
    visible[i] = global_len == 0 ? 0 : std::min(item.hi, dcp::local_length(geo.dcp, global_len - geo.qlen + i + 1));
    end = std::max(end, visible[i]);
  }

  for (int r = 0; r < rows; ++r) sc.state[r] = SoftmaxState{};
  if (end > item.lo) {
    // q rows of request b: fp32 with sm_scale (and q_scale) folded in, or the raw values in bf16
    // (exact: an fp8 value has 4 significant bits) for the bf16 score kernels.
    const TensorView& q = in.q;
    const bool q_fp8 = q.dtype == DType::fp8_e4m3;
    for (int i = 0; i < geo.qlen; ++i)
      for (int h = 0; h < geo.g; ++h) {
        const int64_t base = (int64_t(b) * geo.qlen + i) * q.stride[0] + h * q.stride[1];
        const size_t row = size_t(i * geo.g + h) * row_dim;
        for (int c = 0; c < row_dim; ++c) {
          const int64_t at = base + c * q.stride[2];
          const float x = q_fp8 ? fp8e4m3_to_float(q.ptr<const uint8_t>()[at]) : bf16_to_float(q.ptr<const uint16_t>()[at]);
          if (in.bf16_keys) sc.q16[row + c] = uint16_t(std::bit_cast<uint32_t>(x) >> 16);
          else sc.q[row + c] = x * in.q_mul;
        }
      }
    std::fill(sc.acc.begin(), sc.acc.end(), 0.0f);
  }

  const TensorView& pages = in.pages;
  const size_t elem = dtype_size(pages.dtype);
  const int32_t* request_pages = in.kv_indices + in.kv_indptr[b];
  // Row addresses of keys [j, j + n): one division per block, not one per row.
  auto rows_of = [&](int64_t j, int n, const char** out) {
    int64_t p = j / geo.page_size, r = j % geo.page_size;
    for (int k = 0; k < n; ++k) {
      out[k] = static_cast<const char*>(pages.data) +
               (int64_t(request_pages[p]) * pages.stride[0] + r * pages.stride[1]) * int64_t(elem);
      if (++r == geo.page_size) r = 0, ++p;
    }
  };
  const int64_t row_bytes = int64_t(row_dim) * pages.stride[2] * int64_t(elem);
  const char* row[kBlock];       // this block's rows
  const char* next_row[kBlock];  // the next block's
  if (item.lo < end) rows_of(item.lo, int(std::min<int64_t>(kBlock, end - item.lo)), row);
  for (int64_t k0 = item.lo; k0 < end; k0 += kBlock) {
    const int nkeys = int(std::min<int64_t>(kBlock, end - k0));
    const int nnext = int(std::clamp<int64_t>(end - k0 - kBlock, 0, kBlock));
    rows_of(k0 + kBlock, nnext, next_row);
    // Each row converted, and the next block's row k fetched into L2 meanwhile: the pages are
    // scattered, so the hardware prefetcher cannot run ahead across them, and the block's
    // arithmetic hides the fetch. (Spread out like this, not 576 prefetches in a burst after the
    // conversion: 25 % less time at B = 8 x 16384, the burst stalling as the miss queue fills.)
    for (int k = 0; k < nkeys; ++k) {
      if (in.bf16_keys)
        kern.bf16_row(pages.dtype, row[k], pages.stride[2], row_dim, &sc.keys16[size_t(k) * row_dim]);
      else
        kern.dequant_row(pages.dtype, row[k], pages.stride[2], row_dim, in.k_scale, &sc.keys[size_t(k) * row_dim]);
      if (k < nnext)
        for (int64_t line = 0; line < row_bytes; line += 64) _mm_prefetch(next_row[k] + line, _MM_HINT_T1);
    }
    // Queries that see the same keys of this block (all of them, but near the causal edge) share
    // one call over their rows: taller tiles than G rows alone.
    for (int i = 0, next; i < geo.qlen; i = next) {
      const int nv = int(std::clamp<int64_t>(visible[i] - k0, 0, nkeys));
      for (next = i + 1; next < geo.qlen && std::clamp<int64_t>(visible[next] - k0, 0, nkeys) == nv;) ++next;
      if (nv == 0) continue;
      const int r0 = i * geo.g, nrows = (next - i) * geo.g;
      float* s = &sc.s[size_t(r0) * kBlock];
      if (in.bf16_keys)
        kern.scores_bf16(&sc.q16[size_t(r0) * row_dim], row_dim, nrows, sc.keys16.data(), row_dim, nv, row_dim, s, kBlock);
      else
        kern.scores(&sc.q[size_t(r0) * row_dim], row_dim, nrows, sc.keys.data(), row_dim, nv, row_dim, s, kBlock);
      for (int h = 0; h < nrows; ++h) {
        float* srow = s + size_t(h) * kBlock;
        if (in.bf16_keys)
          for (int k = 0; k < nv; ++k) srow[k] *= in.q_mul * in.k_scale;
        for (int k = nv; k < (nv + kScorePad - 1) / kScorePad * kScorePad; ++k) srow[k] = -INFINITY;
        kern.softmax_block(srow, nv, sc.state[r0 + h], &sc.acc[size_t(r0 + h) * width], width);
      }
      if (in.bf16_keys)
        kern.pv_bf16(s, kBlock, nrows, sc.keys16.data(), row_dim, nv, width, &sc.acc[size_t(r0) * width], width);
      else
        kern.pv(s, kBlock, nrows, sc.keys.data(), row_dim, nv, width, &sc.acc[size_t(r0) * width], width);
    }
    std::copy(next_row, next_row + nnext, row);
  }

  // Normalize (the bf16 trio's values are raw: times k_scale); a row that saw no key comes out
  // o = 0, lse = -inf (inv_sum() = 0, lse() = -inf).
  for (int r = 0; r < rows; ++r) {
    const SoftmaxState& st = sc.state[r];
    const float inv = st.inv_sum() * (in.bf16_keys ? in.k_scale : 1.0f);
    float* o = sc.o_row.data();
    if (st.empty()) std::fill(o, o + width, 0.0f);
    else for (int c = 0; c < width; ++c) o[c] = sc.acc[size_t(r) * width + c] * inv;
    write_row(item.dst, item.token0 + r / geo.g, r % geo.g, o, width, st.lse());
  }
}

const AttendKernels* forced_kernels = nullptr;

std::vector<int32_t> host_ints(const TensorView& v) {
  std::vector<int32_t> out(v.shape[0]);
  for (int64_t i = 0; i < v.shape[0]; ++i) out[i] = v.ptr<const int32_t>()[i * v.stride[0]];
  return out;
}

}  // namespace

const AttendKernels& attend_kernels() {
  if (forced_kernels) return *forced_kernels;
  static const AttendKernels& best = attend_kernels_avx512_bf16() ? *attend_kernels_avx512_bf16()
                                     : attend_kernels_avx512()    ? *attend_kernels_avx512()
                                                                  : attend_kernels_avx2();
  return best;
}

void set_attend_kernels_for_testing(const AttendKernels* k) { forced_kernels = k; }

void attend(const Context& ctx, const TensorView& q, const KVCache& cache, const StepMeta& meta,
            const AttendOutputs& out) {
  const LayerConfig& cfg = ctx.cfg;
  const Geometry geo{.qlen = meta.qlen,
                     .g = cfg.heads() * ctx.opts.dcp.size,
                     .rows = meta.qlen * cfg.heads() * ctx.opts.dcp.size,
                     .row_dim = cfg.row_dim(),
                     .width = cfg.kv_lora_rank,
                     .page_size = cache.page_size(),
                     .dcp = ctx.opts.dcp};
  const int batch = meta.batch();
  MLA_REQUIRE(geo.qlen >= 1 && geo.qlen <= 8, "attend: qlen must be in 1..8, got ", geo.qlen);
  MLA_REQUIRE(geo.row_dim % 16 == 0 && geo.width % 16 == 0, "attend: the CPU kernels need L+R and L multiples of 16, got L+R = ",
              geo.row_dim, ", L = ", geo.width);

  const std::vector<int32_t> seq_lens = host_ints(meta.seq_lens);
  const std::vector<int32_t> kv_indptr = host_ints(meta.kv_indptr);
  const std::vector<int32_t> kv_indices = host_ints(meta.kv_indices);
  // Reads stay inside the cache even if a caller skipped validation: every page a request's local
  // length needs exists in its page table and in the cache.
  std::vector<int64_t> local_len(batch);
  for (int b = 0; b < batch; ++b) {
    MLA_REQUIRE(seq_lens[b] == 0 || seq_lens[b] >= geo.qlen, "attend: seq_lens[", b, "] = ", seq_lens[b],
                ", expected 0 or >= qlen = ", geo.qlen);
    MLA_REQUIRE(kv_indptr[b] >= 0 && kv_indptr[b] <= kv_indptr[b + 1] && kv_indptr[b + 1] <= int64_t(kv_indices.size()),
                "attend: kv_indptr[", b, "..", b + 1, "] = ", kv_indptr[b], "..", kv_indptr[b + 1],
                " is not a monotone range inside kv_indices [0, ", kv_indices.size(), "]");
    local_len[b] = dcp::local_length(geo.dcp, seq_lens[b]);
    const int64_t need = (local_len[b] + geo.page_size - 1) / geo.page_size;
    MLA_REQUIRE(kv_indptr[b + 1] - kv_indptr[b] >= need, "attend: request ", b, " needs ", need,
                " pages for local length ", local_len[b], ", kv_indptr gives ", kv_indptr[b + 1] - kv_indptr[b]);
    for (int64_t p = 0; p < need; ++p) {
      const int32_t page = kv_indices[kv_indptr[b] + p];
      MLA_REQUIRE(page >= 0 && page < cache.num_pages(), "attend: kv_indices[", kv_indptr[b] + p, "] = ", page,
                  " is out of range [0, ", cache.num_pages(), ")");
    }
  }

  const AttendKernels& kern = attend_kernels();
  const bool q_fp8 = q.dtype == DType::fp8_e4m3;
  const Inputs in{.q = q,
                  .pages = cache.pages,
                  .seq_lens = seq_lens.data(),
                  .kv_indptr = kv_indptr.data(),
                  .kv_indices = kv_indices.data(),
                  .q_mul = float(cfg.sm_scale()) * (q_fp8 ? ctx.w.q_scale : 1.0f),
                  .k_scale = cache.pages.dtype == DType::fp8_e4m3 ? ctx.w.k_scale : 1.0f,
                  .bf16_keys = kern.scores_bf16 != nullptr && geo.row_dim % 32 == 0};

  const TensorView& o = out.o;
  const TensorView& lse = out.lse;
  const bool split_out = o.rank == 4;
  const int off = split_out ? 1 : 0;  // dims of o/lse after the split dim
  const Destination final_dst{.o = o.data,
                              .o_dtype = o.dtype,
                              .o_s = o.stride[off],
                              .o_h = o.stride[off + 1],
                              .o_l = o.stride[off + 2],
                              .lse = lse.ptr<float>(),
                              .lse_s = lse.stride[off],
                              .lse_h = lse.stride[off + 1]};

  // Chunks per request: the output's split count, or an internal split for rank-3 outputs that
  // gives the threads about four items each (never chunks shorter than kMinChunk).
  const int threads = std::max(1, ctx.threads);
  std::vector<int> chunks(batch, 1);
  if (split_out) {
    std::fill(chunks.begin(), chunks.end(), int(o.shape[0]));
  } else if (ctx.opts.num_splits > 1) {
    std::fill(chunks.begin(), chunks.end(), ctx.opts.num_splits);
  } else if (ctx.opts.num_splits == 0 && threads > 1) {
    int64_t total = 0;
    for (int64_t n : local_len) total += n;
    const int64_t max_parts = std::max<int64_t>(2, kMaxPartialBytes / (int64_t(geo.rows) * geo.width * 4));
    for (int64_t target = std::max<int64_t>(kMinChunk, (total + 4 * threads - 1) / (4 * threads));; target *= 2) {
      int64_t parts = 0;
      for (int b = 0; b < batch; ++b) {
        chunks[b] = int(std::clamp<int64_t>((local_len[b] + target - 1) / target, 1, kMaxAutoSplits));
        parts += chunks[b] > 1 ? chunks[b] : 0;
      }
      if (parts <= max_parts) break;  // ends: once target exceeds every length, parts = 0
    }
  }

  // Internal-split partials: [rows, width] + [rows] fp32 per chunk of a request split in more
  // than one chunk, merged into o/lse afterwards.
  std::vector<int64_t> part_begin(batch + 1, 0);
  for (int b = 0; b < batch; ++b) part_begin[b + 1] = part_begin[b] + (!split_out && chunks[b] > 1 ? chunks[b] : 0);
  // Kept between calls (per calling thread): every partial is fully written before it is merged.
  const size_t parts = size_t(part_begin[batch]);
  // (The OpenMP threads below must use these pointers, not the calling thread's thread_locals.)
  thread_local std::vector<float> part_o_buf, part_lse_buf;
  if (part_o_buf.size() < parts * geo.rows * geo.width) part_o_buf.resize(parts * geo.rows * geo.width);
  if (part_lse_buf.size() < parts * geo.rows) part_lse_buf.resize(parts * geo.rows);
  float* const part_o = part_o_buf.data();
  float* const part_lse = part_lse_buf.data();

  std::vector<WorkItem> items;
  for (int b = 0; b < batch; ++b) {
    const int64_t n = local_len[b], chunk = (n + chunks[b] - 1) / chunks[b];
    for (int c = 0; c < chunks[b]; ++c) {
      WorkItem item{.b = b,
                    .lo = std::min(n, c * chunk),
                    .hi = std::min(n, (c + 1) * chunk),
                    .dst = final_dst,
                    .token0 = int64_t(b) * geo.qlen,
                    .cost = 0};
      item.cost = (item.hi - item.lo) * geo.rows + geo.rows;
      if (split_out) {
        item.dst.o = static_cast<char*>(o.data) + c * o.stride[0] * int64_t(dtype_size(o.dtype));
        item.dst.lse = lse.ptr<float>() + c * lse.stride[0];
      } else if (chunks[b] > 1) {
        const int64_t p = part_begin[b] + c;
        item.token0 = 0;
        item.dst = Destination{.o = part_o + p * geo.rows * geo.width,
                               .o_dtype = DType::f32,
                               .o_s = int64_t(geo.g) * geo.width,
                               .o_h = geo.width,
                               .o_l = 1,
                               .lse = part_lse + p * geo.rows,
                               .lse_s = geo.g,
                               .lse_h = 1};
      }
      items.push_back(item);
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });

  int64_t total_cost = 0;
  for (const WorkItem& item : items) total_cost += item.cost;
  const int team = total_cost < kMinParallelCost ? 1 : int(std::min<size_t>(threads, items.size()));
#pragma omp parallel num_threads(team)
  {
    thread_local Scratch sc;
    sc.reserve(geo, in.bf16_keys);
#pragma omp for schedule(dynamic, 1)
    for (size_t t = 0; t < items.size(); ++t) run_item(kern, in, geo, items[t], sc);
  }

  if (part_begin[batch] == 0) return;
  // Merge the internal-split partials of each (request, row) in chunk order.
#pragma omp parallel for num_threads(threads) schedule(static) if (total_cost >= kMinParallelCost)
  for (int64_t br = 0; br < int64_t(batch) * geo.rows; ++br) {
    const int b = int(br / geo.rows), r = int(br % geo.rows);
    if (chunks[b] <= 1) continue;
    thread_local std::vector<float> merged;
    merged.resize(geo.width);
    const int64_t p = part_begin[b];
    const float total = merge_partials(chunks[b], &part_lse[size_t(p) * geo.rows + r], geo.rows,
                                       &part_o[(size_t(p) * geo.rows + r) * geo.width],
                                       int64_t(geo.rows) * geo.width, geo.width, merged.data());
    write_row(final_dst, int64_t(b) * geo.qlen + r / geo.g, r % geo.g, merged.data(), geo.width, total);
  }
}

}  // namespace mla::cpu
