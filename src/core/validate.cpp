// Argument validation for pre / attend / post (validate.hpp). Every message reads
// "<stage>: <argument>...: expected X, got Y". Layer runs these before any backend call, so a
// rejected call writes nothing: the KV cache stays byte-identical.
#include "core/validate.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mla/dcp.hpp"
#include "mla/error.hpp"

namespace mla::detail {

namespace {

// One expected dimension: "S=4", "Hq>=G=12", "L+R=576"; min = true accepts any size >= n.
struct Dim {
  const char* sym;
  int64_t n;
  bool min = false;
};

std::string dims_str(std::initializer_list<Dim> dims) {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const Dim& d : dims) {
    // "S=4", "num_pages>=0"; a symbol that states its own bound reads "Hq>=G=12".
    const bool bound_in_sym = std::string_view(d.sym).find(">=") != std::string_view::npos;
    os << (first ? "" : ", ") << d.sym << (d.min && !bound_in_sym ? ">=" : "=") << d.n;
    first = false;
  }
  os << "]";
  return os.str();
}

std::string view_str(const TensorView& v) {
  if (!v.defined()) return "an undefined view";
  std::ostringstream os;
  os << v.str();
  if (v.device == Device::cuda) os << ':' << v.device_index;
  return os.str();
}

// Checks of one stage call: where the layer runs and the stage's name for messages.
struct Checker {
  const StageContext& ctx;
  const char* stage;

  // Device, dtype, rank, shape, stride sanity and no self-overlap of a view.
  // inner_rows: the innermost dimension must be contiguous (rows of 576 / 512 / D / N*V).
  void view(const char* arg, const TensorView& v, std::initializer_list<DType> dtypes,
            std::initializer_list<Dim> dims, bool inner_rows) const {
    MLA_REQUIRE(v.defined(), stage, ": ", arg, ": expected a tensor ", dims_str(dims), ", got an undefined view");
    MLA_REQUIRE(v.device == ctx.device, stage, ": ", arg, ": expected a view on the layer's device ",
                device_name(ctx.device), ", got ", view_str(v));
    MLA_REQUIRE(v.device != Device::cuda || v.device_index == ctx.opts.cuda_device, stage, ": ", arg,
                ": expected a view on cuda:", ctx.opts.cuda_device, " (LayerOptions.cuda_device), got ",
                view_str(v));
    if (std::find(dtypes.begin(), dtypes.end(), v.dtype) == dtypes.end()) {
      std::ostringstream os;
      for (DType d : dtypes) os << (os.tellp() > 0 ? " or " : "") << dtype_name(d);
      fail(stage, ": ", arg, ": expected dtype ", os.str(), ", got ", view_str(v));
    }
    MLA_REQUIRE(v.rank == int(dims.size()), stage, ": ", arg, ": expected rank ", dims.size(), " ",
                dims_str(dims), ", got ", view_str(v));
    int d = 0;
    for (const Dim& e : dims) {
      const bool ok = e.min ? v.shape[d] >= e.n : v.shape[d] == e.n;
      MLA_REQUIRE(ok, stage, ": ", arg, ": expected shape ", dims_str(dims), ", got ", view_str(v),
                  " (dimension ", d, ")");
      ++d;
    }
    MLA_REQUIRE(v.data != nullptr || v.numel() == 0, stage, ": ", arg, ": expected data for ", v.numel(),
                " elements, got a null pointer");
    strides(arg, v, inner_rows);
  }

