// y [S, n] = x [S, k] @ w [n, k]^T for 5..64 tokens on the tensor cores (mma.sync m16n8k16 bf16,
// f32 sums, bf16 out): pre's projections at 16-64-token steps, an experiment that a step takes only
// with MLA_SKINNY_MMA=1. The product is a stream over the weights (qkv_a is 52 MB for kimi-k3: ~12
// us of bytes on an H200), which cuBLASLt runs as a split-K GEMM and a reduce (17.4 + 4.0 us at 64
// tokens under ncu, session 28, DRAM at 66% of peak in the GEMM); skinny_gemm.cu's CUDA-core FMAs
// cannot feed 64 tokens.
//
// Weight rows on M (m16 tiles, kRowTiles a consumer warp), tokens on N (n8 tiles, kTiles of them),
// K in blocks of 32 values taken in mxfp4_mma.cuh's order: lane (g, c) reads values 8c .. 8c + 7 of
// a block from weight rows g and g + 8 of a row tile (two 16-byte shared loads: the A fragments of
// both k16 steps) and from token g of each n8 tile (one: that tile's B fragments of both steps). A
// CTA takes 256 weight rows over one k slice: its consumer warps and a producer warp whose lane 0
// streams the slice through a ring of kStages stages by TMA, each stage kStageBlocks k blocks of the
// weights (one box of 128 bytes x 256 rows) and of the tokens' x (a box of 64 bytes x 8 kTiles rows
// a block, zeros past S: landing as 64-byte rows, the 8 lanes of a shared-load phase read two whole
// rows, no bank conflicts; the weights' 128-byte rows cost the A loads a 2-way conflict).
//
// Split-K goes across the CTAs of a cluster (up to 8 along y): each CTA leaves its f32 partial tile
// in its shared memory and, after a cluster barrier, sums one slice of the tile's rows over the
// cluster's partials in rank order (DSMEM): deterministic, no workspace, one launch.
//
// Measured (session 28, H200, docs/attention.md "pre and post at decode sizes"): slower than
// cuBLASLt. Each lane loading its own pieces into registers (a warp instruction: 64 bytes of each
// of 8 rows 14 KB apart; 4 or 8 blocks ahead alike) held DRAM at ~30% of peak, qkv_a 34-41 us at 64
// tokens; TMA boxes of 64 bytes x 256 rows at 45%, 25.5 us. Not measured yet: this form (128-byte
// weight boxes, shared loads the compiler may schedule), MLA_SKINNY_WARP_ROWS=32 (two row tiles a
// warp: each x fragment feeds two MMAs, half the shared traffic of x, ~230 KB a stage at 64 tokens
// with 16 warps) and MLA_SKINNY_L2 (the weights' L2 promotion: 256 by default, 128, 64, 0).
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
#include "cuda/tma.hpp"

namespace mla::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kCtaRows = 256;           // weight rows a CTA (a box's most)
// kRowTiles: m16 tiles of weight rows a consumer warp (1 by default, the split calls 1-3 measured;
// MLA_SKINNY_WARP_ROWS=32: 2, each x fragment feeding two, half the shared traffic of x at 64
// tokens). One more warp produces.
template <int kRowTiles>
constexpr int kWarps = kCtaRows / (16 * kRowTiles);
template <int kRowTiles>
constexpr int kThreads = (kWarps<kRowTiles> + 1) * 32;
constexpr int kBlockBytes = 64;          // 32 bf16 values of k
constexpr int kStageBlocks = 2;          // k blocks a stage
constexpr int kStages = 5;
constexpr int kMaxSplits = 8;            // the portable cluster size
constexpr int kRedPitch = kCtaRows + 4;  // floats a token's partial row (conflict-free stores)

template <int kTiles>
struct Layout {
  static constexpr int kWRow = kStageBlocks * kBlockBytes;  // a weight row's bytes in a stage (one box)
  static constexpr int kW = kCtaRows * kWRow;
  static constexpr int kXBlock = 8 * kTiles * kBlockBytes;  // one k block of the (padded) tokens (a box)
  static constexpr int kStage = kW + kStageBlocks * kXBlock;
  static constexpr int kRing = kStages * kStage;
  static constexpr int kRed = 8 * kTiles * kRedPitch * 4;  // the partial tile, over the ring after the loop
  static constexpr int kBars = (std::max(kRing, kRed) + 127) / 128 * 128;
  static constexpr size_t kSmem = kBars + 2 * kStages * sizeof(uint64_t);
  static_assert(kSmem <= (227 << 10));
};

