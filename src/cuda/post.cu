// post on the GPU (SPEC.md post): the merge of split partials (core/softmax_state.hpp, the same
// code as the CPU's merge and the DCP combine), then out = (o @ W_UV^T) * gate with W_UV in MXFP4
// dequantized in registers, bf16 out. One CTA per (head, 8 tokens): each W_UV row is decoded once
// for the 8 tokens; at small S the kernel is memory-bound on W_UV and on the partials.
#include "core/softmax_state.hpp"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda {
namespace {

constexpr int kPostThreads = 128;
constexpr int kPostTokens = 8;

__device__ __forceinline__ float load_o(const PostParams& p, int64_t off) {
  return p.o_bf16 ? bf16_to_float(static_cast<const uint16_t*>(p.o)[off]) : static_cast<const float*>(p.o)[off];
}

__global__ void __launch_bounds__(kPostThreads) post_kernel(const __grid_constant__ PostParams p) {
  __shared__ __align__(16) float o[kPostTokens][kLatent];
  const int n = blockIdx.x, h = p.head_offset + n;
  const int64_t s0 = int64_t(blockIdx.y) * kPostTokens;
  const int tokens = int(min(int64_t(kPostTokens), int64_t(p.tokens) - s0));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Merge: thread tid owns latent dims 4*tid .. 4*tid+3 of each token.
  for (int t = 0; t < kPostTokens; ++t) {
    float merged[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (t < tokens) {
      const int64_t s = s0 + t;
      const float* lse = p.lse + s * p.lse_s_stride + int64_t(h) * p.lse_h_stride;
      const float total = merged_lse(p.splits, lse, p.lse_split_stride);
      const int64_t o_base = s * p.o_s_stride + int64_t(h) * p.o_h_stride + 4 * tid;
      for (int c = 0; c < p.splits; ++c) {
        const float w = merge_weight(lse[c * p.lse_split_stride], total);
        if (w == 0.0f) continue;  // empty partial: its o is never read
#pragma unroll
        for (int e = 0; e < 4; ++e) merged[e] += w * load_o(p, o_base + c * p.o_split_stride + e);
      }
    }
    *reinterpret_cast<float4*>(&o[t][4 * tid]) = make_float4(merged[0], merged[1], merged[2], merged[3]);
  }
  __syncthreads();

  // out[s, n*V + v]: warp w takes rows v = w, w+4, ...; lane owns latent dims 8*lane + 256*k + e.
  constexpr int kRowBytes = kLatent / 2, kRowScales = kLatent / 32;
  for (int v = warp; v < p.v_dim; v += kPostThreads / 32) {
    const int64_t row = int64_t(n) * p.v_dim + v;
    const uint32_t* codes = reinterpret_cast<const uint32_t*>(p.w_codes + row * kRowBytes);
    const uint8_t* scales = p.w_scales + row * kRowScales;
    float acc[kPostTokens] = {};
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t word = codes[lane + 32 * k];
      const float scale = e8m0_to_float(scales[lane / 4 + 8 * k]);
      float w[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) w[e] = e2m1_to_float(word >> (4 * e)) * scale;
      const int d = 8 * lane + 256 * k;
#pragma unroll
      for (int t = 0; t < kPostTokens; ++t) {
        const float4 a = *reinterpret_cast<const float4*>(&o[t][d]);
        const float4 b = *reinterpret_cast<const float4*>(&o[t][d + 4]);
        acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
      }
    }
#pragma unroll
    for (int t = 0; t < kPostTokens; ++t)
      for (int off = 16; off > 0; off >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
    if (lane < tokens) {
      float mine = acc[0];
#pragma unroll
      for (int t = 1; t < kPostTokens; ++t)
        if (lane == t) mine = acc[t];
      const int64_t s = s0 + lane;
      const int col = n * p.v_dim + v;
      if (p.gate) mine *= bf16_to_float(p.gate[s * p.gate_stride + col]);
      p.out[s * p.out_stride + col] = float_to_bf16(mine);
    }
  }
}

}  // namespace

void launch_post(const PostParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const dim3 grid(unsigned(p.heads), unsigned((p.tokens + kPostTokens - 1) / kPostTokens));
  post_kernel<<<grid, kPostThreads, 0, stream>>>(p);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
