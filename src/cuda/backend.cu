// The CUDA backend: weights uploaded once, step()'s workspace allocated at construction from
// LayerOptions.max_tokens, every stage enqueued on opts.cuda_stream. A stage never allocates and
// never waits for the device, so a whole step can be captured in a CUDA graph. Bad device-resident
// metadata is reported through a sticky device error word (cuda/device_errors.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/backend.hpp"
#include "core/dcp.hpp"
#include "core/rope.hpp"
#include "cuda/backend.hpp"
#include "cuda/check.hpp"
#include "cuda/device_errors.hpp"
#include "cuda/flat_plan.hpp"
#include "cuda/handles.hpp"
#include "cuda/stages.hpp"

namespace mla::cuda {

namespace {

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buf(host.size() * sizeof(T));
  if (!host.empty()) MLA_CUDA_CHECK(cudaMemcpy(buf.get(), host.data(), buf.bytes(), cudaMemcpyHostToDevice));
  return buf;
}

constexpr size_t kCublasWorkspace = size_t(32) << 20;
constexpr int kMaxSplits = 256;
constexpr int kMinKeysPerSplit = 192;  // three of attend's key tiles

// MLA_ATTEND_FLAT: 0 keeps fixed splits a request everywhere; unset (or `fill`, s36a, the default
// since session 37): the flat plan for uneven batches and for even batches whose fixed splits fill
// their waves poorly (attend_fixed_fills_its_waves), its key-CTAs whole waves (attend_flat_key_ctas;
// H100, session 37: B = 67 x 128 heads 301 us against 461, B = 300 x 12 heads 272 against 322);
// `uneven`: the flat plan for uneven batches only, one key-CTA a request or a wave (the rule of
// sessions 23-36); `all`: that, and the 16-row kernel's even batches too (its rule until session 23).
enum class FlatMode { kOff, kUneven, kAll, kFill };
FlatMode flat_plan_mode() {
  static const FlatMode mode = [] {
    const char* env = std::getenv("MLA_ATTEND_FLAT");
    const std::string_view v = env ? env : "";
    return v == "0" ? FlatMode::kOff : v == "all" ? FlatMode::kAll : v == "uneven" ? FlatMode::kUneven : FlatMode::kFill;
  }();
  return mode;
}

// The flat plan's partials in the o / lse workspace: partial i is [Q, G, L] f32 (lse [Q, G]) at
// i * Q * G * L, whatever splits the workspace views say (attend writes them, post reads them).
struct FlatStrides {
  int64_t o_split, o_s, o_h, lse_split, lse_s, lse_h;
};
FlatStrides flat_strides(int64_t g, int64_t qlen) { return {qlen * g * kLatent, g * kLatent, kLatent, qlen * g, g, 1}; }

}  // namespace

