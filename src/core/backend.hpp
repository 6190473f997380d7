#pragma once
// The seam between the public Layer and a backend (src/cpu, src/cuda). Layer validates every
// argument (src/core/validate.hpp) before it calls a stage here, so backends may assume shapes,
// dtypes and strides are right; value checks on device-resident metadata are the backend's.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mla/layer.hpp"

namespace mla::detail {

// Views into a backend's own workspace for step() with S tokens.
struct StepWorkspace {
  PreOutputs pre;        // q [S, Hq, L+R], gate [S, N*V]
  AttendOutputs attend;  // o, lse (merged or split partials, as the backend prefers)
};

// The roofline ceilings of the machine a backend runs on, measured in the same run as a benchmark.
struct Ceilings {
  std::string device_name;
  double copy_gbps = 0;            // device (or host memory) copy: bytes read + bytes written per s
  double matmul_tflops = 0;        // dense bf16 matmul, fp32 accumulation (CPU: sgemm)
  double fp8_matmul_tflops = 0;    // dense fp8 matmul where the device has one (0 otherwise)
  // GPU: 576-byte rows read (bytes read per s; 0: not measured): in order (a page of 64+ rows),
  // and at random rows (pages of one row: a key row alone, wherever the page table puts it)
  double read_rows_gbps = 0;
  double gather_rows_gbps = 0;
  // CPU: peak rates of the instructions attend runs on, all threads (register-only loops; 0: not measured)
  double fp32_fma_gflops = 0;      // fp32 FMA, widest vectors the attend kernels use
  double bf16_dot_gflops = 0;      // vdpbf16ps (AVX512-BF16; 0 without), 4 FLOPs per fp32 lane
  // How time_us leaves the caches before each timed run (recorded with every benchmark).
  std::string cache_flush;
};

class BackendImpl {
 public:
  BackendImpl(const LayerConfig& cfg, const LayerOptions& opts) : cfg(cfg), opts(opts) {}
  virtual ~BackendImpl() = default;

  virtual Backend kind() const = 0;
  virtual Device device() const = 0;

  virtual void pre(const TensorView& hidden, const StepMeta& meta, const KVCache& cache,
                   const PreOutputs& out) = 0;
  virtual void attend(const TensorView& q, const KVCache& cache, const StepMeta& meta,
                      const AttendOutputs& out) = 0;
  virtual void post(const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta,
                    const TensorView& out) = 0;
  // (cache: the step's, whose dtype the CUDA backend's split plan depends on)
  virtual StepWorkspace workspace(const StepMeta& meta, const KVCache& cache) = 0;

  // Benchmark support (`mla bench`): each of `iters` runs of fn timed with the backend's clock
  // (CUDA events on the layer's stream; steady_clock on the CPU) after `warmup` runs, with the
  // caches flushed before every run; and the ceilings measured now.
  virtual std::vector<double> time_us(const std::function<void()>& fn, int warmup, int iters) = 0;
  virtual Ceilings measure_ceilings() = 0;
  // The SM clock in MHz now, after the work queued before it (CUDA: a one-thread probe kernel on the
  // layer's stream counts clock64() cycles over ~200 µs of %globaltimer; it synchronizes the stream,
  // so call it outside timed regions and graph captures); 0 where not measured (the CPU). Benchmarks
  // record it beside their times: an H200 that idles at 1980 MHz dropped to 1755-1860 for ~0.1-0.2 s and
  // ran at ~1965 for ~0.3 s more whenever heavy work began (session 43's nvidia-smi samples, 50 ms apart:
  // too coarse for one config's timing).
  virtual double sm_clock_mhz() { return 0; }
  // The attend kernel the last attend() launched and its plan (CUDA: e.g. "rows, 2 fixed splits",
  // "wgmma_q_split, flat plan of 264 key-CTAs"; CPU: "cpu avx512-bf16", the instruction set's
  // kernels), for benchmark records and `mla run`; empty where unknown (CUDA: before any attend).
  virtual std::string last_attend_kernel() const { return {}; }

  const LayerConfig cfg;
  const LayerOptions opts;
};

// The backend behind a Layer, for the benchmark driver and tests inside the project.
BackendImpl& backend_of(Layer& layer);

std::unique_ptr<BackendImpl> make_cpu_backend(const LayerConfig& cfg, const PreparedWeights& w,
                                              const LayerOptions& opts);
// Defined in src/cuda when built with MLA_CUDA, else a stub that throws mla::Error.
std::unique_ptr<BackendImpl> make_cuda_backend(const LayerConfig& cfg, const PreparedWeights& w,
                                               const LayerOptions& opts);
bool cuda_device_present();
// Device memory for mla::Tensor (stubs throw without CUDA).
void* cuda_alloc(size_t bytes, int device_index);
void cuda_free(void* p, int device_index);
void cuda_copy(void* dst, const void* src, size_t bytes);  // cudaMemcpyDefault, synchronous

}  // namespace mla::detail
