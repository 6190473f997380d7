#pragma once
// Validation of every stage's arguments, run by Layer before a backend writes anything.
// Each failure throws mla::Error naming the argument with the expected and actual values.
// Shapes, dtypes, strides and devices are always checked; the values of metadata (seq_lens,
// kv_indptr, kv_indices, slot_mapping) are checked here when they live on the host, and by the
// CUDA kernels where they are read when they live on the device.
#include "mla/layer.hpp"

namespace mla::detail {

struct StageContext {
  const LayerConfig& cfg;
  const LayerOptions& opts;
  Device device;  // where the layer runs: every view must be there
};

void validate_meta(const StageContext& ctx, const char* stage, const StepMeta& meta, const KVCache& cache);
void validate_pre(const StageContext& ctx, const TensorView& hidden, const StepMeta& meta,
                  const KVCache& cache, const PreOutputs& out);
void validate_attend(const StageContext& ctx, const TensorView& q, const KVCache& cache,
                     const StepMeta& meta, const AttendOutputs& out);
void validate_post(const StageContext& ctx, const AttendOutputs& attn, const TensorView& gate,
                   const StepMeta& meta, const TensorView& out);

}  // namespace mla::detail
