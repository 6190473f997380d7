#pragma once
// Layer weights: the checkpoint's form (bf16 bits, row-major [out, in]) and the prepared form the
// backends run on (gate merged into one qkv_a GEMM, kv_b absorbed into W_UK / W_UV as MXFP4).
#include <cstdint>
#include <optional>
#include <vector>

#include "mla/config.hpp"

namespace mla {

// [batch, rows, cols] matrix in MXFP4, blocks of 32 along cols (the reduced dimension).
struct MxFp4Matrix {
  int batch = 0, rows = 0, cols = 0;
  std::vector<uint8_t> codes;   // [batch, rows, cols/2], first element in the low nibble
  std::vector<uint8_t> scales;  // [batch, rows, cols/32] E8M0
  float at(int b, int r, int c) const;  // dequantized element
};

struct CheckpointWeights {
  std::vector<uint16_t> qkv_a;      // [Rq + L + R (+ N*V if gate == merged), D] bf16
  std::vector<uint16_t> g_proj;     // [N*V, D] bf16, only if gate == separate
  std::vector<uint16_t> q_a_norm;   // [Rq] bf16
  std::vector<uint16_t> kv_a_norm;  // [L] bf16
  std::vector<uint16_t> q_b;        // [N*(P+R), Rq] bf16
  std::vector<uint16_t> kv_b;       // [N*(P+V), L] bf16; empty when kv_b_mxfp4 holds kv_b
  // kv_b as a checkpoint already holds it in MXFP4 (blocks of 32 along L): [1, N*(P+V), L]. Then
  // prepare_weights takes W_UV's codes and scales as they are (its blocks already run along L) and
  // re-packs W_UK along P from the exactly dequantized values (one more rounding, see weights.cpp).
  std::optional<MxFp4Matrix> kv_b_mxfp4;
  float q_scale = 1.0f;             // fp8 query: stored value = q / q_scale
  float k_scale = 1.0f;             // fp8 cache: stored value = row / k_scale
};

struct PreparedWeights {
  std::vector<uint16_t> qkv_a;   // [Rq + L + R + gate_dim, D] bf16: [q_a | kv_a | k_pe | gate]
  std::vector<float> q_a_norm;   // [Rq]
  std::vector<float> kv_a_norm;  // [L]
  std::vector<uint16_t> q_b;     // [N*(P+R), Rq] bf16
  MxFp4Matrix w_uk;              // [N, L, P]: W_UK[n] transposed, ql_nope[l] = sum_p q_nope[p] W_UK[n][p, l]
  MxFp4Matrix w_uv;              // [N, V, L]: out[v] = sum_l o[l] W_UV[n][v, l]
  float q_scale = 1.0f;
  float k_scale = 1.0f;
};

// Checks shapes and scales against cfg (mla::Error names the tensor, the expected and the actual
// element counts), absorbs and packs. Also rejected: a g_proj when cfg.gate != separate, a
// non-finite kv_b entry (MXFP4 would hide it in a NaN block), a kv_b_mxfp4 scale above 252 (overflow, NaN),
// and kv_b and kv_b_mxfp4 both given.
PreparedWeights prepare_weights(const LayerConfig& cfg, const CheckpointWeights& ckpt);

// Synthetic weights from a seed, scaled like a trained layer's (unit-variance activations):
// qkv_a and the gate ~ N(0, 1/D), norms uniform in [0.9, 1.1], q_b ~ N(0, 1/Rq), kv_b's W_UK rows
// ~ N(0, 1/P) and W_UV rows ~ N(0, 4/L); q_scale and k_scale are amax/448 of the expected
// activations (about 6 sigma) times a random factor in [0.8, 1.25], so that tests exercise scales
// that are not powers of two. Deterministic (counter-based, independent of the thread count); the
// gate has its own stream, so one seed gives the same prepared weights for merged and separate.
CheckpointWeights random_checkpoint_weights(const LayerConfig& cfg, uint64_t seed);

}  // namespace mla