template <int kTiles, int kRowTiles>
__global__ void __launch_bounds__(kThreads<kRowTiles>, 1)
    skinny_mma_kernel(const __grid_constant__ SkinnyGemmParams p, const __grid_constant__ CUtensorMap w_map,
                      const __grid_constant__ CUtensorMap x_map) {
  using L = Layout<kTiles>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = warp_uniform(int(threadIdx.x / 32)), lane = int(threadIdx.x % 32), g = lane / 4, c = lane % 4;
  const int split = int(blockIdx.y), splits = int(gridDim.y);
  const int blocks = p.k / 32;
  const int b_begin = int(int64_t(split) * blocks / splits);
  const int nb = int(int64_t(split + 1) * blocks / splits) - b_begin;
  const int n_stages = (nb + kStageBlocks - 1) / kStageBlocks;
  const uint32_t ring = ptx::smem_addr(smem), full = ring + L::kBars, empty = full + 8 * kStages;
  auto stage_blocks = [&](int st) { return min(kStageBlocks, nb - st * kStageBlocks); };

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      tma::mbarrier_init(full + 8 * i, 1);
      tma::mbarrier_init(empty + 8 * i, kWarps<kRowTiles>);
    }
    tma::fence_barrier_init();
  }
  __syncthreads();
  allow_dependents();

  float acc[kRowTiles][kTiles][4] = {};  // (the consumers')
  if (warp == kWarps<kRowTiles>) {
    // The producer. Stage st: the weights' box at ring + slot * kStage, x's block boxes after it.
    if (lane == 0) {
      const int row0 = int(blockIdx.x) * kCtaRows;
      auto issue_w = [&](int st) {  // (a last odd block's box reads one block past the slice: unused)
        tma::load_2d(ring + uint32_t(st % kStages) * L::kStage, &w_map, (b_begin + st * kStageBlocks) * kBlockBytes,
                     row0, full + 8 * (st % kStages));
      };
      auto issue_x = [&](int st) {
        const uint32_t slot = ring + uint32_t(st % kStages) * L::kStage + L::kW,
                       bar = full + 8 * (st % kStages);
        for (int j = 0; j < stage_blocks(st); ++j)
          tma::load_2d(slot + j * L::kXBlock, &x_map, (b_begin + st * kStageBlocks + j) * kBlockBytes, 0, bar);
      };
      auto expect = [&](int st) {
        tma::arrive_expect_tx(full + 8 * (st % kStages), uint32_t(L::kW + stage_blocks(st) * L::kXBlock));
      };
      const int first = min(kStages, n_stages);
      for (int st = 0; st < first; ++st) expect(st), issue_w(st);  // the weights: before the PDL wait
      wait_for_prior_grids();
      for (int st = 0; st < first; ++st) issue_x(st);
      for (int st = kStages; st < n_stages; ++st) {
        tma::wait_parity_forever(empty + 8 * (st % kStages), uint32_t((st / kStages - 1) & 1));
        expect(st);
        issue_w(st);
        issue_x(st);
      }
    }
    __syncwarp();
    wait_for_prior_grids();  // (every lane: the whole warp writes y below)
  } else {
    wait_for_prior_grids();  // (y is written below: every earlier kernel of the stream is done)
    // Row g of the warp's row tile i at a_off + 16 i rows, row g + 8 8 rows further.
    const uint32_t a_off = uint32_t((warp * 16 * kRowTiles + g) * L::kWRow + 16 * c);
    const uint32_t b_off = uint32_t(g * kBlockBytes + 16 * c);               // token 8t + g at + 512 t
    for (int st = 0; st < n_stages; ++st) {
      // Plain loads after the wait (its asm has a memory clobber): the compiler may move them among
      // the MMAs, which an asm load would pin in program order.
      const uint8_t* slot = smem + (st % kStages) * L::kStage;
      tma::wait_parity_forever(full + 8 * (st % kStages), uint32_t((st / kStages) & 1));
      for (int j = 0; j < stage_blocks(st); ++j) {
        uint4 a0[kRowTiles], a1[kRowTiles];
#pragma unroll
        for (int i = 0; i < kRowTiles; ++i) {
          a0[i] = *reinterpret_cast<const uint4*>(slot + j * kBlockBytes + a_off + 16 * i * L::kWRow);
          a1[i] = *reinterpret_cast<const uint4*>(slot + j * kBlockBytes + a_off + (16 * i + 8) * L::kWRow);
        }
        const uint8_t* xb = slot + L::kW + j * L::kXBlock + b_off;
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          const uint4 b = *reinterpret_cast<const uint4*>(xb + t * 8 * kBlockBytes);
#pragma unroll
          for (int i = 0; i < kRowTiles; ++i) {
            ptx::mma_bf16(acc[i][t], a0[i].x, a1[i].x, a0[i].y, a1[i].y, b.x, b.y);  // values 8c .. 8c + 3
            ptx::mma_bf16(acc[i][t], a0[i].z, a1[i].z, a0[i].w, a1[i].w, b.z, b.w);  // 8c + 4 .. 8c + 7
          }
        }
      }
      __syncwarp();
      if (lane == 0) tma::arrive(empty + 8 * (st % kStages));
    }
  }
  __syncthreads();  // every stage read: the partial tile [tokens][rows] goes over the ring
  if (warp < kWarps<kRowTiles>) {
    float* red = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i)
