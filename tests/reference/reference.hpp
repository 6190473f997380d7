#pragma once
// The float64 reference of SPEC.md, written to be read, not to be fast. Per stage from the same
// stage inputs (pre.cpp, attend.cpp, post.cpp), and end to end in the unabsorbed form
// (end_to_end.cpp). All views are host views; results are contiguous float64.
#include <cstdint>
#include <span>
#include <vector>

#include "mla/layer.hpp"

namespace mla::ref {

// The prepared weights in float64 (MXFP4 dequantized: the values the backends multiply by).
struct Weights64 {
  std::vector<double> qkv_a;      // [Rq + L + R + gate_dim, D]
  std::vector<double> q_a_norm;   // [Rq]
  std::vector<double> kv_a_norm;  // [L]
  std::vector<double> q_b;        // [N*(P+R), Rq]
  std::vector<double> w_uk;       // [N, P, L]  (W_UK[n] as in SPEC.md)
  std::vector<double> w_uv;       // [N, V, L]
  double q_scale = 1, k_scale = 1;
};
Weights64 dequantize(const LayerConfig& cfg, const PreparedWeights& w);

// pre, before any rounding of its outputs to bf16 / fp8. Inside, float64 math rounded to bf16 at
// the project's rounding points (y, the normed q_c / kv_c, q, the rotated q_pe / k_pe), so that a
// backend's fp8 outputs match the reference rounded to fp8 bin for bin (tests/reference/pre.cpp).
struct PreResult {
  std::vector<double> q;       // [S, N, L+R]: [ql_nope | q_pe] (q_pe rotated where the model has RoPE)
  std::vector<double> gate;    // [S, N*V] sigmoid(gate_logits); empty without a gate
  std::vector<double> kv_row;  // [S, L+R]: [kv_c | k_pe], the row each token writes to the cache
};
PreResult pre(const LayerConfig& cfg, const Weights64& w, const TensorView& hidden, const StepMeta& meta);

// attend over the paged cache (dequantized with k_scale) for the first G heads of q (dequantized
// with q_scale when fp8). dcp maps local cache indices to global positions for the causal mask.
struct AttendResult {
  std::vector<double> o;    // [S, G, L]
  std::vector<double> lse;  // [S, G], -inf where no key is visible
};
AttendResult attend(const LayerConfig& cfg, const TensorView& q, int heads_g, double q_scale,
                    const KVCache& cache, double k_scale, const StepMeta& meta, const DcpInfo& dcp);

// The split-KV partials of attend, one per chunk: chunk c of a request with local length n covers
// the local keys [c*ceil(n/splits), min(n, (c+1)*ceil(n/splits))), each a normalized partial.
std::vector<AttendResult> attend_splits(const LayerConfig& cfg, const TensorView& q, int heads_g,
                                        double q_scale, const KVCache& cache, double k_scale,
                                        const StepMeta& meta, const DcpInfo& dcp, int splits);

// Merge of partials (split chunks or DCP ranks): lse = logsumexp, o = sum exp(lse_c - lse) o_c.
AttendResult merge(std::span<const AttendResult> partials);

// post from merged attention: out [S, N*V] = (o @ W_UV^T) * gate. o is [S, G, L] with
// G = N*dcp_size; this rank's heads are those at dcp_rank*N.
std::vector<double> post(const LayerConfig& cfg, const Weights64& w, const AttendResult& attn,
                         std::span<const double> gate, int dcp_rank, int dcp_size = 1);

// End to end, hidden -> out, unabsorbed (per head k_nope = W_UK applied to the cached latent,
// v = W_UV applied to it, plain multi-head attention), float64 everywhere: the history rows are
// read from the cache dequantized, this step's rows are computed here, no fp8/bf16 rounding.
// W = 1 only: the cache holds every position.
std::vector<double> end_to_end(const LayerConfig& cfg, const Weights64& w, const TensorView& hidden,
                               const KVCache& cache, const StepMeta& meta);

}  // namespace mla::ref
