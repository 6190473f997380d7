#pragma once
// The CPU backend's stages, one file each (pre.cpp, attend.cpp, post.cpp), mirrored by src/cuda.
// Arguments arrive validated (src/core/validate.hpp), metadata values included.
#include "mla/layer.hpp"

namespace mla::cpu {

struct Context {
  const LayerConfig& cfg;
  const LayerOptions& opts;
  const PreparedWeights& w;
  int threads;  // OpenMP threads to use
};

void pre(const Context& ctx, const TensorView& hidden, const StepMeta& meta, const KVCache& cache,
         const PreOutputs& out);
void attend(const Context& ctx, const TensorView& q, const KVCache& cache, const StepMeta& meta,
            const AttendOutputs& out);
void post(const Context& ctx, const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta,
          const TensorView& out);

}  // namespace mla::cpu