  // Positive strides, a contiguous innermost row where asked, and no two elements at one address:
  // taken in increasing stride order, each dimension's stride must step past everything the
  // inner dimensions span. This is what rejects a query view too small for its strides
  // (row stride < Hq * 576) and a cache whose pages overlap.
  void strides(const char* arg, const TensorView& v, bool inner_rows) const {
    std::vector<int> live;
    for (int d = 0; d < v.rank; ++d) {
      if (v.shape[d] <= 1) continue;  // a stride of a size-1 dimension addresses nothing new
      MLA_REQUIRE(v.stride[d] >= 1, stage, ": ", arg, ".stride[", d, "]: expected >= 1, got ", v.stride[d],
                  " (", view_str(v), ")");
      live.push_back(d);
    }
    const int last = v.rank - 1;
    MLA_REQUIRE(!inner_rows || v.shape[last] <= 1 || v.stride[last] == 1, stage, ": ", arg, ".stride[", last,
                "]: expected 1 (rows of ", v.shape[last], " contiguous elements), got ", v.stride[last], " (",
                view_str(v), ")");
    std::stable_sort(live.begin(), live.end(), [&](int a, int b) { return v.stride[a] < v.stride[b]; });
    int64_t span = 1;  // elements spanned by the dimensions checked so far
    int inner = -1;
    for (int d : live) {
      if (inner >= 0) {
        MLA_REQUIRE(v.stride[d] >= span, stage, ": ", arg, ".stride[", d, "]: expected >= ", span,
                    " (the elements dimension ", inner, " spans, or they overlap), got ", v.stride[d], " (",
                    view_str(v), ")");
      }
      span = v.stride[d] * (v.shape[d] - 1) + span;
      inner = d;
    }
  }