CudaBackend::CudaBackend(const LayerConfig& c, const PreparedWeights& w, const LayerOptions& o)
    : BackendImpl(c, o), stream_(static_cast<cudaStream_t>(o.cuda_stream)), q_scale_(w.q_scale), k_scale_(w.k_scale) {
  MLA_REQUIRE(cfg.kv_lora_rank == kLatent && cfg.qk_rope_dim == kRope, "Backend::cuda: the kernels fix L = ",
              kLatent, " and R = ", kRope, ", got L = ", cfg.kv_lora_rank, ", R = ", cfg.qk_rope_dim);
  MLA_REQUIRE(cfg.qk_nope_dim % 32 == 0 && cfg.qk_nope_dim <= 256, "Backend::cuda: qk_nope_dim must be a multiple of 32 <= 256, got ",
              cfg.qk_nope_dim);
  int count = 0;
  MLA_REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess && opts.cuda_device >= 0 && opts.cuda_device < count,
              "LayerOptions.cuda_device: expected in [0, ", count, "), got ", opts.cuda_device);
  DeviceGuard guard(opts.cuda_device);
  cudaDeviceProp prop{};
  MLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, opts.cuda_device));
  sms_ = prop.multiProcessorCount;
  if (attend_fill_from_bandwidth()) fill_per_mille_ = attend_fill_per_mille(device_peak_gbps(opts.cuda_device), sms_);
  l2_bytes_ = prop.l2CacheSize;
  device_name_ = prop.name;
  MLA_REQUIRE(prop.major >= 9, "Backend::cuda: needs compute capability 9.0 (sm_90a), device ", opts.cuda_device,
              " is ", prop.major, ".", prop.minor);
  // The 16-row attend kernel divides its query rows by G with a multiply-shift (fast_div.hpp: rows
  // m < G Q + 16 <= 2^16 at Q <= 8).
  MLA_REQUIRE(query_heads() <= kMaxQueryHeads, "Backend::cuda: query heads (heads x DCP size) must be at most ",
              kMaxQueryHeads, ", got ", query_heads());
  prepare_attend_kernels();
  prepare_post_kernels();

  const int n = cfg.heads(), g = query_heads(), rows = cfg.qkv_a_rows();
  const int64_t t = opts.max_tokens;
  qkv_a_ = upload(w.qkv_a);
  q_b_ = upload(w.q_b);
  q_a_norm_ = upload(w.q_a_norm);
  kv_a_norm_ = upload(w.kv_a_norm);
  w_uk_codes_ = upload(w.w_uk.codes);
  w_uk_scales_ = upload(w.w_uk.scales);
  w_uv_codes_ = upload(w.w_uv.codes);
  w_uv_scales_ = upload(w.w_uv.scales);
  const rope::RopeTable table = rope::make_table(cfg);
  if (table.enabled) inv_freq_ = upload(table.inv_freq);
  rope_mscale_ = table.mscale;

  // The step workspace.
  y_ = layout_.add(t * rows * 2);
  q_c_ = layout_.add(t * cfg.q_lora_rank * 2);
  q_full_ = layout_.add(t * n * cfg.qk_head_dim() * 2);
  q_heads_ = opts.q_head_pad > 0 ? opts.q_head_pad : g;
  q_ = layout_.add(t * q_heads_ * kRow * int64_t(dtype_size(opts.q_dtype)));
  gate_ = layout_.add(t * cfg.gate_dim() * 2);
  // Partials: the most rows any step up to max_tokens can write: splits * S with fixed splits, and
  // (key-CTAs + B) * Q with the flat plan, key-CTAs = max(B * splits, flat_ctas) (each CTA writes a
  // partial of Q rows per request it touches; consecutive CTAs share at most one request).
  // (Over both cache dtypes and pages boxed or not: the plan may depend on them, attend_shape.)
  int64_t partial_rows = 0;
  for (int qlen = 1; qlen <= 8; ++qlen)
    for (int b = 1; int64_t(b) * qlen <= t; ++b)
      for (DType dtype : {DType::fp8_e4m3, DType::bf16})
        for (bool boxes : {true, false}) {
          const CacheKind kv{dtype, boxes};
          const int64_t splits = plan_splits(b, qlen, kv, {});
          const int64_t flat = std::max<int64_t>(splits * b, flat_ctas(b, qlen, kv)) + b;
          partial_rows = std::max({partial_rows, splits * b * qlen, flat * qlen});
        }
  partial_rows_ = std::max(partial_rows, t);
  const int64_t o_bytes = partial_rows_ * g * kLatent * int64_t(sizeof(float));
  o_ = layout_.add(o_bytes);
  lse_ = layout_.add(partial_rows_ * g * int64_t(sizeof(float)));
  if (opts.dcp.size > 1) {  // the combine's exchange destination: [W*splits, S, N, L] = as many rows
    exchanged_o_ = layout_.add(o_bytes);
    exchanged_lse_ = layout_.add(partial_rows_ * g * int64_t(sizeof(float)));
  } else {
    exchanged_o_ = layout_.add(0), exchanged_lse_ = layout_.add(0);
  }
  part_first_ = layout_.add(t * int64_t(sizeof(int32_t)));
  part_count_ = layout_.add(t * int64_t(sizeof(int32_t)));
  cublas_workspace_ = layout_.add(int64_t(kCublasWorkspace));
  // (A larger block moves the smaller one's users: the device is idle before the new block is taken.)
  workspace_ = opts.workspace ? opts.workspace : std::make_shared<Workspace>();
  workspace_->impl().reserve(Device::cuda, opts.cuda_device, layout_.total(), [&](int64_t bytes) {
    MLA_CUDA_CHECK(cudaDeviceSynchronize());
    void* p = nullptr;
    MLA_CUDA_CHECK(cudaMalloc(&p, size_t(bytes)));
    return Workspace::Impl::Block(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFree(q); });  // (as DeviceBuffer)
  });
  error_ = DeviceBuffer(sizeof(uint32_t));
  MLA_CUDA_CHECK(cudaMemset(error_.get(), 0, sizeof(uint32_t)));
  lt_ = std::make_unique<CublasLt>();
  // (the workspace pointer is passed at every run: the block may move)
  gemm_qkv_a_ = std::make_unique<Gemm>(lt_->get(), rows, cfg.hidden, kCublasWorkspace);
  gemm_q_b_ = std::make_unique<Gemm>(lt_->get(), n * cfg.qk_head_dim(), cfg.q_lora_rank, kCublasWorkspace);
  MLA_CUDA_CHECK(cudaDeviceSynchronize());
}

