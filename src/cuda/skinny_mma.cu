// y [S, n] = x [S, k] @ w [n, k]^T for 5..64 tokens on the tensor cores (mma.sync m16n8k16 bf16,
// f32 sums, bf16 out): pre's projections at 16-64-token steps. The product is still a stream over
// the weights (qkv_a is 52 MB for kimi-k3: ~12 us of bytes on an H200), which cuBLASLt's choice
// for these shapes (split-K GEMM + reduce: 17 + 4 us at 64 tokens under ncu, session 27) streams
// at well under the copy rate, and skinny_gemm.cu's CUDA-core FMAs cannot feed 64 tokens.
//
// Weight rows on M (a warp's m16 tile), tokens on N (n8 tiles, kTiles of them), K in blocks of 32
// values taken in mxfp4_mma.cuh's order: lane (g, c) loads values 8c .. 8c + 7 of a block from
// weight rows g and g + 8 (two 16-byte loads, the A fragments of both k16 steps) and from token g
// of each n8 tile (one 16-byte shared load, that tile's B fragments of both steps). A CTA (16
// warps, one an SM) takes 256 weight rows over one k slice: its x slice is staged in shared memory
// (rows 64 bytes off a 128-byte line from each other, so a warp's shared loads are conflict-free)
// while the first kAhead blocks of weights are already in flight (issued before the PDL wait:
// cuda/pdl.cuh). Split-K goes across the CTAs of a cluster (up to 8 along y): each CTA leaves its
// f32 partial tile in its shared memory and, after a cluster barrier, sums one slice of the
// tile's rows over the cluster's partials in rank order (DSMEM): deterministic, no workspace, one
// launch.
#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <cstdlib>

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/tma.cuh"

namespace mla::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 16;                 // 512 threads, one CTA an SM
constexpr int kCtaRows = kWarps * 16;      // weight rows a CTA: a warp's m16 tile each
constexpr int kMaxSplits = 8;              // the portable cluster size
constexpr int kRedPitch = kCtaRows + 4;    // floats a token's partial row (conflict-free stores)
constexpr int kBlockBytes = 64;            // 32 bf16 values
constexpr size_t kMaxSmem = 227 << 10;

// Bytes a token's staged x slice of `blocks` k blocks takes: 64 bytes past a multiple of 128, so
// the two token rows one phase of a warp's 16-byte loads reads fall on different banks.
__host__ __device__ constexpr int x_pitch(int blocks) { return (blocks * kBlockBytes + 127) / 128 * 128 + 64; }
constexpr size_t red_bytes(int tiles) { return size_t(8 * tiles) * kRedPitch * sizeof(float); }