#pragma unroll
      for (int t = 0; t < kTiles; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // accumulator rows g and g + 8, tokens 8t + 2c and 8t + 2c + 1
          const int r = (warp * kRowTiles + i) * 16 + g + 8 * h, tok = 8 * t + 2 * c;
          red[tok * kRedPitch + r] = acc[i][t][2 * h];
          red[(tok + 1) * kRedPitch + r] = acc[i][t][2 * h + 1];
        }
  }
  tma::cluster_sync();                  // every partial of the cluster written and visible

  // This CTA's slice of the tile's rows, summed over the splits in rank order.
  cg::cluster_group cluster = cg::this_cluster();
  const int lo = split * kCtaRows / splits, rows = (split + 1) * kCtaRows / splits - lo;
  const float* red = reinterpret_cast<const float*>(smem);
  for (int i = int(threadIdx.x); i < p.s * rows; i += int(blockDim.x)) {
    const int t = i / rows, r = lo + (i - t * rows), row = int(blockIdx.x) * kCtaRows + r;
    float v = 0.0f;
    for (int q = 0; q < splits; ++q) v += cluster.map_shared_rank(red, q)[t * kRedPitch + r];
    if (row < p.n) p.y[t * p.ldy + row] = float_to_bf16(v);
  }
  tma::cluster_sync();  // no CTA leaves while another reads its partial
}

// One instance a count of n8 token tiles (S = 5..64: 1..8) and of row tiles a warp.
using Kernel = void (*)(SkinnyGemmParams, CUtensorMap, CUtensorMap);
template <int kR>
constexpr Kernel kKernels[] = {skinny_mma_kernel<1, kR>, skinny_mma_kernel<2, kR>, skinny_mma_kernel<3, kR>,
                               skinny_mma_kernel<4, kR>, skinny_mma_kernel<5, kR>, skinny_mma_kernel<6, kR>,
                               skinny_mma_kernel<7, kR>, skinny_mma_kernel<8, kR>};
template <int... kT>
constexpr std::array<size_t, sizeof...(kT)> smem_table(std::integer_sequence<int, kT...>) {
  return {Layout<kT + 1>::kSmem...};
}
constexpr auto kSmemBytes = smem_table(std::make_integer_sequence<int, kSkinnyMmaMaxTokens / 8>());

int row_tiles_env() {  // (measuring: MLA_SKINNY_WARP_ROWS=32: two m16 row tiles a warp)
  static const int v = [] {
    const char* env = std::getenv("MLA_SKINNY_WARP_ROWS");
    return env && std::atoi(env) == 32 ? 2 : 1;
  }();
  return v;
}
struct Instance {
  Kernel kernel;
  int threads;
  size_t smem;
};
Instance instance(int s) {
  const int i = (s + 7) / 8 - 1;
  return row_tiles_env() == 2 ? Instance{kKernels<2>[i], kThreads<2>, kSmemBytes[i]}
                              : Instance{kKernels<1>[i], kThreads<1>, kSmemBytes[i]};
}