CudaBackend::~CudaBackend() {
  DeviceGuard guard(opts.cuda_device);
  gemm_qkv_a_.reset();
  gemm_q_b_.reset();
  lt_.reset();
}

CacheKind CacheKind::of(const KVCache& cache) {
  const TensorView& pages = cache.pages;
  if (!attend_rows_q_split_enabled()) return {pages.dtype};
  return {pages.dtype, attend_rows_q_split_boxes(pages.data, pages.dtype == DType::fp8_e4m3, pages.stride[0],
                                                 pages.stride[1], cache.page_size(), cache.num_pages())};
}

// The plan's CTA shape for this layer's query heads (attend_plan_shape, attend_route.cu).
AttendShape CudaBackend::attend_shape(int batch, int qlen, CacheKind cache) const {
  return attend_plan_shape(batch, query_heads() * qlen, opts.q_dtype == DType::bf16, cache.dtype == DType::fp8_e4m3,
                           sms_, cache.rows_boxes);
}

// The flat plan's key-CTAs when fixed splits give fewer: every slot of one wave for the row tiles
// of a request (B = 64, 12 heads: 264 instead of 4 splits x 64 = 256), or whole waves
// (attend_flat_key_ctas; the default, MLA_ATTEND_FLAT=fill).
int CudaBackend::flat_ctas(int batch, int qlen, CacheKind cache) const {
  const AttendShape shape = attend_shape(batch, qlen, cache);
  return attend_flat_key_ctas(batch, shape.m_tiles, shape.slots, flat_plan_mode() == FlatMode::kFill);
}

int CudaBackend::plan_splits(int batch, int qlen, CacheKind cache, std::span<const int32_t> seq_lens_host) const {
  if (opts.num_splits > 0) return opts.num_splits;
  // As many CTAs as fit at once (two fp8 CTAs an SM) without starting a second, mostly idle
  // wave (B = 64: 4 splits, 256 CTAs on 264 slots, not 5 and 320; B = 1: up to 256 splits, so
  // one long request spreads over every SM), and no split shorter than kMinKeysPerSplit keys where
  // the lengths are known on the host.
  const AttendShape shape = attend_shape(batch, qlen, cache);
  const int ctas = batch * shape.m_tiles;
  const int max_splits = std::min(kMaxSplits, kMaxPostPartials / std::max(opts.dcp.size, 1));
  int splits = std::clamp(shape.slots / std::max(ctas, 1), 1, max_splits);
  if (!seq_lens_host.empty()) {
    // No split shorter than three key tiles: at B = 1, ctx 8192, the step in a graph took 43 splits
    // (3 tiles a CTA) 0.3-3.3 µs less than 64 (2 tiles) in each of 8 H200 runs of session 4 (attend
    // alone ~1 µs more, post merging a third fewer partials ~2 µs less; 52.0-56.2 vs 52.3-59.5 µs,
    // bench/results/*-v1[0-2]*-graph-bench.json); earlier, 128 splits were slower still (63.1 vs
    // 59.4 µs at 64). One 128K request keeps 256 splits (55 µs vs 100 at 64 in session 2).
    int64_t longest = 0;
    for (int32_t len : seq_lens_host) longest = std::max<int64_t>(longest, len);
    if (opts.dcp.size > 1) longest = (longest + opts.dcp.size - 1) / opts.dcp.size + opts.dcp.interleave;
    // 64-row CTAs stream tiles in pairs: no split under one pair.
    const int min_keys = shape.many_rows ? 128 : kMinKeysPerSplit;  // two 64-key tiles
    splits = int(std::clamp<int64_t>((longest + min_keys - 1) / min_keys, 1, splits));
  }
  return splits;
}

