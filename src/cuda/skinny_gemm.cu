// y [S, n] = x [S, k] @ w [n, k]^T for S <= 4 tokens (bf16 in, fp32 accumulation, bf16 out): the
// decode-time shape of pre's projections, where the product is a stream over the weights. cuBLASLt
// reached about 1 TB/s on it (qkv_a, S = 1, H200); here every warp streams one weight row with
// 16-byte loads, 8 in flight per lane, and the tokens' x rows come from L1.
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda {
namespace {

constexpr int kSkinnyWarps = 8;  // one weight row a warp

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

template <int kTokens>
__global__ void __launch_bounds__(kSkinnyWarps * 32) skinny_gemm_kernel(const __grid_constant__ SkinnyGemmParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kSkinnyWarps + warp;
  if (row >= p.n) return;
  const uint4* w = reinterpret_cast<const uint4*>(p.w + int64_t(row) * p.k);
  const int k8 = p.k / 8;
  float acc[kTokens] = {};
#pragma unroll 8
  for (int i = lane; i < k8; i += 32) {
    float wf[8];
    bf16x8_to_float(__ldg(w + i), wf);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      float xf[8];
      bf16x8_to_float(*reinterpret_cast<const uint4*>(p.x + t * p.ldx + int64_t(i) * 8), xf);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[t] += wf[e] * xf[e];
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float v = acc[t];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == t) p.y[t * p.ldy + row] = float_to_bf16(v);
  }
}

}  // namespace

bool skinny_gemm_applies(int s, int k, int64_t ldx) { return s >= 1 && s <= kSkinnyMaxTokens && k % 8 == 0 && ldx % 8 == 0; }

void launch_skinny_gemm(const SkinnyGemmParams& p, cudaStream_t stream) {
  MLA_REQUIRE(skinny_gemm_applies(p.s, p.k, p.ldx), "skinny GEMM: S = ", p.s, " (1..", kSkinnyMaxTokens,
              "), k = ", p.k, " and ldx = ", p.ldx, " (multiples of 8) expected");
  const dim3 grid(unsigned((p.n + kSkinnyWarps - 1) / kSkinnyWarps));
  switch (p.s) {
    case 1: skinny_gemm_kernel<1><<<grid, kSkinnyWarps * 32, 0, stream>>>(p); break;
    case 2: skinny_gemm_kernel<2><<<grid, kSkinnyWarps * 32, 0, stream>>>(p); break;
    case 3: skinny_gemm_kernel<3><<<grid, kSkinnyWarps * 32, 0, stream>>>(p); break;
    default: skinny_gemm_kernel<4><<<grid, kSkinnyWarps * 32, 0, stream>>>(p); break;
  }
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
