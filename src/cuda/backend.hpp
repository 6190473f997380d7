#pragma once
// The CUDA backend behind mla::Layer (make_cuda_backend). Internal: the tests and the benchmark
// reach it through detail::backend_of(layer).
#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <string>

#include "core/backend.hpp"
#include "core/workspace_impl.hpp"
#include "cuda/gemm.hpp"
#include "cuda/handles.hpp"
#include "cuda/stages.hpp"

namespace mla::cuda {

// What the split planner needs of a cache: its dtype, and whether TMA boxes its pages for the
// many-rows kernel's split of a bf16 query (attend_rows_q_split_boxes; not asked under
// MLA_ROWS_Q_SPLIT=0, the one plan it changes; the workspace is sized over both).
struct CacheKind {
  DType dtype;
  bool rows_boxes = true;
  static CacheKind of(const KVCache& cache);
};

class CudaBackend final : public detail::BackendImpl {
 public:
  CudaBackend(const LayerConfig& cfg, const PreparedWeights& w, const LayerOptions& opts);
  ~CudaBackend() override;

  Backend kind() const override { return Backend::cuda; }
  Device device() const override { return Device::cuda; }

  void pre(const TensorView& hidden, const StepMeta& meta, const KVCache& cache, const PreOutputs& out) override;
  void attend(const TensorView& q, const KVCache& cache, const StepMeta& meta, const AttendOutputs& out) override;
  void post(const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta, const TensorView& out) override;
  detail::StepWorkspace workspace(const StepMeta& meta, const KVCache& cache) override;

  std::vector<double> time_us(const std::function<void()>& fn, int warmup, int iters) override;
  detail::Ceilings measure_ceilings() override;
  double sm_clock_mhz() override;
  std::string last_attend_kernel() const override;
  AttendRun last_attend_run() const { return last_attend_; }

  // Reads and clears the device error word (DeviceError bits); waits for the layer's stream.
  uint32_t take_errors();
  // Split-KV chunks step() uses for a batch over such a cache (host lengths where known, else a
  // static plan).
  int plan_splits(int batch, int qlen, CacheKind cache, std::span<const int32_t> seq_lens_host) const;
  int flat_ctas(int batch, int qlen, CacheKind cache) const;
  AttendShape attend_shape(int batch, int qlen, CacheKind cache) const;  // (attend_plan_shape)
  cudaStream_t stream() const { return stream_; }

 private:
  int query_heads() const { return cfg.heads() * opts.dcp.size; }

  AttendRun last_attend_;  // (last_attend_kernel)

  cudaStream_t stream_ = nullptr;
  float q_scale_ = 1, k_scale_ = 1;
  int sms_ = 0;
  int fill_per_mille_ = 0;  // the 16-row kernel's fill share (attend_fill_per_mille; MLA_ATTEND_FILL_BW=0: 0, the 2/3 rule)
  int64_t l2_bytes_ = 0;
  std::string device_name_;
  std::unique_ptr<CublasLt> lt_;

  // Weights.
  DeviceBuffer qkv_a_, q_b_, q_a_norm_, kv_a_norm_, w_uk_codes_, w_uk_scales_, w_uv_codes_, w_uv_scales_;
  DeviceBuffer inv_freq_;  // [R/2] double; empty for NoPE
  double rope_mscale_ = 1.0;

  // Workspace: slots in the layer's own mla::Workspace or the one it shares with other layers
  // (LayerOptions.workspace), resolved at every use (a later, larger layer may move the block).
  std::shared_ptr<Workspace> workspace_;
  mla::detail::WorkspaceLayout layout_;
  template <class T = void>
  T* at(int slot) const { return reinterpret_cast<T*>(layout_.at(workspace_->impl().data(), slot)); }
  int y_ = 0, q_c_ = 0, q_full_ = 0, q_ = 0, gate_ = 0, o_ = 0, lse_ = 0, cublas_workspace_ = 0;
  int exchanged_o_ = 0, exchanged_lse_ = 0;  // W > 1: the combine's [W*splits, S, N, L] partials
  int64_t q_heads_ = 0, partial_rows_ = 0;
  // The flat plan's partial index ranges per request (AttendParams.flat_ctas), and whether the
  // workspace partials were last written that way (post reads them accordingly).
  int part_first_ = 0, part_count_ = 0;
  bool partials_flat_ = false;
  DeviceBuffer error_;  // the layer's own (take_errors)
  std::unique_ptr<Gemm> gemm_qkv_a_, gemm_q_b_;
  DeviceBuffer flush_;  // time_us's L2 flush, allocated on first use
  DeviceBuffer clock_;  // sm_clock_mhz's cycles and ns, allocated on first use (no cudaFree between timings)
};

}  // namespace mla::cuda