// MLA_STEP_PARTIALS=bf16 (s59a, session 55; a measurement switch since session 56): the step's o partials in bf16
// instead of f32 (attend's epilogue stores them, post reads and merges them, in f32 arithmetic either way; both
// kernels' bf16 o paths are the ones a caller's bf16 o takes). Why: session 55's stamps put the fp8 many-rows kernel's
// epilogue at 8.3 µs of F's 104 and 14.6 of D's 220 (H100), its CTAs ending together as if o's f32 stores drained at
// ~1.2 TB/s. Measured (H100, session 56 call 1, 3 rounds): the uneven batches 1.3-1.5% faster (attend; step 1.0-1.3%),
// every other shape within 1%, and the epilogue no shorter (stamps: as many store instructions, half the bytes):
// not worth o rounded to bf16 once more before W_UV for every caller. f32: the default.
namespace {
DType step_partials_dtype() {
  static const DType dtype =
      env_choice("MLA_STEP_PARTIALS", {{"f32", 0}, {"bf16", 1}}, 0) == 1 ? DType::bf16 : DType::f32;
  return dtype;
}
}  // namespace

detail::StepWorkspace CudaBackend::workspace(const StepMeta& meta, const KVCache& cache) {
  const int64_t s = meta.tokens(), g = query_heads();
  MLA_REQUIRE(s <= opts.max_tokens, "step: S = ", s, " exceeds LayerOptions.max_tokens = ", opts.max_tokens);
  const int splits = plan_splits(meta.batch(), meta.qlen, CacheKind::of(cache), meta.seq_lens_host);
  MLA_REQUIRE(workspace_->bytes() >= layout_.total(), "LayerOptions.workspace: holds ", workspace_->bytes(),
              " bytes, this layer needs ", layout_.total());
  MLA_REQUIRE(int64_t(splits) * s <= partial_rows_, "step: ", splits, " splits x S = ", s,
              " exceed the workspace planned from max_tokens (", partial_rows_, " rows); lower LayerOptions.num_splits");
  detail::StepWorkspace ws;
  ws.pre.q = TensorView::contiguous(at(q_), opts.q_dtype, {s, q_heads_, kRow}, Device::cuda, opts.cuda_device);
  if (cfg.gate_dim() > 0)
    ws.pre.gate = TensorView::contiguous(at(gate_), DType::bf16, {s, cfg.gate_dim()}, Device::cuda, opts.cuda_device);
  const DType o_dtype = step_partials_dtype();  // (o_'s slot is planned for f32: bf16 fits)
  if (splits == 1) {
    ws.attend.o = TensorView::contiguous(at(o_), o_dtype, {s, g, kLatent}, Device::cuda, opts.cuda_device);
    ws.attend.lse = TensorView::contiguous(at(lse_), DType::f32, {s, g}, Device::cuda, opts.cuda_device);
  } else {
    ws.attend.o = TensorView::contiguous(at(o_), o_dtype, {splits, s, g, kLatent}, Device::cuda, opts.cuda_device);
    ws.attend.lse = TensorView::contiguous(at(lse_), DType::f32, {splits, s, g}, Device::cuda, opts.cuda_device);
  }
  return ws;
}

namespace {
void require_unit_inner(const TensorView& t, const char* what) {
  MLA_REQUIRE(t.rank == 0 || t.stride[t.rank - 1] == 1, "Backend::cuda: ", what,
              " must have unit stride in its last dimension, got ", t.str());
}
}  // namespace

