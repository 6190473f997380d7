// y [S, n] = x [S, k] @ w [n, k]^T for S <= 4 tokens (bf16 in, fp32 accumulation, bf16 out): the
// decode-time shape of pre's projections, where the product is a stream over the weights. cuBLASLt
// reached about 1 TB/s on it (qkv_a, S = 1, H200). Every warp streams one weight row; a lane
// issues kSkinnyBatch 16-byte loads (4 KB a warp, 3-4 CTAs an SM) before it uses any, and the
// weights bypass L1 (they are read once).
//
// The tokens' x rows are staged in shared memory, zero-padded to whole batches, when they fit in
// 48 KB (kimi-k3: S <= 3 for qkv_a, every S for q_b): the inner loop then has no bounds checks and
// reads x at shared-memory latency, and the first batch of weights is already in flight while x is
// staged (cuda/pdl.cuh). Measured on the H200 (qkv_a 3648 x 7168, S = 1, L2 flushed, events): the
// first version's loop 18.4 us, this one 17.3 us; q_b (2304 x 1536) 6.9 -> 6.6 us, at the floor
// of a 7 MB copy launched alone (6.4 us). Otherwise (S = 4 at k = 7168) x comes from L1 in the
// first version's loop, unroll 8.
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/pdl.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda {
namespace {

constexpr int kSkinnyWarps = 8;         // one weight row a warp
constexpr int kSkinnyBatch = 8;         // 16-byte weight loads a lane has in flight
// CTAs an SM the staged kernel is built for: 4 (64 registers) at S <= 2; 2 above, where 64 or 80 spill
constexpr int skinny_ctas_per_sm(int tokens) { return tokens <= 2 ? 4 : 2; }
constexpr int kSkinnyChunk = 32 * kSkinnyBatch;  // 16-byte chunks of a row one batch covers
constexpr size_t kSkinnyMaxStaged = size_t(48) << 10;

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

__host__ __device__ inline int padded_chunks(int k) { return (k / 8 + kSkinnyChunk - 1) / kSkinnyChunk * kSkinnyChunk; }

// x staged in shared memory: [kTokens][padded_chunks(k)] 16-byte chunks, zeros past k.
// acc[t] += the dot product of 8 bf16 weights with token t's 8 bf16 x values (x8(t): a uint4).
template <int kTokens, class X8>
__device__ __forceinline__ void dot8(float (&acc)[kTokens], uint4 w8, X8 x8) {
  float wf[8];
  bf16x8_to_float(w8, wf);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float xf[8];
    bf16x8_to_float(x8(t), xf);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[t] += wf[e] * xf[e];
  }
}

// Each lane's partial sums over the warp; lane t stores token t's output of this row.
template <int kTokens>
__device__ __forceinline__ void store_row(const SkinnyGemmParams& p, float (&acc)[kTokens], int row, int lane) {
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float v = acc[t];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == t) p.y[t * p.ldy + row] = float_to_bf16(v);
  }
}

template <int kTokens>
__global__ void __launch_bounds__(kSkinnyWarps * 32, skinny_ctas_per_sm(kTokens))
    skinny_gemm_staged_kernel(const __grid_constant__ SkinnyGemmParams p) {
  extern __shared__ uint4 xs[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kSkinnyWarps + warp;
  const int k8 = p.k / 8, k8_padded = padded_chunks(p.k);
  const uint4* w = reinterpret_cast<const uint4*>(p.w + int64_t(min(row, p.n - 1)) * p.k);
  uint4 wv[kSkinnyBatch];
  auto load_batch = [&](int base) {
#pragma unroll
    for (int j = 0; j < kSkinnyBatch; ++j)
      wv[j] = base + 32 * j < k8 ? load_streaming(w + base + 32 * j) : make_uint4(0, 0, 0, 0);
  };
  load_batch(lane);  // the weights are constant: in flight before the wait for x
  allow_dependents();
  wait_for_prior_grids();
  for (int i = threadIdx.x; i < kTokens * k8_padded; i += blockDim.x) {
    const int t = i / k8_padded, c = i % k8_padded;
    xs[i] = c < k8 ? *reinterpret_cast<const uint4*>(p.x + t * p.ldx + int64_t(c) * 8) : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  if (row >= p.n) return;

  float acc[kTokens] = {};
  for (int base = lane; base < k8; base += kSkinnyChunk) {
    if (base != lane) load_batch(base);
#pragma unroll
    for (int j = 0; j < kSkinnyBatch; ++j) {
      // x rows staged in shared memory: zeros (with zero weights) past k.
      dot8<kTokens>(acc, wv[j], [&](int t) { return xs[t * k8_padded + base + 32 * j]; });
    }
  }
  store_row(p, acc, row, lane);
}

// x read from global memory (L1), for x rows too large to stage.
template <int kTokens>
__global__ void __launch_bounds__(kSkinnyWarps * 32) skinny_gemm_kernel(const __grid_constant__ SkinnyGemmParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kSkinnyWarps + warp;
  allow_dependents();
  wait_for_prior_grids();
  if (row >= p.n) return;
  const uint4* w = reinterpret_cast<const uint4*>(p.w + int64_t(row) * p.k);
  const int k8 = p.k / 8;
  float acc[kTokens] = {};
#pragma unroll 8
  for (int i = lane; i < k8; i += 32) {
    dot8<kTokens>(acc, __ldg(w + i),
                  [&](int t) { return *reinterpret_cast<const uint4*>(p.x + t * p.ldx + int64_t(i) * 8); });
  }
  store_row(p, acc, row, lane);
}

template <int kTokens>
void launch(const SkinnyGemmParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned((p.n + kSkinnyWarps - 1) / kSkinnyWarps)), block(kSkinnyWarps * 32);
  const size_t staged = size_t(kTokens) * padded_chunks(p.k) * 16;
  if (staged <= kSkinnyMaxStaged) launch_dependent(skinny_gemm_staged_kernel<kTokens>, grid, block, staged, stream, p);
  else launch_dependent(skinny_gemm_kernel<kTokens>, grid, block, 0, stream, p);
}

}  // namespace

bool skinny_gemm_applies(int s, int k, int64_t ldx) { return s >= 1 && s <= kSkinnyMaxTokens && k % 8 == 0 && ldx % 8 == 0; }

void launch_skinny_gemm(const SkinnyGemmParams& p, cudaStream_t stream) {
  MLA_REQUIRE(skinny_gemm_applies(p.s, p.k, p.ldx), "skinny GEMM: S = ", p.s, " (1..", kSkinnyMaxTokens,
              "), k = ", p.k, " and ldx = ", p.ldx, " (multiples of 8) expected");
  if (p.n <= 0) return;
  switch (p.s) {
    case 1: launch<1>(p, stream); break;
    case 2: launch<2>(p, stream); break;
    case 3: launch<3>(p, stream); break;
    default: launch<4>(p, stream); break;
  }
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