cudaLaunchConfig_t config(dim3 grid, const Instance& in, cudaStream_t stream, cudaLaunchAttribute (&attrs)[2]) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(in.threads));
  cfg.dynamicSmemBytes = in.smem;
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
    for (int i = 0; i < kSkinnyMmaMaxTokens / 8; ++i)
      for (Kernel k : {kKernels<1>[i], kKernels<2>[i]})
        MLA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes[i])));
    // The largest instance: one CTA an SM for every instance anyway (shared memory).
    const Instance largest = instance(kSkinnyMmaMaxTokens);
    for (int s = 1; s <= kMaxSplits; ++s) {
      cudaLaunchAttribute attrs[2];
      cudaLaunchConfig_t cfg = config(dim3(1, s), largest, nullptr, attrs);
      cfg.numAttrs = 1;  // the cluster's shape only
      MLA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&d.clusters[s], largest.kernel, &cfg));
    }
    return d;
  }();
  return d;
}

// The grid: 256-row tiles x splits of k, the most splits (up to 8) that keep it in one wave.
struct Plan {
  int tiles, splits;
};
Plan plan(int n, int k) {
  const Device& d = device();
  const int tiles = (n + kCtaRows - 1) / kCtaRows, blocks = k / 32;
  int splits = std::clamp(d.sms / tiles, 1, std::min(kMaxSplits, blocks));
  while (splits > 1 && tiles > d.clusters[splits]) --splits;
  return {tiles, splits};
}

// Off by default (MLA_SKINNY_MMA=1: on): measured slower than cuBLASLt in session 28 (below).
bool enabled() {
  static const bool on = [] {
    const char* env = std::getenv("MLA_SKINNY_MMA");
    return env && std::atoi(env) != 0;
  }();
  return on;
}

int l2_env() {  // (measuring: MLA_SKINNY_L2=0/64/128/256)
  static const int v = [] {
    const char* env = std::getenv("MLA_SKINNY_L2");
    return env ? std::atoi(env) : 256;
  }();
  return v;
}

}  // namespace

void prepare_skinny_mma() {
  if (enabled()) (void)device();
}

bool skinny_mma_supports(int s, int n, int k, int64_t ldx, const void* x) {
  return s > kSkinnyMaxTokens && s <= kSkinnyMmaMaxTokens && n >= 1 && k >= 32 && k % 32 == 0 && ldx % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// Not where the weights are so many rows that one split of 256-row tiles leaves a tenth of the SMs
// idle (kimi-k3 at 128 heads: qkv_a's 73 tiles, q_b's 96): cuBLASLt streams those at ~3.9 TB/s.
bool skinny_mma_applies(int s, int n, int k, int64_t ldx, const void* x) {
  if (!enabled() || !skinny_mma_supports(s, n, k, ldx, x)) return false;
  const Plan pl = plan(n, k);
  return pl.splits > 1 || 10 * pl.tiles >= 9 * device().sms;
}

void launch_skinny_mma(const SkinnyGemmParams& p, cudaStream_t stream) {
  if (p.n <= 0) return;
  MLA_REQUIRE(skinny_mma_supports(p.s, p.n, p.k, p.ldx, p.x), "skinny MMA GEMM: S = ", p.s, " (",
              kSkinnyMaxTokens + 1, "..", kSkinnyMmaMaxTokens, "), k = ", p.k, " (a multiple of 32), ldx = ", p.ldx,
              " (a multiple of 8) and x 16-byte aligned expected");
  const Plan pl = plan(p.n, p.k);
  const int tiles8 = (p.s + 7) / 8;
  // Boxes: 128 bytes (a stage's 2 k blocks) x 256 weight rows, and x 64 bytes x 8 tiles8 token rows
  // (zeros past S and past k). Both maps are encoded at every launch (two driver calls of host time
  // a projection): if this kernel is kept, the weights' map belongs with the weights, made once.
  const CUtensorMap w_map =
      make_tensor_map_bytes(p.w, p.n, int64_t(p.k) * 2, int64_t(p.k) * 2, kStageBlocks * kBlockBytes, kCtaRows, l2_env());
  const CUtensorMap x_map = make_tensor_map_bytes(p.x, p.s, int64_t(p.k) * 2, p.ldx * 2, kBlockBytes, 8 * tiles8);
  const Instance in = instance(p.s);
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t cfg = config(dim3(unsigned(pl.tiles), unsigned(pl.splits)), in, stream, attrs);
  MLA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, in.kernel, p, w_map, x_map));
}

}  // namespace mla::cuda