void CudaBackend::pre(const TensorView& hidden, const StepMeta& meta, const KVCache& cache, const PreOutputs& out) {
  DeviceGuard guard(opts.cuda_device);
  const int64_t s = meta.tokens();
  MLA_REQUIRE(s <= opts.max_tokens, "pre: S = ", s, " exceeds LayerOptions.max_tokens = ", opts.max_tokens,
              " (the CUDA workspace)");
  require_unit_inner(hidden, "hidden");
  require_unit_inner(out.q, "the query");
  require_unit_inner(cache.pages, "the cache");
  if (cfg.gate_dim() > 0) require_unit_inner(out.gate, "the gate");
  if (s == 0) return;
  const int n = cfg.heads(), rows = cfg.qkv_a_rows();
  const int64_t num_slots = cache.num_pages() * cache.page_size();
  auto* error = error_.get<uint32_t>();

  // At decode sizes pre_norm checks the metadata itself (one launch less on the step's path).
  const bool check_in_pre_norm = pre_norm_checks_meta(s);
  if (!check_in_pre_norm)
    launch_meta_check({.seq_lens = meta.seq_lens.ptr<int32_t>(),
                       .slot_mapping = meta.slot_mapping.ptr<int64_t>(),
                       .batch = meta.batch(),
                       .qlen = meta.qlen,
                       .num_slots = num_slots,
                       .error = error},
                      stream_);
  // Both projections: the weight-streaming kernel at decode batch sizes, cuBLASLt above.
  auto project = [&](Gemm& gemm, const void* x, int64_t ldx, const DeviceBuffer& w, void* y, int n_out, int k) {
    if (skinny_gemm_applies(int(s), k, ldx) && reinterpret_cast<uintptr_t>(x) % 16 == 0)
      launch_skinny_gemm({.x = static_cast<const uint16_t*>(x), .ldx = ldx, .w = w.get<uint16_t>(),
                          .y = static_cast<uint16_t*>(y), .ldy = n_out, .s = int(s), .n = n_out, .k = k},
                         stream_);
    else
      gemm.run(x, ldx, w.get(), y, n_out, int(s), stream_, at(cublas_workspace_));
  };
  project(*gemm_qkv_a_, hidden.data, hidden.stride[0], qkv_a_, at(y_), rows, cfg.hidden);
  launch_pre_norm({.y = at<uint16_t>(y_),
                   .y_stride = rows,
                   .q_a_norm = q_a_norm_.get<float>(),
                   .kv_a_norm = kv_a_norm_.get<float>(),
                   .q_c = at<uint16_t>(q_c_),
                   .q_c_stride = cfg.q_lora_rank,
                   .gate = cfg.gate_dim() > 0 ? out.gate.ptr<uint16_t>() : nullptr,
                   .gate_stride = cfg.gate_dim() > 0 ? out.gate.stride[0] : 0,
                   .gate_dim = cfg.gate_dim(),
                   .cache = cache.pages.data,
                   .cache_fp8 = cache.pages.dtype == DType::fp8_e4m3,
                   .page_stride = cache.pages.stride[0],
                   .row_stride = cache.pages.stride[1],
                   .page_size = cache.page_size(),
                   .num_slots = num_slots,
                   .slot_mapping = meta.slot_mapping.ptr<int64_t>(),
                   .seq_lens = meta.seq_lens.ptr<int32_t>(),
                   .batch = meta.batch(),
                   .qlen = meta.qlen,
                   .tokens = int(s),
                   .rq = cfg.q_lora_rank,
                   .check_meta = check_in_pre_norm,
                   .rms_eps = float(cfg.rms_eps),
                   .k_scale = k_scale_,
                   .inv_freq = inv_freq_.get<double>(),
                   .rope_mscale = rope_mscale_,
                   .error = error},
                  stream_);
  const int head_dim = cfg.qk_head_dim();
  project(*gemm_q_b_, at(q_c_), cfg.q_lora_rank, q_b_, at(q_full_), n * head_dim, cfg.q_lora_rank);
  launch_query({.q = at<uint16_t>(q_full_),
                .q_stride = int64_t(n) * head_dim,
                .w_codes = w_uk_codes_.get<uint8_t>(),
                .w_scales = w_uk_scales_.get<uint8_t>(),
                .out = out.q.data,
                .out_fp8 = out.q.dtype == DType::fp8_e4m3,
                .out_s_stride = out.q.stride[0],
                .out_h_stride = out.q.stride[1],
                .head_offset = opts.dcp.rank * n,
                .q_scale = q_scale_,
                .seq_lens = meta.seq_lens.ptr<int32_t>(),
                .qlen = meta.qlen,
                .tokens = int(s),
                .heads = n,
                .nope_dim = cfg.qk_nope_dim,
                .inv_freq = inv_freq_.get<double>(),
                .rope_mscale = rope_mscale_,
                .sms = sms_},
               stream_);
  // 8. W > 1: the query gather along heads, in place, on this stream (core/dcp.cpp).
  detail::gather_query(cfg, opts, out.q, stream_);
}

