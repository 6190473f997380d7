#include "mla/layer.hpp"

#include "core/backend.hpp"
#include "core/dcp.hpp"
#include "core/validate.hpp"
#include "mla/error.hpp"

namespace mla {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::automatic: return "auto";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

bool cuda_available() { return detail::cuda_device_present(); }

namespace detail {
BackendImpl& backend_of(Layer& layer) { return *layer.impl_; }
}  // namespace detail

Layer::Layer(const LayerConfig& cfg, const PreparedWeights& weights, const LayerOptions& opts) {
  cfg.validate();
  MLA_REQUIRE(opts.q_dtype == DType::fp8_e4m3 || opts.q_dtype == DType::bf16,
              "LayerOptions.q_dtype: expected fp8_e4m3 or bf16, got ", dtype_name(opts.q_dtype));
  MLA_REQUIRE(opts.max_tokens > 0, "LayerOptions.max_tokens: expected > 0, got ", opts.max_tokens);
  MLA_REQUIRE(opts.num_splits >= 0, "LayerOptions.num_splits: expected >= 0, got ", opts.num_splits);
  MLA_REQUIRE(opts.dcp.size >= 1, "LayerOptions.dcp.size: expected >= 1, got ", opts.dcp.size);
  MLA_REQUIRE(opts.dcp.rank >= 0 && opts.dcp.rank < opts.dcp.size, "LayerOptions.dcp.rank: expected in [0, ",
              opts.dcp.size, "), got ", opts.dcp.rank);
  MLA_REQUIRE(opts.dcp.interleave >= 1, "LayerOptions.dcp.interleave: expected >= 1, got ", opts.dcp.interleave);
  MLA_REQUIRE(opts.dcp.size == 1 || opts.q_dtype == DType::fp8_e4m3,
              "LayerOptions.q_dtype: a bf16 query needs dcp.size 1, got dcp.size ", opts.dcp.size);
  MLA_REQUIRE(opts.dcp.size == 1 || opts.comm != nullptr, "LayerOptions.comm: dcp.size ", opts.dcp.size,
              " needs a communicator");
  const int g = cfg.heads() * opts.dcp.size;
  MLA_REQUIRE(opts.q_head_pad == 0 || opts.q_head_pad >= g, "LayerOptions.q_head_pad: expected 0 or >= G = ", g,
              ", got ", opts.q_head_pad);
  Backend b = opts.backend;
  if (b == Backend::automatic) b = detail::cuda_device_present() ? Backend::cuda : Backend::cpu;
  impl_ = b == Backend::cuda ? detail::make_cuda_backend(cfg, weights, opts)
                             : detail::make_cpu_backend(cfg, weights, opts);
  detail::validate_dcp_options(cfg, opts, impl_->device());  // W divides T; comm's size, rank, device
}

Layer::~Layer() = default;
Layer::Layer(Layer&&) noexcept = default;
Layer& Layer::operator=(Layer&&) noexcept = default;

const LayerConfig& Layer::config() const { return impl_->cfg; }
const LayerOptions& Layer::options() const { return impl_->opts; }
Backend Layer::backend() const { return impl_->kind(); }
std::string Layer::last_attend_kernel() const { return impl_->last_attend_kernel(); }
Device Layer::device() const { return impl_->device(); }

void Layer::pre(const TensorView& hidden, const StepMeta& meta, const KVCache& cache, const PreOutputs& out) {
  // At W > 1 every rank learns whether all ranks' validation passed before any writes its cache.
  detail::validate_on_every_rank(impl_->opts, meta, [&] {
    detail::validate_pre({impl_->cfg, impl_->opts, device()}, hidden, meta, cache, out);
  });
  impl_->pre(hidden, meta, cache, out);
}

void Layer::attend(const TensorView& q, const KVCache& cache, const StepMeta& meta, const AttendOutputs& out) {
  detail::validate_attend({impl_->cfg, impl_->opts, device()}, q, cache, meta, out);
  impl_->attend(q, cache, meta, out);
}

void Layer::post(const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta, const TensorView& out) {
  detail::validate_post({impl_->cfg, impl_->opts, device()}, attn, gate, meta, out);
  impl_->post(attn, gate, meta, out);
}

void Layer::step(const TensorView& hidden, const StepMeta& meta, const KVCache& cache, const TensorView& out) {
  detail::StepWorkspace ws;
  // Validate all three stages before the first writes the cache (at W > 1, on every rank).
  detail::validate_on_every_rank(impl_->opts, meta, [&] {
    MLA_REQUIRE(meta.seq_lens.rank == 1, "step: seq_lens must be [B], got ", meta.seq_lens.str());
    MLA_REQUIRE(meta.tokens() <= impl_->opts.max_tokens, "step: S = B*Q = ", meta.tokens(),
                " exceeds LayerOptions.max_tokens = ", impl_->opts.max_tokens);
    ws = impl_->workspace(meta, cache);
    const detail::StageContext ctx{impl_->cfg, impl_->opts, device()};
    detail::validate_pre(ctx, hidden, meta, cache, ws.pre);
    detail::validate_attend(ctx, ws.pre.q, cache, meta, ws.attend);
    detail::validate_post(ctx, ws.attend, ws.pre.gate, meta, out);
  });
  impl_->pre(hidden, meta, cache, ws.pre);
  impl_->attend(ws.pre.q, cache, meta, ws.attend);
  impl_->post(ws.attend, ws.pre.gate, meta, out);
}

}  // namespace mla
