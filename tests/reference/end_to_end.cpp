// ref::end_to_end: hidden -> out in float64, in the unabsorbed form of plain multi-head attention.
// Per head, every key is expanded from the cached latent: k_nope = W_UK[n] kv_c, v = W_UV[n] kv_c,
// scored against the un-absorbed q_nope, so a wrong head order, a missing scale or a broken
// absorption in the backends (which never form k_nope or v) shows up here. No fp8 or bf16
// rounding anywhere: this step's rows come from the float64 pre chain, not from the cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/rope.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "reference/reference.hpp"

namespace mla::ref {
namespace {

// Element (r, c) of a rank-2 host view of bf16 or f32, through its strides.
double element2(const TensorView& t, int64_t r, int64_t c) {
  const int64_t off = r * t.stride[0] + c * t.stride[1];
  if (t.dtype == DType::bf16) return bf16_to_float(t.ptr<const uint16_t>()[off]);
  if (t.dtype == DType::f32) return t.ptr<const float>()[off];
  detail::fail("ref::end_to_end: hidden: expected bf16 or f32, got ", dtype_name(t.dtype));
}

// Column c of cache row `offset` of page `page`, dequantized.
double cache_at(const KVCache& cache, int64_t page, int64_t offset, int64_t c, double k_scale) {
  const TensorView& p = cache.pages;
  const int64_t off = page * p.stride[0] + offset * p.stride[1] + c * p.stride[2];
  if (p.dtype == DType::fp8_e4m3) return fp8e4m3_to_float(p.ptr<const uint8_t>()[off]) * k_scale;
  return bf16_to_float(p.ptr<const uint16_t>()[off]);
}

// x <- rmsnorm(x) * w, in place.
void rmsnorm(double* x, const double* w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
}

// Interleaved pairs (x[2i], x[2i+1]) turned by position * inv_freq[i].
void rotate(const rope::RopeTable& t, double* x, int rope_dim, int64_t position) {
  if (!t.enabled) return;
  for (int i = 0; i < rope_dim / 2; ++i) {
    double c, s;
    rope::cos_sin(t, position, i, c, s);
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

}  // namespace

std::vector<double> end_to_end(const LayerConfig& cfg, const Weights64& w, const TensorView& hidden,
                               const KVCache& cache, const StepMeta& meta) {
  const int B = meta.batch(), Q = meta.qlen, S = B * Q;
  const int D = cfg.hidden, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank, R = cfg.qk_rope_dim;
  const int P = cfg.qk_nope_dim, V = cfg.v_head_dim, N = cfg.heads(), E = cfg.qk_head_dim();
  const int G = cfg.gate_dim(), rows = cfg.qkv_a_rows();
  MLA_REQUIRE(hidden.rank == 2 && hidden.shape[0] == S && hidden.shape[1] == D,
              "ref::end_to_end: hidden: expected [", S, ", ", D, "], got ", hidden.str());
  const auto* seq_lens = meta.seq_lens.ptr<const int32_t>();
  const auto* indptr = meta.kv_indptr.ptr<const int32_t>();
  const auto* indices = meta.kv_indices.ptr<const int32_t>();
  const int page_size = cache.page_size();
  const rope::RopeTable rope_table = rope::make_table(cfg);

  // 1. This step's tokens, float64 from hidden: q_nope, q_pe (rotated), the latent row
  //    [kv_c | k_pe] (k_pe rotated) and the gate.
  std::vector<double> q(size_t(S) * N * E), row(size_t(S) * (L + R)), gate(size_t(S) * G);
#pragma omp parallel for schedule(dynamic)
  for (int s = 0; s < S; ++s) {
    std::vector<double> y(rows), x(D);
    for (int d = 0; d < D; ++d) x[d] = element2(hidden, s, d);
    for (int r = 0; r < rows; ++r) {
      const double* wr = &w.qkv_a[size_t(r) * D];
      double acc = 0;
      for (int d = 0; d < D; ++d) acc += wr[d] * x[d];
      y[r] = acc;
    }
    const int64_t position = rope::token_position(seq_lens[s / Q], Q, s % Q);
    double* q_c = y.data();
    rmsnorm(q_c, w.q_a_norm.data(), Rq, cfg.rms_eps);
    double* kv = &row[size_t(s) * (L + R)];
    std::copy(y.begin() + Rq, y.begin() + Rq + L + R, kv);
    rmsnorm(kv, w.kv_a_norm.data(), L, cfg.rms_eps);
    rotate(rope_table, kv + L, R, position);
    for (int j = 0; j < N * E; ++j) {
      const double* wr = &w.q_b[size_t(j) * Rq];
      double acc = 0;
      for (int k = 0; k < Rq; ++k) acc += wr[k] * q_c[k];
      q[size_t(s) * N * E + j] = acc;
    }
    for (int n = 0; n < N; ++n) rotate(rope_table, &q[(size_t(s) * N + n) * E + P], R, position);
    for (int j = 0; j < G; ++j) gate[size_t(s) * G + j] = 1.0 / (1.0 + std::exp(-y[Rq + L + R + j]));
  }

  // W_UK and W_UV transposed to [N, L, P] / [N, L, V], so expanding a key is a sum of rows.
  std::vector<double> w_uk_t(size_t(N) * L * P), w_uv_t(size_t(N) * L * V);
  for (int n = 0; n < N; ++n)
    for (int l = 0; l < L; ++l) {
      for (int p = 0; p < P; ++p) w_uk_t[(size_t(n) * L + l) * P + p] = w.w_uk[(size_t(n) * P + p) * L + l];
      for (int v = 0; v < V; ++v) w_uv_t[(size_t(n) * L + l) * V + v] = w.w_uv[(size_t(n) * V + v) * L + l];
    }

  // 2. Per request and head: expand every key, then causal softmax attention for each query.
  std::vector<double> out(size_t(S) * N * V, 0.0);
  const double sm_scale = cfg.sm_scale();
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < B; ++b) {
    for (int n = 0; n < N; ++n) {
      const int len = seq_lens[b];
      if (len <= 0) continue;  // padding request: out stays 0
      const int history = len - Q;
      std::vector<double> latent(L + R), k_nope(size_t(len) * P), k_pe(size_t(len) * R), v(size_t(len) * V);
      for (int j = 0; j < len; ++j) {
        if (j < history) {  // from the cache, dequantized
          const int64_t page = indices[indptr[b] + j / page_size];
          for (int c = 0; c < L + R; ++c) latent[c] = cache_at(cache, page, j % page_size, c, w.k_scale);
        } else {  // this step's token, never rounded
          std::copy_n(&row[size_t(b * Q + j - history) * (L + R)], L + R, latent.begin());
        }
        double* kn = &k_nope[size_t(j) * P];
        double* vv = &v[size_t(j) * V];
        std::fill_n(kn, P, 0.0);
        std::fill_n(vv, V, 0.0);
        for (int l = 0; l < L; ++l) {
          const double a = latent[l];
          const double* uk = &w_uk_t[(size_t(n) * L + l) * P];
          const double* uv = &w_uv_t[(size_t(n) * L + l) * V];
          for (int p = 0; p < P; ++p) kn[p] += a * uk[p];
          for (int c = 0; c < V; ++c) vv[c] += a * uv[c];
        }
        std::copy_n(latent.begin() + L, R, &k_pe[size_t(j) * R]);
      }
      std::vector<double> score(len);
      for (int i = 0; i < Q; ++i) {
        const int s = b * Q + i;
        const double* qn = &q[(size_t(s) * N + n) * E];
        const int visible = history + i + 1;  // positions 0 .. len - Q + i
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < visible; ++j) {
          double dot = 0;
          for (int p = 0; p < P; ++p) dot += qn[p] * k_nope[size_t(j) * P + p];
          for (int r = 0; r < R; ++r) dot += qn[P + r] * k_pe[size_t(j) * R + r];
          score[j] = sm_scale * dot;
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int j = 0; j < visible; ++j) sum += (score[j] = std::exp(score[j] - mx));
        double* o = &out[(size_t(s) * N + n) * V];
        for (int j = 0; j < visible; ++j)
          for (int c = 0; c < V; ++c) o[c] += score[j] / sum * v[size_t(j) * V + c];
        if (G > 0)
          for (int c = 0; c < V; ++c) o[c] *= gate[size_t(s) * G + n * V + c];
      }
    }
  }
  return out;
}

}  // namespace mla::ref