void CudaBackend::attend(const TensorView& q, const KVCache& cache, const StepMeta& meta, const AttendOutputs& out) {
  DeviceGuard guard(opts.cuda_device);
  require_unit_inner(q, "the query");
  require_unit_inner(cache.pages, "the cache");
  require_unit_inner(out.o, "attend's o");
  const bool split_form = out.o.rank == 4;
  const bool q_fp8 = q.dtype == DType::fp8_e4m3, cache_fp8 = cache.pages.dtype == DType::fp8_e4m3;
  // The step's own partials (the workspace) feed post's bf16 out: one-rounded P suffices there.
  const bool step_partials = out.o.data == at(o_);
  AttendParams p{.q = q.data,
                 .q_fp8 = q_fp8,
                 .q_s_stride = q.stride[0],
                 .q_h_stride = q.stride[1],
                 .cache = cache.pages.data,
                 .cache_fp8 = cache_fp8,
                 .page_stride = cache.pages.stride[0],
                 .row_stride = cache.pages.stride[1],
                 .page_size = cache.page_size(),
                 .num_pages = cache.num_pages(),
                 .seq_lens = meta.seq_lens.ptr<int32_t>(),
                 .kv_indptr = meta.kv_indptr.ptr<int32_t>(),
                 .kv_indices = meta.kv_indices.ptr<int32_t>(),
                 .o = out.o.data,
                 .o_bf16 = out.o.dtype == DType::bf16,
                 .exact_p = out.o.dtype == DType::f32 && !step_partials,
                 .step_partials = step_partials,
                 .o_split_stride = split_form ? out.o.stride[0] : 0,
                 .o_s_stride = out.o.stride[split_form ? 1 : 0],
                 .o_h_stride = out.o.stride[split_form ? 2 : 1],
                 .lse = out.lse.ptr<float>(),
                 .lse_split_stride = split_form ? out.lse.stride[0] : 0,
                 .lse_s_stride = out.lse.stride[split_form ? 1 : 0],
                 .lse_h_stride = out.lse.stride[split_form ? 2 : 1],
                 .batch = meta.batch(),
                 .qlen = meta.qlen,
                 .heads = query_heads(),
                 .splits = split_form ? int(out.o.shape[0]) : 1,
                 .score_scale = float(cfg.sm_scale() * (q_fp8 ? q_scale_ : 1.0f) * (cache_fp8 ? k_scale_ : 1.0f)),
                 .v_scale = cache_fp8 ? k_scale_ : 1.0f,
                 .dcp_size = opts.dcp.size,
                 .dcp_rank = opts.dcp.rank,
                 .dcp_interleave = opts.dcp.interleave,
                 .error = error_.get<uint32_t>()};
  // The step's partials at W = 1 where the wgmma kernel takes TMA tiles, B > 1: the flat plan,
  // key-CTAs sharing all requests' tiles evenly (uneven batches), partial i = [Q, G, L].
  // (A bf16 query over an fp8 cache: the 16-row kernel's split at every height, with the 16-row
  // plan, unless MLA_ATTEND_Q_SPLIT=0, or the many-rows kernel's split in 32-row CTAs where the
  // planner asks for many rows, unless MLA_ROWS_Q_SPLIT=0: attend_shape.)
  const CacheKind kind = CacheKind::of(cache);
  const AttendShape shape = attend_shape(p.batch, meta.qlen, kind);
  p.many_rows = shape.many_rows;
  const int ctas = std::max(p.batch * p.splits, flat_ctas(p.batch, meta.qlen, kind));
  // An even batch (host lengths within 1/8 of the longest) keeps fixed splits: the flat plan's
  // segment switches (a query reload, a partial's store, a drained pipeline) cost more than its
  // balance brings there. Many-rows kernel (H200, 949867f): D 320.7 vs 344.1 us, F 175.5 vs 200.4;
  // 16-row kernel (session 23, GPU-5adcda6e, each twice): A 46.7 vs 48.0, B 296.0 vs 300.4, C 83.9
  // vs 86.0, B64 83.8 vs 85.6, pages 16 and 1 alike, the step up to 6% faster (fewer partials to
  // merge). Uneven or unknown lengths take the flat plan.
  const bool even = flat::lengths_even(meta.seq_lens_host.data(), int64_t(meta.seq_lens_host.size()));
  // Pages TMA does not box (attend_wgmma_uses_tma): the 16-row kernel copies an fp8 cache's rows by
  // bulk copies (v24: TMA's asynchrony, so the flat plan as with boxes); the many-rows kernel gathers
  // them by cp.async, and uneven batches take the flat plan on those tiles (session 10: 64 x 128 heads
  // x u32768 at page 1: 744.8 µs vs 863.1 on one-row TMA boxes, same lengths; H200), as the 16-row
  // kernel's cp.async tiles do (v22). Even batches gain nothing from it there (segment switches drain
  // the copies).
  const bool boxes = attend_wgmma_uses_tma(p), tma = boxes || attend_wgmma_row_copies(p);
  const bool copies_flat = !tma && !even && (!p.many_rows || attend_rows_gathers(p));
  const FlatMode mode = flat_plan_mode();
  // (kFill: even batches only, and where the wave bounded the split count, not the shortest split
  // or LayerOptions.num_splits: short requests keep their few fixed splits, as the flat plan would
  // spread them over a wave. Asked in that order, so uneven steps skip the static plan. The share
  // from the device's bandwidth, s38a, only where the 16-row kernel boxes the pages: at page 1 its
  // row copies lost flat where boxes won, B = 100 x 12 heads 74.3 fixed / 76.6 flat on an H200.)
  const bool fill_flat = even && mode == FlatMode::kFill && opts.num_splits == 0 &&
                         p.splits == plan_splits(p.batch, meta.qlen, kind, {}) &&
                         !attend_fixed_fills_its_waves(int64_t(p.batch) * shape.m_tiles * p.splits, shape.slots, shape.many_rows,
                                                       shape.slots == 2 * sms_ && boxes ? fill_per_mille_ : 0);
  const bool even_flat = (!p.many_rows && mode == FlatMode::kAll) || fill_flat;
  const bool flat = step_partials && opts.dcp.size == 1 && p.batch > 1 && mode != FlatMode::kOff &&
                    (!even || even_flat) &&
                    (attend_wgmma_applies(p) || attend_rows_bf16_applies(p)) &&
                    (tma || copies_flat) && p.batch <= kMaxFlatBatch &&
                    ctas + 1 <= kMaxPostPartials && int64_t(ctas + p.batch) * meta.qlen <= partial_rows_;
  if (flat) {
    const FlatStrides st = flat_strides(query_heads(), meta.qlen);
    p.flat_ctas = ctas;
    p.part_first = at<int32_t>(part_first_);
    p.part_count = at<int32_t>(part_count_);
    p.o_split_stride = st.o_split, p.o_s_stride = st.o_s, p.o_h_stride = st.o_h;
    p.lse_split_stride = st.lse_split, p.lse_s_stride = st.lse_s, p.lse_h_stride = st.lse_h;
  }
  if (step_partials) partials_flat_ = flat;
  if (attend_skew_wanted(p.batch)) p.skew_sms = sms_;  // (s33a: the 16-row kernel's fixed splits, where it applies)
  const AttendKernel family = launch_attend(p, stream_);
  if (family != AttendKernel::kCount) last_attend_ = {family, p.splits, p.flat_ctas};
}

