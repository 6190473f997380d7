// The prepared weights in float64: the exact values the backends multiply by (bf16 widened, MXFP4
// decoded), with W_UK back in SPEC.md's [P, L] orientation.
#include "mla/formats.hpp"
#include "reference/reference.hpp"

namespace mla::ref {

Weights64 dequantize(const LayerConfig& cfg, const PreparedWeights& w) {
  const int N = cfg.heads(), P = cfg.qk_nope_dim, L = cfg.kv_lora_rank, V = cfg.v_head_dim;
  Weights64 r;
  for (uint16_t b : w.qkv_a) r.qkv_a.push_back(bf16_to_float(b));
  for (uint16_t b : w.q_b) r.q_b.push_back(bf16_to_float(b));
  r.q_a_norm.assign(w.q_a_norm.begin(), w.q_a_norm.end());
  r.kv_a_norm.assign(w.kv_a_norm.begin(), w.kv_a_norm.end());
  // Prepared w_uk is [N, L, P] (W_UK[n] transposed, blocks along P); W_UK[n] is [P, L].
  r.w_uk.resize(size_t(N) * P * L);
  for (int n = 0; n < N; ++n)
    for (int p = 0; p < P; ++p)
      for (int l = 0; l < L; ++l) r.w_uk[(size_t(n) * P + p) * L + l] = w.w_uk.at(n, l, p);
  r.w_uv.resize(size_t(N) * V * L);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v)
      for (int l = 0; l < L; ++l) r.w_uv[(size_t(n) * V + v) * L + l] = w.w_uv.at(n, v, l);
  r.q_scale = w.q_scale;
  r.k_scale = w.k_scale;
  return r;
}

}  // namespace mla::ref
