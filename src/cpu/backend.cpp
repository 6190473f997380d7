// The CPU backend: holds the prepared weights and step()'s workspace, runs the stages.
#include <omp.h>

#include <new>

#include "core/backend.hpp"
#include "core/workspace_impl.hpp"
#include "cpu/attend_kernels.hpp"
#include "cpu/gemm.hpp"
#include "cpu/stages.hpp"
#include "mla/error.hpp"

namespace mla::detail {
namespace {

class CpuBackend final : public BackendImpl {
 public:
  CpuBackend(const LayerConfig& c, const PreparedWeights& w, const LayerOptions& o)
      : BackendImpl(c, o),
        w_(w),
        threads_(o.num_threads > 0 ? o.num_threads : omp_get_num_procs()),
        dense_(cpu::DenseWeights::from(c, w, threads_)) {
    // step()'s scratch: [max_tokens, ...] slots in the layer's own workspace or the shared one.
    const int64_t s = o.max_tokens, g = int64_t(cfg.heads()) * o.dcp.size;
    const int64_t hq = o.q_head_pad > 0 ? o.q_head_pad : g;
    q_ = {layout_.add(s * hq * cfg.row_dim() * int64_t(dtype_size(o.q_dtype))), o.q_dtype, {hq, cfg.row_dim()}};
    gate_ = {layout_.add(s * cfg.gate_dim() * 2), DType::bf16, {cfg.gate_dim()}};
    o_ = {layout_.add(s * g * cfg.kv_lora_rank * 4), DType::f32, {g, cfg.kv_lora_rank}};
    lse_ = {layout_.add(s * g * 4), DType::f32, {g}};
    workspace_->impl().reserve(Device::cpu, 0, layout_.total(), [](int64_t bytes) {
      constexpr std::align_val_t kAlign{WorkspaceLayout::kAlign};
      return Workspace::Impl::Block(static_cast<uint8_t*>(::operator new(size_t(bytes), kAlign)),
                                    [](uint8_t* p) { ::operator delete(p, kAlign); });
    });
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
  // (one path a machine: the widest instruction set's kernels, chosen once)
  std::string last_attend_kernel() const override { return std::string("cpu ") + cpu::attend_kernels().name; }

  StepWorkspace workspace(const StepMeta& meta, const KVCache&) override {
    const int64_t s = meta.tokens();
    MLA_REQUIRE(workspace_->bytes() >= layout_.total(), "LayerOptions.workspace: holds ", workspace_->bytes(),
                " bytes, this layer needs ", layout_.total());
    uint8_t* base = workspace_->impl().data();
    auto rows = [&](const Slot& slot) {  // the slot's first s rows, contiguous
      std::vector<int64_t> shape{s};
      shape.insert(shape.end(), slot.inner.begin(), slot.inner.end());
      return TensorView::contiguous(layout_.at(base, slot.index), slot.dtype, shape);
    };
    StepWorkspace ws;
    ws.pre.q = rows(q_);
    if (cfg.gate_dim() > 0) ws.pre.gate = rows(gate_);
    ws.attend.o = rows(o_);
    ws.attend.lse = rows(lse_);
    return ws;
  }

 private:
  cpu::Context ctx() const { return {.cfg = cfg, .opts = opts, .w = w_, .threads = threads_, .dense = &dense_}; }

  PreparedWeights w_;
  int threads_;
  cpu::DenseWeights dense_;  // qkv_a and q_b ready for the dense products (cpu/gemm.hpp), made once
  struct Slot {
    int index;
    DType dtype;
    std::vector<int64_t> inner;  // the dims after the token's
  };
  std::shared_ptr<Workspace> workspace_ = opts.workspace ? opts.workspace : std::make_shared<Workspace>();
  WorkspaceLayout layout_;
  Slot q_, gate_, o_, lse_;
};

}  // namespace

std::unique_ptr<BackendImpl> make_cpu_backend(const LayerConfig& cfg, const PreparedWeights& w,
                                              const LayerOptions& opts) {
  return std::make_unique<CpuBackend>(cfg, w, opts);
}

}  // namespace mla::detail
