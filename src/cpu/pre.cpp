// The CPU pre stage (SPEC.md pre, steps 1-7 and 9 at this rank): hidden -> [q_a | kv_a | k_pe |
// gate] in one dense product (cpu/gemm.hpp), the two RMSNorms, q_b, RoPE, the absorbed W_UK
// product (MXFP4), the query written through the output view's strides, this step's cache rows,
// and the sigmoid gate.
// Rounding points (project decisions): y, the normed q_c / kv_c, q and the rotated parts are bf16;
// ql_nope is fp32-accumulated and rounded once into the query's format.
#include <omp.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/dcp.hpp"
#include "core/rope.hpp"
#include "cpu/gemm.hpp"
#include "cpu/mxfp4.hpp"
#include "cpu/stages.hpp"
#include "mla/formats.hpp"

namespace mla::cpu {

namespace {

constexpr int64_t kParallelTokens = 32;  // row-local loops over fewer tokens run on one thread

// Stores v into an fp8 (v / scale) or bf16 element.
inline void store(void* base, DType dt, int64_t offset, float v, float scale) {
  if (dt == DType::fp8_e4m3) {
    static_cast<uint8_t*>(base)[offset] = float_to_fp8e4m3(v / scale);
  } else {
    static_cast<uint16_t*>(base)[offset] = float_to_bf16(v);
  }
}

// rmsnorm(x) * weight in fp32, rounded to bf16, in place.
void rmsnorm_bf16(float* x, int n, const float* weight, double eps) {
  float sum_sq = 0.0f;
  for (int i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  const float inv_rms = 1.0f / std::sqrt(sum_sq / float(n) + float(eps));
  for (int i = 0; i < n; ++i) x[i] = round_bf16(x[i] * inv_rms * weight[i]);
}

// Rotates pairs (x[2i], x[2i+1]) of a bf16-valued vector by the token's angles; bf16 result.
void rotate_bf16(float* x, int pairs, const float* cos, const float* sin) {
  for (int i = 0; i < pairs; ++i) {
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = round_bf16(x0 * cos[i] - x1 * sin[i]);
    x[2 * i + 1] = round_bf16(x0 * sin[i] + x1 * cos[i]);
  }
}

}  // namespace

void pre(const Context& ctx, const TensorView& hidden, const StepMeta& meta, const KVCache& cache,
         const PreOutputs& out) {
  const LayerConfig& cfg = ctx.cfg;
  const PreparedWeights& w = ctx.w;
  const int64_t S = meta.tokens();
  if (S == 0) return;
  const int D = cfg.hidden, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank, R = cfg.qk_rope_dim;
  const int P = cfg.qk_nope_dim, N = cfg.heads(), H = cfg.qk_head_dim(), gate_dim = cfg.gate_dim();
  const int rows = cfg.qkv_a_rows();
  const int threads = ctx.threads;

  std::unique_ptr<DenseWeights> own_dense;
  const DenseWeights* dense = ctx.dense;
  if (!dense) {
    own_dense = std::make_unique<DenseWeights>(DenseWeights::from(cfg, w, threads));
    dense = own_dense.get();
  }

  // Per-token metadata: position (for RoPE) and slot.
  std::vector<int64_t> position(S), slot(S);
  {
    const auto* seq_lens = meta.seq_lens.ptr<const int32_t>();
    const auto* slots = meta.slot_mapping.ptr<const int64_t>();
    for (int64_t s = 0; s < S; ++s) {
      const int64_t b = s / meta.qlen, i = s % meta.qlen;
      position[s] = rope::token_position(seq_lens[b * meta.seq_lens.stride[0]], meta.qlen, int(i));
      slot[s] = slots[s * meta.slot_mapping.stride[0]];
    }
  }

  // The row-local steps are microseconds at decode sizes: parallel only for large S, so that a
  // step does not pay a barrier per step (costly on a busy machine: a spinning waiter).
  const bool par_tokens = S >= kParallelTokens;

  // 1. y = hidden @ qkv_a^T, fp32 accumulation, bf16 result: [q_c | kv_c | k_pe | gate_logits].
  std::vector<float> x(S * D), y(S * rows);
  const auto* hid = hidden.ptr<const uint16_t>();
#pragma omp parallel for num_threads(threads) schedule(static) if (par_tokens)
  for (int64_t s = 0; s < S; ++s)
    for (int d = 0; d < D; ++d) x[s * D + d] = bf16_to_float(hid[s * hidden.stride[0] + d * hidden.stride[1]]);
  dense->qkv_a.multiply(x.data(), D, S, y.data(), rows, threads);

  // 2. the RMSNorms; 4 (k_pe) RoPE. One token per iteration: every step is row-local.
  const rope::RopeTable table = rope::make_table(cfg);
  const int pairs = R / 2;
  std::vector<float> cos(S * pairs), sin(S * pairs);
#pragma omp parallel for num_threads(threads) schedule(static) if (par_tokens)
  for (int64_t s = 0; s < S; ++s) {
    float* ys = &y[s * rows];
    for (int j = 0; j < rows; ++j) ys[j] = round_bf16(ys[j]);
    rmsnorm_bf16(ys, Rq, w.q_a_norm.data(), cfg.rms_eps);
    rmsnorm_bf16(ys + Rq, L, w.kv_a_norm.data(), cfg.rms_eps);
    if (table.enabled) {
      for (int i = 0; i < pairs; ++i) {
        double c, sn;
        rope::cos_sin(table, position[s], i, c, sn);
        cos[s * pairs + i] = float(c);
        sin[s * pairs + i] = float(sn);
      }
      rotate_bf16(ys + Rq + L, pairs, &cos[s * pairs], &sin[s * pairs]);
    }
  }

  // 3. q = q_c @ q_b^T, bf16, viewed [S, N, P+R]; 4. RoPE of q_pe.
  std::vector<float> q(S * N * H);
  dense->q_b.multiply(y.data(), rows, S, q.data(), int64_t(N) * H, threads);
#pragma omp parallel for num_threads(threads) schedule(static) if (par_tokens)
  for (int64_t s = 0; s < S; ++s) {
    for (int n = 0; n < N; ++n) {
      float* qh = &q[(s * N + n) * H];
      for (int j = 0; j < H; ++j) qh[j] = round_bf16(qh[j]);
      if (table.enabled) rotate_bf16(qh + P, pairs, &cos[s * pairs], &sin[s * pairs]);
    }
  }

  // 5-6. ql_nope[s, n, l] = q_nope[s, n, :] . W_UK[n][:, l] into the query view at this rank's
  // heads, then the q_pe columns. Each W_UK row (n, l) is decoded once for all S tokens.
  const TensorView& qv = out.q;
  const int head0 = ctx.opts.dcp.rank * N;
  const float q_scale = w.q_scale;
  const int64_t uk_row_bytes = P / 2, uk_row_scales = P / kMxBlock;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> dots(S);
#pragma omp for schedule(dynamic, 64) nowait  // the q_pe loop below writes other columns
    for (int64_t r = 0; r < int64_t(N) * L; ++r) {
      const int n = int(r / L), l = int(r % L);
      mxfp4_row_dots(&w.w_uk.codes[r * uk_row_bytes], &w.w_uk.scales[r * uk_row_scales], P, &q[n * H],
                     int64_t(N) * H, int(S), dots.data(), 1);
      for (int64_t s = 0; s < S; ++s)
        store(qv.data, qv.dtype, s * qv.stride[0] + (head0 + n) * qv.stride[1] + l * qv.stride[2], dots[s], q_scale);
    }
#pragma omp for schedule(static)
    for (int64_t sn = 0; sn < S * N; ++sn) {
      const int64_t s = sn / N, n = sn % N;
      const float* q_pe = &q[sn * H + P];
      for (int j = 0; j < R; ++j)
        store(qv.data, qv.dtype, s * qv.stride[0] + (head0 + n) * qv.stride[1] + (L + j) * qv.stride[2], q_pe[j],
              q_scale);
    }
  }

