// The float64 reference of pre (SPEC.md pre, steps 1-7 and 9 at W = 1), written to be read: one
// token at a time, plain loops. The math is float64, but the values are rounded to bf16 at the
// points where the project's backends store bf16 (y, the normed q_c / kv_c, q, the rotated parts),
// so that a backend's fp8 outputs can be compared bin for bin. The YaRN frequencies are derived
// here again, independently of src/core/rope.cpp, from DeepSeek's formulas.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "mla/formats.hpp"
#include "reference/reference.hpp"

namespace mla::ref {
namespace {

double bf16(double x) { return round_bf16(float(x)); }

// RMSNorm of x [n] times weight, bf16 result.
void rmsnorm(double* x, int n, const std::vector<double>& weight, double eps) {
  double mean_sq = 0;
  for (int i = 0; i < n; ++i) mean_sq += x[i] * x[i];
  mean_sq /= n;
  for (int i = 0; i < n; ++i) x[i] = bf16(x[i] / std::sqrt(mean_sq + eps) * weight[i]);
}

// DeepSeek's YaRN: the rotary frequency of each pair, and the factor on cos and sin.
struct Yarn {
  std::vector<double> inv_freq;
  double mscale = 1;
};

Yarn yarn_frequencies(const YarnParams& y, int dim) {
  // yarn_find_correction_dim: the dim whose wavelength turns `rotations` times over the original context.
  auto correction_dim = [&](double rotations) {
    return dim * std::log(y.original_max_position / (rotations * 2 * std::numbers::pi)) / (2 * std::log(y.theta));
  };
  double low = std::floor(correction_dim(y.beta_fast)), high = std::ceil(correction_dim(y.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  Yarn out;
  for (int i = 0; i < dim / 2; ++i) {
    const double freq_extra = std::pow(y.theta, -2.0 * i / dim);
    const double freq_inter = freq_extra / y.factor;
    const double extra_mask = 1 - std::clamp((i - low) / (high - low), 0.0, 1.0);
    out.inv_freq.push_back(freq_inter * (1 - extra_mask) + freq_extra * extra_mask);
  }
  auto get_mscale = [&](double m) { return y.factor <= 1 ? 1.0 : 0.1 * m * std::log(y.factor) + 1.0; };
  out.mscale = get_mscale(y.mscale) / get_mscale(y.mscale_all_dim);
  return out;
}

// Rotates the interleaved pairs (x[2i], x[2i+1]) of x [2*pairs] by position * inv_freq[i]; bf16 result.
void rope(double* x, const Yarn& yarn, double position) {
  for (size_t i = 0; i < yarn.inv_freq.size(); ++i) {
    const double c = std::cos(position * yarn.inv_freq[i]) * yarn.mscale;
    const double s = std::sin(position * yarn.inv_freq[i]) * yarn.mscale;
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = bf16(x0 * c - x1 * s);
    x[2 * i + 1] = bf16(x0 * s + x1 * c);
  }
}

}  // namespace

PreResult pre(const LayerConfig& cfg, const Weights64& w, const TensorView& hidden, const StepMeta& meta) {
  const int D = cfg.hidden, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank, R = cfg.qk_rope_dim;
  const int P = cfg.qk_nope_dim, N = cfg.heads(), H = cfg.qk_head_dim();
  const int rows = cfg.qkv_a_rows(), gate_dim = cfg.gate_dim();
  const int S = meta.tokens(), Q = meta.qlen;
  const bool has_rope = cfg.rope == RopeType::yarn && R > 0;
  const Yarn yarn = has_rope ? yarn_frequencies(cfg.yarn, R) : Yarn{};

  PreResult res;
  res.q.assign(size_t(S) * N * (L + R), 0.0);
  res.kv_row.assign(size_t(S) * (L + R), 0.0);
  if (gate_dim > 0) res.gate.assign(size_t(S) * gate_dim, 0.0);

  for (int s = 0; s < S; ++s) {
    const int b = s / Q, i = s % Q;
    const int seq_len = meta.seq_lens.ptr<const int32_t>()[b * meta.seq_lens.stride[0]];
    // Query i of request b sits at seq_len - Q + i; an empty request's tokens are rotated at 0.
    const double position = seq_len > 0 ? seq_len - Q + i : 0;

    // 1. y = hidden @ qkv_a^T -> [q_c | kv_c | k_pe | gate_logits], bf16.
    std::vector<double> y(rows);
    for (int r = 0; r < rows; ++r) {
      double acc = 0;
      for (int d = 0; d < D; ++d)
        acc += bf16_to_float(hidden.ptr<const uint16_t>()[s * hidden.stride[0] + d * hidden.stride[1]]) *
               w.qkv_a[size_t(r) * D + d];
      y[r] = bf16(acc);
    }
    double* q_c = &y[0];
    double* kv_c = &y[Rq];
    double* k_pe = &y[Rq + L];
    const double* gate_logits = &y[Rq + L + R];

    // 2. RMSNorms.
    rmsnorm(q_c, Rq, w.q_a_norm, cfg.rms_eps);
    rmsnorm(kv_c, L, w.kv_a_norm, cfg.rms_eps);

    // 3. q = q_c @ q_b^T, per head [q_nope (P) | q_pe (R)], bf16.
    std::vector<double> q(size_t(N) * H);
    for (int j = 0; j < N * H; ++j) {
      double acc = 0;
      for (int k = 0; k < Rq; ++k) acc += q_c[k] * w.q_b[size_t(j) * Rq + k];
      q[j] = bf16(acc);
    }

    // 4. RoPE of each head's q_pe and of the shared k_pe.
    if (has_rope) {
      for (int n = 0; n < N; ++n) rope(&q[size_t(n) * H + P], yarn, position);
      rope(k_pe, yarn, position);
    }

    // 5-6. qcat[n] = [q_nope[n] @ W_UK[n] | q_pe[n]].
    for (int n = 0; n < N; ++n) {
      double* qcat = &res.q[(size_t(s) * N + n) * (L + R)];
      for (int l = 0; l < L; ++l) {
        double acc = 0;
        for (int p = 0; p < P; ++p) acc += q[size_t(n) * H + p] * w.w_uk[(size_t(n) * P + p) * L + l];
        qcat[l] = acc;
      }
      for (int r = 0; r < R; ++r) qcat[L + r] = q[size_t(n) * H + P + r];
    }

    // 7. The cache row [kv_c | k_pe].
    for (int c = 0; c < L; ++c) res.kv_row[size_t(s) * (L + R) + c] = kv_c[c];
    for (int r = 0; r < R; ++r) res.kv_row[size_t(s) * (L + R) + L + r] = k_pe[r];

    // 9. gate = sigmoid(gate_logits).
    for (int j = 0; j < gate_dim; ++j) res.gate[size_t(s) * gate_dim + j] = 1 / (1 + std::exp(-gate_logits[j]));
  }
  return res;
}

}  // namespace mla::ref