std::string CudaBackend::last_attend_kernel() const {
  const AttendRun& r = last_attend_;
  if (r.family == AttendKernel::kCount) return {};
  return std::string(attend_kernel_name(r.family)) +
         (r.flat_ctas > 0 ? ", flat plan of " + std::to_string(r.flat_ctas) + " key-CTAs"
                          : ", " + std::to_string(r.splits) + (r.splits == 1 ? " split" : " fixed splits"));
}

void CudaBackend::post(const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta, const TensorView& out) {
  DeviceGuard guard(opts.cuda_device);
  require_unit_inner(attn.o, "post's o");
  require_unit_inner(out, "post's out");
  const bool has_gate = cfg.gate_dim() > 0;
  if (has_gate) require_unit_inner(gate, "the gate");
  // W > 1 (SPEC.md post 1): every rank's partials of this rank's N heads are exchanged into
  // [W*splits, S, N, L] and merged with the split partials in the same merge.
  AttendOutputs in = attn;
  int head_offset = opts.dcp.rank * cfg.heads();
  if (opts.dcp.size > 1) {
    const std::vector<int64_t> o_shape = detail::exchanged_o_shape(cfg, opts, attn.o);
    const std::vector<int64_t> lse_shape = detail::exchanged_lse_shape(cfg, opts, attn.o);
    in.o = TensorView::contiguous(at(exchanged_o_), attn.o.dtype, o_shape, Device::cuda, opts.cuda_device);
    in.lse = TensorView::contiguous(at(exchanged_lse_), DType::f32, lse_shape, Device::cuda, opts.cuda_device);
    // (the slots hold partial_rows_ rows of G f32 o and lse: a bf16 o within o's bytes could hold
    // twice as many rows as lse's slot)
    const int64_t rows = partial_rows_ * query_heads();
    MLA_REQUIRE(int64_t(in.o.numel() * dtype_size(in.o.dtype)) <= rows * kLatent * int64_t(sizeof(float)) &&
                    in.lse.numel() <= rows,
                "post: ", in.o.str(), " exceeds the DCP exchange workspace planned from max_tokens (",
                partial_rows_, " rows of ", query_heads(), " heads)");
    detail::exchange_partials(cfg, opts, attn, in, stream_);
    head_offset = 0;
  }
  const bool split_form = in.o.rank == 4;
  PostParams p{.o = in.o.data,
               .o_bf16 = in.o.dtype == DType::bf16,
               .splits = split_form ? int(in.o.shape[0]) : 1,
               .o_split_stride = split_form ? in.o.stride[0] : 0,
               .o_s_stride = in.o.stride[split_form ? 1 : 0],
               .o_h_stride = in.o.stride[split_form ? 2 : 1],
               .lse = in.lse.ptr<float>(),
               .lse_split_stride = split_form ? in.lse.stride[0] : 0,
               .lse_s_stride = in.lse.stride[split_form ? 1 : 0],
               .lse_h_stride = in.lse.stride[split_form ? 2 : 1],
               .w_codes = w_uv_codes_.get<uint8_t>(),
               .w_scales = w_uv_scales_.get<uint8_t>(),
               .gate = has_gate ? gate.ptr<uint16_t>() : nullptr,
               .gate_stride = has_gate ? gate.stride[0] : 0,
               .out = out.ptr<uint16_t>(),
               .out_stride = out.stride[0],
               .tokens = meta.tokens(),
               .heads = cfg.heads(),
               .head_offset = head_offset,
               .v_dim = cfg.v_head_dim,
               .sms = sms_};
  if (partials_flat_ && attn.o.data == at(o_) && opts.dcp.size == 1) {  // attend's flat plan (above)
    const FlatStrides st = flat_strides(query_heads(), meta.qlen);
    p.part_first = at<int32_t>(part_first_);
    p.part_count = at<int32_t>(part_count_);
    p.qlen = meta.qlen;
    p.splits = 1;  // per token: its request's part_count instead (at most key-CTAs + 1)
    p.o_split_stride = st.o_split, p.o_s_stride = st.o_s, p.o_h_stride = st.o_h;
    p.lse_split_stride = st.lse_split, p.lse_s_stride = st.lse_s, p.lse_h_stride = st.lse_h;
  }
  launch_post(p, stream_);
}