  // Two views a stage reads or writes must not share bytes where one of them is written.
  void disjoint(const char* arg_a, const TensorView& a, const char* arg_b, const TensorView& b) const {
    if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return;
    if (a.device != b.device || a.device_index != b.device_index) return;
    const auto* a0 = static_cast<const char*>(a.data);
    const auto* b0 = static_cast<const char*>(b.data);
    const char* a1 = a0 + a.extent() * int64_t(dtype_size(a.dtype));
    const char* b1 = b0 + b.extent() * int64_t(dtype_size(b.dtype));
    MLA_REQUIRE(a1 <= b0 || b1 <= a0, stage, ": ", arg_a, ": expected memory disjoint from ", arg_b,
                ", got overlapping views ", view_str(a), " and ", view_str(b));
  }
};

void check_seq_len(const Checker& c, const char* arg, size_t b, int64_t len, int qlen) {
  MLA_REQUIRE(len == 0 || len >= qlen, c.stage, ": ", arg, "[", b, "]: expected 0 (an empty request) or >= qlen = ",
              qlen, ", got ", len);
}

// Step metadata. with_cache: the page table is read (pre, attend) and checked against the cache;
// slot_mapping is required for pre (it writes the cache) and checked where given otherwise.
void check_meta(const Checker& c, const StepMeta& meta, const KVCache* cache, bool need_slots) {
  MLA_REQUIRE(meta.qlen >= 1 && meta.qlen <= 8, c.stage, ": meta.qlen: expected 1..8, got ", meta.qlen);
  MLA_REQUIRE(meta.seq_lens.defined() && meta.seq_lens.rank == 1 && meta.seq_lens.shape[0] >= 1, c.stage,
              ": meta.seq_lens: expected [B >= 1] i32, got ", view_str(meta.seq_lens));
  const int64_t batch = meta.seq_lens.shape[0], tokens = batch * meta.qlen;
  c.view("meta.seq_lens", meta.seq_lens, {DType::i32}, {{"B", batch}}, true);
  MLA_REQUIRE(meta.seq_lens_host.empty() || int64_t(meta.seq_lens_host.size()) == batch, c.stage,
              ": meta.seq_lens_host: expected ", batch, " entries (B) or none, got ", meta.seq_lens_host.size());
  for (size_t b = 0; b < meta.seq_lens_host.size(); ++b)
    check_seq_len(c, "meta.seq_lens_host", b, meta.seq_lens_host[b], meta.qlen);

  const bool slots = need_slots || meta.slot_mapping.defined();
  if (slots) c.view("meta.slot_mapping", meta.slot_mapping, {DType::i64}, {{"S=B*Q", tokens}}, true);
  if (cache) {
    const LayerConfig& cfg = c.ctx.cfg;
    const TensorView& pages = cache->pages;
    MLA_REQUIRE(pages.defined() && pages.rank == 3, c.stage,
                ": cache.pages: expected [num_pages, page_size, L+R], got ", view_str(pages));
    MLA_REQUIRE(pages.shape[1] >= 1, c.stage, ": cache.pages: expected page_size >= 1, got ", pages.shape[1]);
    c.view("cache.pages", pages, {DType::fp8_e4m3, DType::bf16},
           {{"num_pages", 0, true}, {"page_size", pages.shape[1]}, {"L+R", cfg.row_dim()}}, true);
    // The rows of a page are contiguous (mla/step.hpp): kernels read a page as one block.
    MLA_REQUIRE(pages.shape[1] <= 1 || pages.stride[1] == cfg.row_dim(), c.stage,
                ": cache.pages.stride[1]: expected ", cfg.row_dim(), " (the rows of a page are contiguous), got ",
                pages.stride[1]);
    c.view("meta.kv_indptr", meta.kv_indptr, {DType::i32}, {{"B+1", batch + 1}}, true);
    MLA_REQUIRE(meta.kv_indices.defined() && meta.kv_indices.rank == 1, c.stage,
                ": meta.kv_indices: expected [nnz] i32, got ", view_str(meta.kv_indices));
    c.view("meta.kv_indices", meta.kv_indices, {DType::i32}, {{"nnz", 0, true}}, true);
  }

  // Values: only where the metadata lives on the host. On a GPU the backend checks them where it
  // reads them; seq_lens_host (checked above) is what the host knows.
  if (c.ctx.device != Device::cpu) return;
  const auto* seq_lens = meta.seq_lens.ptr<const int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    check_seq_len(c, "meta.seq_lens", size_t(b), seq_lens[b], meta.qlen);
    MLA_REQUIRE(meta.seq_lens_host.empty() || meta.seq_lens_host[size_t(b)] == seq_lens[b], c.stage,
                ": meta.seq_lens_host[", b, "]: expected seq_lens[", b, "] = ", seq_lens[b], ", got ",
                meta.seq_lens_host[size_t(b)]);
  }
  int64_t num_rows = 0;
  if (cache) {
    const int64_t num_pages = cache->num_pages(), page_size = cache->page_size();
    num_rows = num_pages * page_size;
    const auto* indptr = meta.kv_indptr.ptr<const int32_t>();
    const auto* indices = meta.kv_indices.ptr<const int32_t>();
    const int64_t nnz = meta.kv_indices.shape[0];
    MLA_REQUIRE(indptr[0] == 0, c.stage, ": meta.kv_indptr[0]: expected 0, got ", indptr[0]);
    for (int64_t b = 0; b < batch; ++b) {
      MLA_REQUIRE(indptr[b + 1] >= indptr[b], c.stage, ": meta.kv_indptr[", b + 1, "]: expected >= kv_indptr[", b,
                  "] = ", indptr[b], " (monotone), got ", indptr[b + 1]);
      MLA_REQUIRE(indptr[b + 1] <= nnz, c.stage, ": meta.kv_indptr[", b + 1, "]: expected <= ", nnz,
                  " (the length of kv_indices), got ", indptr[b + 1]);
      const int64_t need = dcp::local_length(c.ctx.opts.dcp, seq_lens[b]);
      const int64_t have = int64_t(indptr[b + 1] - indptr[b]) * page_size;
      MLA_REQUIRE(have >= need, c.stage, ": meta.kv_indptr[", b, "..", b + 1, "]: expected at least ",
                  (need + page_size - 1) / page_size, " pages of ", page_size, " for request ", b,
                  "'s local length ", need, " (seq_lens[", b, "] = ", seq_lens[b], "), got ",
                  indptr[b + 1] - indptr[b]);
    }
    for (int64_t k = 0; k < indptr[batch]; ++k)
      MLA_REQUIRE(indices[k] >= 0 && indices[k] < num_pages, c.stage, ": meta.kv_indices[", k,
                  "]: expected a page in [0, ", num_pages, "), got ", indices[k]);
  }
  if (slots) {
    const auto* slot = meta.slot_mapping.ptr<const int64_t>();
    std::vector<std::pair<int64_t, int64_t>> used;  // (slot, token) of every stored token
    used.reserve(size_t(tokens));
    for (int64_t s = 0; s < tokens; ++s) {
      if (cache) {
        MLA_REQUIRE(slot[s] >= -1 && slot[s] < num_rows, c.stage, ": meta.slot_mapping[", s,
                    "]: expected -1 or a slot in [0, ", num_rows, ") (num_pages * page_size), got ", slot[s]);
      } else {
        MLA_REQUIRE(slot[s] >= -1, c.stage, ": meta.slot_mapping[", s, "]: expected -1 or a slot >= 0, got ",
                    slot[s]);
      }
      const int64_t b = s / meta.qlen;
      MLA_REQUIRE(seq_lens[b] != 0 || slot[s] == -1, c.stage, ": meta.slot_mapping[", s,
                  "]: expected -1 (token of the empty request ", b, ", seq_lens[", b, "] = 0), got ", slot[s]);
      if (slot[s] >= 0) used.emplace_back(slot[s], s);
    }
    std::sort(used.begin(), used.end());
    for (size_t k = 1; k < used.size(); ++k)
      MLA_REQUIRE(used[k].first != used[k - 1].first, c.stage, ": meta.slot_mapping[", used[k].second,
                  "]: expected a slot no other token of the step writes, got ", used[k].first,
                  ", the slot of token ", used[k - 1].second);
  }
}