// kAhead: k blocks of weights a lane has in flight (2 x 16 B each).
template <int kTiles, int kAhead>
__global__ void __launch_bounds__(kWarps * 32, 1) skinny_mma_kernel(const __grid_constant__ SkinnyGemmParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = warp_uniform(int(threadIdx.x / 32)), lane = int(threadIdx.x % 32), g = lane / 4, c = lane % 4;
  const int split = int(blockIdx.y), splits = int(gridDim.y);
  const int blocks = p.k / 32;
  const int b_begin = int(int64_t(split) * blocks / splits);
  const int nb = int(int64_t(split + 1) * blocks / splits) - b_begin;
  const int pitch = x_pitch(nb);

  // Weight rows g and g + 8 of the warp's tile (past n the last row again: loaded, never stored).
  const int row0 = int(blockIdx.x) * kCtaRows + warp * 16;
  const uint4* w0 = reinterpret_cast<const uint4*>(p.w + int64_t(min(row0 + g, p.n - 1)) * p.k) + 4 * b_begin + c;
  const uint4* w1 = reinterpret_cast<const uint4*>(p.w + int64_t(min(row0 + g + 8, p.n - 1)) * p.k) + 4 * b_begin + c;
  uint4 wa[kAhead][2];
#pragma unroll
  for (int i = 0; i < kAhead; ++i)
    if (i < nb) {
      wa[i][0] = load_streaming(w0 + 4 * i);
      wa[i][1] = load_streaming(w1 + 4 * i);
    }
  allow_dependents();
  wait_for_prior_grids();

  // The tokens' x slice: [S][nb blocks], row pitch `pitch` bytes.
  // Four loads a thread in flight before their stores (L2 round trips, not one at a time).
  const int chunks = nb * 4, total = p.s * chunks;  // 16-byte chunks a token, all
  for (int i0 = int(threadIdx.x); i0 < total; i0 += 4 * int(blockDim.x)) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = i0 + j * int(blockDim.x), t = i / chunks, ch = i - t * chunks;
      if (i < total) v[j] = *reinterpret_cast<const uint4*>(p.x + t * p.ldx + int64_t(b_begin) * 32 + ch * 8);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = i0 + j * int(blockDim.x), t = i / chunks, ch = i - t * chunks;
      if (i < total) *reinterpret_cast<uint4*>(smem + t * pitch + ch * 16) = v[j];
    }
  }
  __syncthreads();

  // Lane (g, c)'s chunk of token 8t + g in tile t (the last token again past S: its column is
  // computed and never stored).
  uint32_t x_off[kTiles];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) x_off[t] = uint32_t(min(8 * t + g, p.s - 1) * pitch + 16 * c);
  float acc[kTiles][4] = {};
  for (int b0 = 0; b0 < nb; b0 += kAhead) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      const int b = b0 + i;
      if (b < nb) {
        const uint4 a0 = wa[i][0], a1 = wa[i][1];
        if (b + kAhead < nb) {
          wa[i][0] = load_streaming(w0 + 4 * (b + kAhead));
          wa[i][1] = load_streaming(w1 + 4 * (b + kAhead));
        }
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          const uint4 xv = *reinterpret_cast<const uint4*>(smem + x_off[t] + b * kBlockBytes);
          ptx::mma_bf16(acc[t], a0.x, a1.x, a0.y, a1.y, xv.x, xv.y);  // values 8c .. 8c + 3
          ptx::mma_bf16(acc[t], a0.z, a1.z, a0.w, a1.w, xv.z, xv.w);  // values 8c + 4 .. 8c + 7
        }
      }
    }
  }

  // The CTA's partial tile [tokens][rows] over x's shared memory (every warp is done reading it).
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // accumulator rows g and g + 8, tokens 8t + 2c and 8t + 2c + 1
      const int r = warp * 16 + g + 8 * h, tok = 8 * t + 2 * c;
      red[tok * kRedPitch + r] = acc[t][2 * h];
      red[(tok + 1) * kRedPitch + r] = acc[t][2 * h + 1];
    }
  tma::cluster_sync();  // every partial of the cluster written and visible

  // This CTA's slice of the tile's rows, summed over the splits in rank order.
  cg::cluster_group cluster = cg::this_cluster();
  const int lo = split * kCtaRows / splits, rows = (split + 1) * kCtaRows / splits - lo;
  for (int i = int(threadIdx.x); i < p.s * rows; i += int(blockDim.x)) {
    const int t = i / rows, r = lo + (i - t * rows), row = int(blockIdx.x) * kCtaRows + r;
    float v = 0.0f;
    for (int q = 0; q < splits; ++q) v += cluster.map_shared_rank(red, q)[t * kRedPitch + r];
    if (row < p.n) p.y[t * p.ldy + row] = float_to_bf16(v);
  }
  tma::cluster_sync();  // no CTA leaves while another reads its partial
}

// One instance a count of n8 token tiles (S = 5..64: 1..8) and depth (MLA_SKINNY_AHEAD=4: 4 blocks).
using Kernel = void (*)(SkinnyGemmParams);
template <int kAhead>
constexpr Kernel kKernels[] = {skinny_mma_kernel<1, kAhead>, skinny_mma_kernel<2, kAhead>, skinny_mma_kernel<3, kAhead>,
                               skinny_mma_kernel<4, kAhead>, skinny_mma_kernel<5, kAhead>, skinny_mma_kernel<6, kAhead>,
                               skinny_mma_kernel<7, kAhead>, skinny_mma_kernel<8, kAhead>};
