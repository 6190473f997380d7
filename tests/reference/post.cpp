// The float64 reference of post from merged attention (SPEC.md post, step 2):
// out[s, n*V + v] = (sum_l o[s, n, l] * W_UV[n][v, l]) * gate[s, n*V + v].
#include "mla/error.hpp"
#include "reference/reference.hpp"

namespace mla::ref {

std::vector<double> post(const LayerConfig& cfg, const Weights64& w, const AttendResult& attn,
                         std::span<const double> gate, int dcp_rank, int dcp_size) {
  const int N = cfg.heads(), L = cfg.kv_lora_rank, V = cfg.v_head_dim, G = N * dcp_size;
  const size_t S = attn.o.size() / (size_t(G) * L);
  MLA_REQUIRE(attn.o.size() == S * G * L, "ref::post: o has ", attn.o.size(), " values, not a multiple of G*L = ",
              G * L);
  MLA_REQUIRE(gate.empty() || gate.size() == S * N * V, "ref::post: gate has ", gate.size(), " values, expected ",
              S * N * V);
  std::vector<double> out(S * N * V);
  for (size_t s = 0; s < S; ++s) {
    for (int n = 0; n < N; ++n) {
      const double* o = &attn.o[(s * G + dcp_rank * N + n) * L];  // this rank's head n
      for (int v = 0; v < V; ++v) {
        double acc = 0;
        for (int l = 0; l < L; ++l) acc += o[l] * w.w_uv[(size_t(n) * V + v) * L + l];
        const size_t j = s * N * V + size_t(n) * V + v;
        out[j] = gate.empty() ? acc : acc * gate[j];
      }
    }
  }
  return out;
}

}  // namespace mla::ref