  // 7. cache rows [kv_c | k_pe] of the tokens with a slot here; nothing else in the cache changes.
  const TensorView& pages = cache.pages;
  const int page_size = cache.page_size();
  const float k_scale = w.k_scale;
#pragma omp parallel for num_threads(threads) schedule(static) if (par_tokens)
  for (int64_t s = 0; s < S; ++s) {
    if (slot[s] < 0) continue;
    const int64_t row = (slot[s] / page_size) * pages.stride[0] + (slot[s] % page_size) * pages.stride[1];
    const float* kv_row = &y[s * rows + Rq];  // [kv_c | k_pe] are adjacent in y
    for (int c = 0; c < L + R; ++c) store(pages.data, pages.dtype, row + c * pages.stride[2], kv_row[c], k_scale);
  }

  // 8. W > 1: the query gather along heads, in place (core/dcp.cpp, shared with the CUDA backend).
  detail::gather_query(cfg, ctx.opts, qv, nullptr);

  // 9. gate = sigmoid(gate_logits), bf16.
  if (gate_dim > 0) {
    const TensorView& g = out.gate;
    auto* gate = g.ptr<uint16_t>();
#pragma omp parallel for num_threads(threads) schedule(static) if (par_tokens)
    for (int64_t s = 0; s < S; ++s) {
      const float* logits = &y[s * rows + Rq + L + R];
      for (int j = 0; j < gate_dim; ++j)
        gate[s * g.stride[0] + j * g.stride[1]] = float_to_bf16(1.0f / (1.0f + std::exp(-logits[j])));
    }
  }
}

}  // namespace mla::cpu
