// The CPU post stage (SPEC.md post at this rank): split partials merged (softmax_state.hpp), then
// out[s, n*V + v] = sum_l o[s, n, l] * W_UV[n][v, l] by hand from MXFP4, times the gate, -> bf16.
// W > 1: the cross-rank partials of this rank's heads are exchanged first (core/dcp.cpp) and merged
// with the split partials in one merge; at W = 1 this rank's N heads sit at dcp.rank*N of o's G.
#include <vector>

#include "core/dcp.hpp"
#include "core/softmax_state.hpp"
#include "cpu/mxfp4.hpp"
#include "cpu/stages.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"

namespace mla::cpu {

void post(const Context& ctx, const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta,
          const TensorView& out) {
  const LayerConfig& cfg = ctx.cfg;
  const int64_t S = meta.tokens();
  if (S == 0) return;
  const int N = cfg.heads(), L = cfg.kv_lora_rank, V = cfg.v_head_dim;
  const int threads = ctx.threads;
  // W > 1, the combine (SPEC.md post 1): every rank's partials of this rank's N heads are
  // exchanged into [W*splits, S, N, L] (core/dcp.cpp) and merged below with the split partials.
  Tensor mine_o, mine_lse;
  if (ctx.opts.dcp.size > 1) {
    mine_o = Tensor::empty(attn.o.dtype, detail::exchanged_o_shape(cfg, ctx.opts, attn.o));
    mine_lse = Tensor::empty(DType::f32, detail::exchanged_lse_shape(cfg, ctx.opts, attn.o));
    detail::exchange_partials(cfg, ctx.opts, attn, {.o = mine_o.view(), .lse = mine_lse.view()}, nullptr);
  }
  const bool exchanged = ctx.opts.dcp.size > 1;
  const int head0 = exchanged ? 0 : ctx.opts.dcp.rank * N;
  const TensorView& o = exchanged ? mine_o.view() : attn.o;
  const TensorView& lse = exchanged ? mine_lse.view() : attn.lse;
  const bool split = o.rank == 4;
  const int d = split ? 1 : 0;  // o's token dimension
  MLA_REQUIRE(o.stride[o.rank - 1] == 1, "post: attn.o must be contiguous along L (stride 1), got ", o.str());
  MLA_REQUIRE(o.dtype == DType::f32 || o.dtype == DType::bf16, "post: attn.o must be f32 or bf16, got ", o.str());

  // This rank's heads of o as fp32 [S, N, L], split partials merged.
  // Microseconds at decode sizes: parallel only for many tokens (a barrier costs more).
  std::vector<float> om(S * N * L);
#pragma omp parallel for num_threads(threads) schedule(static) if (S >= 32)
  for (int64_t sn = 0; sn < S * N; ++sn) {
    const int64_t s = sn / N, h = head0 + sn % N;
    float* dst = &om[sn * L];
    const int64_t o_off = s * o.stride[d] + h * o.stride[d + 1];
    if (split) {
      const int splits = int(o.shape[0]);
      const float* lse_c = lse.ptr<const float>() + s * lse.stride[1] + h * lse.stride[2];
      if (o.dtype == DType::f32) {
        merge_partials(splits, lse_c, lse.stride[0], o.ptr<const float>() + o_off, o.stride[0], L, dst);
      } else {
        merge_partials(splits, lse_c, lse.stride[0], o.ptr<const uint16_t>() + o_off, o.stride[0], L, dst,
                       [](uint16_t b) { return bf16_to_float(b); });
      }
    } else if (o.dtype == DType::f32) {
      const float* src = o.ptr<const float>() + o_off;
      for (int l = 0; l < L; ++l) dst[l] = src[l];
    } else {
      const uint16_t* src = o.ptr<const uint16_t>() + o_off;
      for (int l = 0; l < L; ++l) dst[l] = bf16_to_float(src[l]);
    }
  }

  // Each W_UV row (n, v) is decoded once and multiplied into all S tokens' o[s, n, :].
  const MxFp4Matrix& w_uv = ctx.w.w_uv;
  const int64_t row_bytes = L / 2, row_scales = L / kMxBlock;
  const bool gated = cfg.gate_dim() > 0;
  auto* dst = out.ptr<uint16_t>();
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> dots(S);
#pragma omp for schedule(dynamic, 16)  // dynamic: see matmul_nt
    for (int64_t r = 0; r < int64_t(N) * V; ++r) {
      const int64_t n = r / V;
      mxfp4_row_dots(&w_uv.codes[r * row_bytes], &w_uv.scales[r * row_scales], L, &om[n * L], int64_t(N) * L,
                     int(S), dots.data(), 1);
      for (int64_t s = 0; s < S; ++s) {
        float v = dots[s];
        if (gated) v *= bf16_to_float(gate.ptr<const uint16_t>()[s * gate.stride[0] + r * gate.stride[1]]);
        dst[s * out.stride[0] + r * out.stride[1]] = float_to_bf16(v);
      }
    }
  }
}

}  // namespace mla::cpu
