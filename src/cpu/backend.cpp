// The CPU backend: holds the prepared weights and step()'s workspace, runs the stages.
#include <omp.h>

#include "core/backend.hpp"
#include "cpu/gemm.hpp"
#include "cpu/stages.hpp"

namespace mla::detail {
namespace {

class CpuBackend final : public BackendImpl {
 public:
  CpuBackend(const LayerConfig& c, const PreparedWeights& w, const LayerOptions& o)
      : BackendImpl(c, o),
        w_(w),
        threads_(o.num_threads > 0 ? o.num_threads : omp_get_num_procs()),
        dense_(cpu::DenseWeights::from(c, w, threads_)) {
    const int64_t s = o.max_tokens, g = int64_t(cfg.heads()) * o.dcp.size;
    const int64_t hq = o.q_head_pad > 0 ? o.q_head_pad : g;
    q_ = Tensor::empty(o.q_dtype, {s, hq, cfg.row_dim()});
    if (cfg.gate_dim() > 0) gate_ = Tensor::empty(DType::bf16, {s, cfg.gate_dim()});
    o_ = Tensor::empty(DType::f32, {s, g, cfg.kv_lora_rank});
    lse_ = Tensor::empty(DType::f32, {s, g});
  }

  Backend kind() const override { return Backend::cpu; }
  Device device() const override { return Device::cpu; }

  void pre(const TensorView& hidden, const StepMeta& meta, const KVCache& cache, const PreOutputs& out) override {
    cpu::pre(ctx(), hidden, meta, cache, out);
  }
  void attend(const TensorView& q, const KVCache& cache, const StepMeta& meta, const AttendOutputs& out) override {
    cpu::attend(ctx(), q, cache, meta, out);
  }
  void post(const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta, const TensorView& out) override {
    cpu::post(ctx(), attn, gate, meta, out);
  }

  std::vector<double> time_us(const std::function<void()>& fn, int warmup, int iters) override {
    return cpu::time_us(fn, warmup, iters, threads_);
  }
  Ceilings measure_ceilings() override { return cpu::measure_ceilings(threads_); }

  StepWorkspace workspace(const StepMeta& meta, const KVCache&) override {
    const int64_t s = meta.tokens();
    auto rows = [s](const Tensor& t) {  // the first s rows of a workspace tensor
      TensorView v = t.view();
      v.shape[0] = s;
      return v;
    };
    StepWorkspace ws;
    ws.pre.q = rows(q_);
    if (gate_.bytes()) ws.pre.gate = rows(gate_);
    ws.attend.o = rows(o_);
    ws.attend.lse = rows(lse_);
    return ws;
  }

 private:
  cpu::Context ctx() const { return {.cfg = cfg, .opts = opts, .w = w_, .threads = threads_, .dense = &dense_}; }

  PreparedWeights w_;
  int threads_;
  cpu::DenseWeights dense_;  // qkv_a and q_b ready for the dense products (cpu/gemm.hpp), made once
  Tensor q_, gate_, o_, lse_;
};

}  // namespace

std::unique_ptr<BackendImpl> make_cpu_backend(const LayerConfig& cfg, const PreparedWeights& w,
                                              const LayerOptions& opts) {
  return std::make_unique<CpuBackend>(cfg, w, opts);
}

}  // namespace mla::detail