// attend's outputs / post's inputs: merged [S, G, L] + [S, G], or split partials
// [splits, S, G, L] + [splits, S, G].
void check_attention(const Checker& c, const char* o_arg, const char* lse_arg, const AttendOutputs& a,
                     int64_t tokens) {
  const LayerConfig& cfg = c.ctx.cfg;
  const int64_t g = int64_t(cfg.heads()) * c.ctx.opts.dcp.size;
  MLA_REQUIRE(a.o.defined() && (a.o.rank == 3 || a.o.rank == 4), c.stage, ": ", o_arg,
              ": expected [S, G, L] or split partials [splits, S, G, L], got ", view_str(a.o));
  const std::initializer_list<DType> o_types{DType::f32, DType::bf16};
  if (a.o.rank == 3) {
    c.view(o_arg, a.o, o_types, {{"S", tokens}, {"G", g}, {"L", cfg.kv_lora_rank}}, true);
    c.view(lse_arg, a.lse, {DType::f32}, {{"S", tokens}, {"G", g}}, false);
  } else {
    const int64_t splits = a.o.shape[0];
    MLA_REQUIRE(splits >= 1, c.stage, ": ", o_arg, ": expected splits >= 1, got ", view_str(a.o));
    c.view(o_arg, a.o, o_types, {{"splits", splits}, {"S", tokens}, {"G", g}, {"L", cfg.kv_lora_rank}}, true);
    c.view(lse_arg, a.lse, {DType::f32}, {{"splits", splits}, {"S", tokens}, {"G", g}}, false);
  }
}

}  // namespace

void validate_meta(const StageContext& ctx, const char* stage, const StepMeta& meta, const KVCache& cache) {
  check_meta(Checker{ctx, stage}, meta, &cache, /*need_slots=*/true);
}

