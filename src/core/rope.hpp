#pragma once
// Rotary embedding of the q_pe / k_pe parts (SPEC.md pre step 4): pairs (x[2i], x[2i+1]) rotate by
// position * inv_freq[i] (interleaved, not NeoX halves), with DeepSeek's YaRN frequencies and
// cos/sin scaled by mscale. Computed on the host in double, once per layer: the CPU backend applies
// it directly, the CUDA backend uploads inv_freq and mscale.
#include <cmath>
#include <cstdint>
#include <vector>

#include "mla/config.hpp"

namespace mla::rope {

struct RopeTable {
  bool enabled = false;          // false: NoPE (kimi-k3), the R part passes through unrotated
  std::vector<double> inv_freq;  // [R/2]: pair i turns by position * inv_freq[i] radians
  double mscale = 1.0;           // cos and sin are multiplied by this (1 for the shipped presets)
};

// DeepSeek-V3 / HF DeepseekV3YarnRotaryEmbedding: inv_freq blends theta^(-2i/R) (extrapolation,
// the fast pairs) with theta^(-2i/R)/factor (interpolation, the slow pairs) along a linear ramp
// between the correction dims of beta_fast and beta_slow rotations at original_max_position.
std::vector<double> yarn_inv_freq(const YarnParams& yarn, int rope_dim);
// DeepSeek's yarn_get_mscale(factor, m) = 0.1 * m * ln(factor) + 1 (1 for factor <= 1).
double yarn_get_mscale(double factor, double mscale);
// The cos/sin factor: yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim).
// (The softmax side, m^2 from mscale_all_dim, is LayerConfig::sm_scale().)
double yarn_cos_sin_mscale(const YarnParams& yarn);

RopeTable make_table(const LayerConfig& cfg);

// Position of query i of a request (SPEC.md: seq_len - Q + i). Empty padding requests
// (seq_len 0) have no position; their tokens are rotated at position 0 so that every backend
// computes the same (ignored) query for them.
inline int64_t token_position(int32_t seq_len, int qlen, int i) {
  return seq_len > 0 ? int64_t(seq_len) - qlen + i : 0;
}

// cos/sin of pair i at `position`, times mscale, in double. The angle is formed in double: in
// fp32 position * inv_freq loses up to 5e-4 rad at positions ~10^4.
inline void cos_sin(const RopeTable& t, int64_t position, int pair, double& c, double& s) {
  const double angle = double(position) * t.inv_freq[pair];
  c = std::cos(angle) * t.mscale;
  s = std::sin(angle) * t.mscale;
}
}  // namespace mla::rope
