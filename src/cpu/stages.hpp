#pragma once
// The CPU backend's stages, one file each (pre.cpp, attend.cpp, post.cpp), mirrored by src/cuda.
// Arguments arrive validated (src/core/validate.hpp), metadata values included.
#include <functional>
#include <vector>

#include "core/backend.hpp"
#include "mla/layer.hpp"

namespace mla::cpu {

struct DenseWeights;  // cpu/gemm.hpp

struct Context {
  const LayerConfig& cfg;
  const LayerOptions& opts;
  const PreparedWeights& w;
  int threads;  // OpenMP threads to use
  // qkv_a and q_b ready for the dense products (cpu/gemm.hpp), built once by CpuBackend; null:
  // pre builds them on every call (slow, for callers without a backend).
  const DenseWeights* dense = nullptr;
};

void pre(const Context& ctx, const TensorView& hidden, const StepMeta& meta, const KVCache& cache,
         const PreOutputs& out);
void attend(const Context& ctx, const TensorView& q, const KVCache& cache, const StepMeta& meta,
            const AttendOutputs& out);
void post(const Context& ctx, const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta,
          const TensorView& out);

// Benchmark support (bench.cpp): steady_clock timing with the last-level cache flushed before
// each run, and this machine's memory-copy bandwidth and sgemm rate.
std::vector<double> time_us(const std::function<void()>& fn, int warmup, int iters, int threads);
detail::Ceilings measure_ceilings(int threads);

}  // namespace mla::cpu