void validate_pre(const StageContext& ctx, const TensorView& hidden, const StepMeta& meta,
                  const KVCache& cache, const PreOutputs& out) {
  const Checker c{ctx, "pre"};
  const LayerConfig& cfg = ctx.cfg;
  check_meta(c, meta, &cache, /*need_slots=*/true);
  const int64_t tokens = meta.tokens();
  const int64_t g = int64_t(cfg.heads()) * ctx.opts.dcp.size;
  c.view("hidden", hidden, {DType::bf16}, {{"S=B*Q", tokens}, {"D", cfg.hidden}}, true);
  c.view("out.q", out.q, {ctx.opts.q_dtype}, {{"S", tokens}, {"Hq>=G", g, true}, {"L+R", cfg.row_dim()}}, true);
  if (cfg.gate_dim() > 0) {
    c.view("out.gate", out.gate, {DType::bf16}, {{"S", tokens}, {"N*V", cfg.gate_dim()}}, true);
  } else {
    MLA_REQUIRE(!out.gate.defined(), "pre: out.gate: expected an undefined view (the model has no gate), got ",
                view_str(out.gate));
  }
  // pre writes q, gate and cache rows; none may alias another or what pre reads.
  const std::pair<const char*, const TensorView*> written[] = {
      {"out.q", &out.q}, {"out.gate", &out.gate}, {"cache.pages", &cache.pages}};
  const std::pair<const char*, const TensorView*> read[] = {
      {"hidden", &hidden}, {"meta.seq_lens", &meta.seq_lens}, {"meta.kv_indptr", &meta.kv_indptr},
      {"meta.kv_indices", &meta.kv_indices}, {"meta.slot_mapping", &meta.slot_mapping}};
  for (size_t i = 0; i < std::size(written); ++i) {
    for (size_t j = i + 1; j < std::size(written); ++j)
      c.disjoint(written[i].first, *written[i].second, written[j].first, *written[j].second);
    for (const auto& [name, v] : read) c.disjoint(written[i].first, *written[i].second, name, *v);
  }
}

void validate_attend(const StageContext& ctx, const TensorView& q, const KVCache& cache, const StepMeta& meta,
                     const AttendOutputs& out) {
  const Checker c{ctx, "attend"};
  const LayerConfig& cfg = ctx.cfg;
  check_meta(c, meta, &cache, /*need_slots=*/false);
  const int64_t tokens = meta.tokens();
  const int64_t g = int64_t(cfg.heads()) * ctx.opts.dcp.size;
  c.view("q", q, {ctx.opts.q_dtype}, {{"S", tokens}, {"Hq>=G", g, true}, {"L+R", cfg.row_dim()}}, true);
  check_attention(c, "out.o", "out.lse", out, tokens);
  const std::pair<const char*, const TensorView*> read[] = {
      {"q", &q}, {"cache.pages", &cache.pages}, {"meta.seq_lens", &meta.seq_lens},
      {"meta.kv_indptr", &meta.kv_indptr}, {"meta.kv_indices", &meta.kv_indices}};
  c.disjoint("out.o", out.o, "out.lse", out.lse);
  for (const auto& [name, v] : read) {
    c.disjoint("out.o", out.o, name, *v);
    c.disjoint("out.lse", out.lse, name, *v);
  }
}

void validate_post(const StageContext& ctx, const AttendOutputs& attn, const TensorView& gate,
                   const StepMeta& meta, const TensorView& out) {
  const Checker c{ctx, "post"};
  const LayerConfig& cfg = ctx.cfg;
  check_meta(c, meta, nullptr, /*need_slots=*/false);
  const int64_t tokens = meta.tokens();
  check_attention(c, "attn.o", "attn.lse", attn, tokens);
  if (cfg.gate_dim() > 0) {
    c.view("gate", gate, {DType::bf16}, {{"S", tokens}, {"N*V", cfg.gate_dim()}}, true);
  } else {
    MLA_REQUIRE(!gate.defined(), "post: gate: expected an undefined view (the model has no gate), got ",
                view_str(gate));
  }
  const int64_t nv = int64_t(cfg.heads()) * cfg.v_head_dim;
  c.view("out", out, {DType::bf16}, {{"S", tokens}, {"N*V", nv}}, true);
  c.disjoint("out", out, "attn.o", attn.o);
  c.disjoint("out", out, "attn.lse", attn.lse);
  c.disjoint("out", out, "gate", gate);
  c.disjoint("out", out, "meta.seq_lens", meta.seq_lens);
}

}  // namespace mla::detail
