// post on the GPU (SPEC.md post): the merge of split partials (core/softmax_state.hpp, the same
// code as the CPU's merge and the DCP combine), then out = (o @ W_UV^T) * gate with W_UV in MXFP4
// dequantized in registers, bf16 out. One CTA per (head, 32 value rows, 8 tokens): each W_UV row
// is decoded once for the 8 tokens.
#include "core/softmax_state.hpp"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda {
namespace {

constexpr int kPostThreads = 128;
constexpr int kPostTokens = 8;     // tokens sharing each decoded W_UV row
constexpr int kPostRows = 32;      // W_UV rows (v) a CTA: 8 a warp
constexpr int kMaxPartials = 512;  // splits (x DCP ranks) the merge weights hold in shared memory

// grid (N, ceil(V/32), ceil(S/8)). At small S the kernel is latency-bound, so every phase issues
// its loads before it uses them: the partials' lse, then their o rows, then all 8 W_UV rows of a
// warp, each as one batch.
__global__ void __launch_bounds__(kPostThreads) post_kernel(const __grid_constant__ PostParams p) {
  __shared__ __align__(16) float o[kPostTokens][kLatent];
  __shared__ float weight[kPostTokens][kMaxPartials];
  const int n = blockIdx.x, h = p.head_offset + n;
  const int v0 = blockIdx.y * kPostRows;
  const int64_t s0 = int64_t(blockIdx.z) * kPostTokens;
  const int tokens = int(min(int64_t(kPostTokens), int64_t(p.tokens) - s0));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // 1. Merge weights exp(lse_c - lse) of every partial (core/softmax_state.hpp's merge_weight:
  //    exactly 0 for an empty partial; all empty: lse = -inf and every weight 0). A warp a token.
  for (int t = warp; t < tokens; t += kPostThreads / 32) {
    const float* lse = p.lse + (s0 + t) * p.lse_s_stride + int64_t(h) * p.lse_h_stride;
    float m = -INFINITY;
    for (int c = lane; c < p.splits; c += 32) m = fmaxf(m, lse[c * p.lse_split_stride]);
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float sum = 0.0f;
    for (int c = lane; c < p.splits; c += 32) sum += merge_weight(lse[c * p.lse_split_stride], m);
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float total = m == -INFINITY ? -INFINITY : m + logf(sum);
    for (int c = lane; c < p.splits; c += 32) weight[t][c] = merge_weight(lse[c * p.lse_split_stride], total);
  }
  __syncthreads();

  // 2. Merged o: thread tid owns latent dims 4*tid .. 4*tid+3 of each token. The o of a partial
  //    with weight 0 is loaded but never used (it may hold anything, NaN included).
  for (int t = 0; t < kPostTokens; ++t) {
    float4 merged = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < tokens) {
      const int64_t base = (s0 + t) * p.o_s_stride + int64_t(h) * p.o_h_stride + 4 * tid;
#pragma unroll 4
      for (int c = 0; c < p.splits; ++c) {
        const int64_t off = base + c * p.o_split_stride;
        float4 x;
        if (p.o_bf16) {
          const uint16_t* src = static_cast<const uint16_t*>(p.o) + off;
          x = make_float4(bf16_to_float(src[0]), bf16_to_float(src[1]), bf16_to_float(src[2]), bf16_to_float(src[3]));
        } else {
          const float* src = static_cast<const float*>(p.o) + off;
          x = make_float4(src[0], src[1], src[2], src[3]);
        }
        const float w = weight[t][c];
        if (w != 0.0f) {
          merged.x += w * x.x;
          merged.y += w * x.y;
          merged.z += w * x.z;
          merged.w += w * x.w;
        }
      }
    }
    *reinterpret_cast<float4*>(&o[t][4 * tid]) = merged;
  }
  __syncthreads();

  // 3. out[s, n*V + v] for this warp's 8 rows; lane owns latent dims 8*lane + 256*k + e.
  constexpr int kRowBytes = kLatent / 2, kRowScales = kLatent / 32, kWarpRows = kPostRows / (kPostThreads / 32);
  const int vw = v0 + warp * kWarpRows;
  uint32_t words[kWarpRows][2];
  uint32_t scale_bits[kWarpRows][2];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const int64_t row = int64_t(n) * p.v_dim + min(vw + r, p.v_dim - 1);
    const uint32_t* codes = reinterpret_cast<const uint32_t*>(p.w_codes + row * kRowBytes);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      words[r][k] = codes[lane + 32 * k];
      scale_bits[r][k] = p.w_scales[row * kRowScales + lane / 4 + 8 * k];
    }
  }
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    if (vw + r >= p.v_dim) break;
    float acc[kPostTokens] = {};
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float scale = e8m0_to_float(scale_bits[r][k]);
      float w[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) w[e] = e2m1_to_float(words[r][k] >> (4 * e)) * scale;
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
      const int col = n * p.v_dim + vw + r;
      if (p.gate) mine *= bf16_to_float(p.gate[s * p.gate_stride + col]);
      p.out[s * p.out_stride + col] = float_to_bf16(mine);
    }
  }
}

}  // namespace

void launch_post(const PostParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  MLA_REQUIRE(p.splits <= kMaxPartials, "CUDA post: at most ", kMaxPartials, " partials (splits x DCP ranks), got ",
              p.splits);
  const dim3 grid(unsigned(p.heads), unsigned((p.v_dim + kPostRows - 1) / kPostRows),
                  unsigned((p.tokens + kPostTokens - 1) / kPostTokens));
  post_kernel<<<grid, kPostThreads, 0, stream>>>(p);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