int ahead_env() {
  static const int ahead = [] {
    const char* env = std::getenv("MLA_SKINNY_AHEAD");
    return env && std::atoi(env) == 4 ? 4 : 8;
  }();
  return ahead;
}
Kernel kernel_for(int s) { return (ahead_env() == 4 ? kKernels<4> : kKernels<8>)[(s + 7) / 8 - 1]; }

cudaLaunchConfig_t config(dim3 grid, size_t smem, cudaStream_t stream, cudaLaunchAttribute (&attrs)[2]) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attrs[0] = cudaLaunchAttribute{};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 1, attrs[0].val.clusterDim.y = grid.y, attrs[0].val.clusterDim.z = 1;
  attrs[1] = cudaLaunchAttribute{};
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return cfg;
}

// The device's SMs, and the clusters of each size 1..8 that fit at once (one CTA an SM): the
// split count is the largest that keeps the launch in one wave.
struct Device {
  int sms = 0;
  std::array<int, kMaxSplits + 1> clusters{};
};
const Device& device() {
  static const Device d = [] {
    Device d;
    int dev = 0;
    MLA_CUDA_CHECK(cudaGetDevice(&dev));
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
    for (Kernel k : kKernels<4>) MLA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
    for (Kernel k : kKernels<8>) MLA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
    for (int s = 1; s <= kMaxSplits; ++s) {
      cudaLaunchAttribute attrs[2];
      cudaLaunchConfig_t cfg = config(dim3(1, s), red_bytes(kSkinnyMmaMaxTokens / 8), nullptr, attrs);
      cfg.numAttrs = 1;  // the cluster's shape only
      MLA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&d.clusters[s], kernel_for(kSkinnyMmaMaxTokens), &cfg));
    }
    return d;
  }();
  return d;
}

struct Plan {
  int tiles, splits;
  size_t smem;
};
Plan plan(int s, int n, int k) {
  const Device& d = device();
  const int tiles = (n + kCtaRows - 1) / kCtaRows, blocks = k / 32;
  int splits = std::clamp(d.sms / tiles, 1, std::min(kMaxSplits, blocks));
  while (splits > 1 && tiles > d.clusters[splits]) --splits;
  const int max_nb = (blocks + splits - 1) / splits;
  const int token_tiles = (s + 7) / 8;
  return {tiles, splits, std::max(size_t(s) * x_pitch(max_nb), red_bytes(token_tiles))};
}

// MLA_SKINNY_MMA=0: cuBLASLt takes these token counts (comparisons).
bool enabled() {
  static const bool on = [] {
    const char* env = std::getenv("MLA_SKINNY_MMA");
    return !env || std::atoi(env) != 0;
  }();
  return on;
}

}  // namespace

void prepare_skinny_mma() { (void)device(); }

bool skinny_mma_applies(int s, int n, int k, int64_t ldx, const void* x) {
  return enabled() && s > kSkinnyMaxTokens && s <= kSkinnyMmaMaxTokens && n >= 1 && k >= 32 && k % 32 == 0 &&
         ldx % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && plan(s, n, k).smem <= kMaxSmem;
}

void launch_skinny_mma(const SkinnyGemmParams& p, cudaStream_t stream) {
  MLA_REQUIRE(p.s > kSkinnyMaxTokens && p.s <= kSkinnyMmaMaxTokens, "skinny MMA GEMM: S = ", p.s, " (",
              kSkinnyMaxTokens + 1, "..", kSkinnyMmaMaxTokens, ") expected");
  MLA_REQUIRE(p.k >= 32 && p.k % 32 == 0 && p.ldx % 8 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0,
              "skinny MMA GEMM: k = ", p.k, " (a multiple of 32), ldx = ", p.ldx,
              " (a multiple of 8) and x 16-byte aligned expected");
  if (p.n <= 0) return;
  const Plan pl = plan(p.s, p.n, p.k);
  MLA_REQUIRE(pl.smem <= kMaxSmem, "skinny MMA GEMM: ", pl.smem, " bytes of shared memory for S = ", p.s,
              ", k = ", p.k, " (at most ", kMaxSmem, ")");
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t cfg = config(dim3(unsigned(pl.tiles), unsigned(pl.splits)), pl.smem, stream, attrs);
  MLA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel_for(p.s), p));
}

}  // namespace mla::cuda