uint32_t CudaBackend::take_errors() {
  DeviceGuard guard(opts.cuda_device);
  uint32_t bits = 0;
  MLA_CUDA_CHECK(cudaMemcpyAsync(&bits, error_.get(), sizeof(bits), cudaMemcpyDeviceToHost, stream_));
  MLA_CUDA_CHECK(cudaMemsetAsync(error_.get(), 0, sizeof(bits), stream_));
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return bits;
}

}  // namespace mla::cuda

namespace mla::detail {
std::unique_ptr<BackendImpl> make_cuda_backend(const LayerConfig& cfg, const PreparedWeights& w,
                                               const LayerOptions& opts) {
  return std::make_unique<cuda::CudaBackend>(cfg, w, opts);
}
}  // namespace mla::detail

namespace mla::cuda {

AttendRun last_attend_run(const detail::BackendImpl& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  MLA_REQUIRE(cuda != nullptr, "last_attend_run: the layer's backend is ", backend_name(backend.kind()),
              ", expected cuda");
  return cuda->last_attend_run();
}

uint32_t take_device_errors(detail::BackendImpl& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  MLA_REQUIRE(cuda != nullptr, "take_device_errors: the layer's backend is ", backend_name(backend.kind()),
              ", expected cuda");
  return cuda->take_errors();
}

std::string describe_device_errors(uint32_t bits) {
  std::string out;
  auto add = [&](uint32_t bit, const char* what) {
    if (!(bits & bit)) return;
    if (!out.empty()) out += "; ";
    out += what;
  };
  add(kBadSlot, "slot_mapping: a slot outside [-1, num_pages * page_size)");
  add(kDuplicateSlot, "slot_mapping: two tokens with the same slot");
  add(kBadSeqLen, "seq_lens: a length < 0 or in (0, qlen), or an empty request with a slot >= 0");
  add(kBadPage, "kv_indices: a page outside [0, num_pages)");
  add(kShortPageTable, "kv_indptr: fewer pages than a request's length needs");
  return out;
}

void check_device_errors(detail::BackendImpl& backend) {
  const uint32_t bits = take_device_errors(backend);
  MLA_REQUIRE(bits == 0, "CUDA step rejected on the device (the cache was not written): ", describe_device_errors(bits));
}

}  // namespace mla::cuda
