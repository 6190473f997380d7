// post on the GPU (SPEC.md post): the merge of split partials (core/softmax_state.hpp, the same
// code as the CPU's merge and the DCP combine), then out = (o @ W_UV^T) * gate with W_UV in MXFP4
// dequantized in registers, bf16 out. At decode's latency-bound sizes (below 16 tokens or 384
// token x head rows: mma_products): one CTA per (head, 32 value rows, 8 tokens), each W_UV row
// decoded once for the 8 tokens on the CUDA cores, every CTA of a head merging that head's
// partials itself; from there on, one CTA per (head, 128 or 32 value rows, 16 tokens) on the
// tensor cores (post_mma_kernel). A token's
// partials: the `splits` at its own row, or with attend's flat plan (PostParams.part_first) the
// run of partials its request's segments wrote.
#include <cstdlib>

#include "core/softmax_state.hpp"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/mxfp4_mma.cuh"
#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/tma.cuh"

namespace mla::cuda {
namespace {

constexpr int kPostThreads = 512;
constexpr int kPostGroups = 4;                              // thread groups splitting a token's partials
constexpr int kPostGroupThreads = kPostThreads / kPostGroups;  // 4 latent dims a thread
constexpr int kPostBatch = 8;      // partial rows a thread loads before it uses any
constexpr int kPostTokens = 8;     // tokens sharing each decoded W_UV row
constexpr int kPostRows = 32;      // W_UV rows (v) a CTA: 2 a warp
constexpr int kMaxPartials = kMaxPostPartials;
constexpr int kLsePerLane = kMaxPartials / 32;
constexpr int kWarpRows = kPostRows / (kPostThreads / 32);
static_assert(kPostGroupThreads * 4 == kLatent, "post: a group covers the latent row, 4 dims a thread");

// 4 consecutive elements of a partial o row as loaded (kBf16: 4 bf16 in .x, .y; else 4 f32 bits),
// and as floats. Separate, so that a batch of loads goes out before any is used: with the widening
// right after its load, the bf16 rows were fetched one round trip at a time (the step 1.5-4.5% slower
// with bf16 partials than f32 ones at D, F, G, C and B1; H200, session 22). vec: 16-byte (f32) or
// 8-byte (bf16) aligned.
template <bool kBf16>
__device__ __forceinline__ uint4 load_partial(const PostParams& p, int64_t off, bool vec) {
  if constexpr (kBf16) {
    const uint16_t* src = static_cast<const uint16_t*>(p.o) + off;
    if (vec) {
      const uint2 v = *reinterpret_cast<const uint2*>(src);
      return make_uint4(v.x, v.y, 0, 0);
    }
    return make_uint4(uint32_t(src[0]) | uint32_t(src[1]) << 16, uint32_t(src[2]) | uint32_t(src[3]) << 16, 0, 0);
  } else {
    const float* src = static_cast<const float*>(p.o) + off;
    if (vec) return *reinterpret_cast<const uint4*>(src);
    return make_uint4(__float_as_uint(src[0]), __float_as_uint(src[1]), __float_as_uint(src[2]), __float_as_uint(src[3]));
  }
}
template <bool kBf16>
__device__ __forceinline__ float4 partial_floats(const uint4& v) {
  if constexpr (kBf16) {
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xFFFF0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xFFFF0000u));
  } else {
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
  }
}

// Whether a partial o row's 4-element pieces load as one vector (16 bytes f32, 8 bytes bf16).
__device__ __forceinline__ bool partials_vectorizable(const PostParams& p) {
  return reinterpret_cast<uintptr_t>(p.o) % (p.o_bf16 ? 8 : 16) == 0 && p.o_split_stride % 4 == 0 &&
         p.o_s_stride % 4 == 0 && p.o_h_stride % 4 == 0;
}

// Token s's partials: their count and the offsets of partial 0's o row and lse (partial c: + c
// strides): `splits` at its own row, or (attend's flat plan) its request's run of them.
struct TokenPartials {
  int count;
  int64_t o, lse;
};
__device__ __forceinline__ TokenPartials token_partials(const PostParams& p, int h, int64_t s) {
  int64_t first = 0, row = s;
  int count = p.splits;
  if (p.part_first) {
    const int64_t b = s / p.qlen;
    row = s % p.qlen;
    count = min(max(p.part_count[b], 0), kMaxPartials);
    first = count > 0 ? p.part_first[b] : 0;
  }
  return {count, first * p.o_split_stride + row * p.o_s_stride + int64_t(h) * p.o_h_stride,
          first * p.lse_split_stride + row * p.lse_s_stride + int64_t(h) * p.lse_h_stride};
}

// A warp's merge weights exp(lse_c - lse) of one token's `count` partials (lse of partial c at
// p.lse + lse_offset + c lse_split_stride) into weight[c]: core/softmax_state.hpp's merge_weight,
// exactly 0 for an empty partial; all empty: lse = -inf and every weight 0.
__device__ __forceinline__ void merge_weights(const PostParams& p, int64_t lse_offset, int count, int lane,
                                              float* weight) {
  const float* lse = p.lse + lse_offset;
  if (count <= 32) {  // one partial a lane: the same sums as below in a sixteenth of the code
    const float l = lane < count ? lse[lane * p.lse_split_stride] : -INFINITY;
    float m = l;
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float sum = 0.0f;
    if (lane < count) sum += merge_weight(l, m);
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float total = m == -INFINITY ? -INFINITY : m + logf(sum);
    if (lane < count) weight[lane] = merge_weight(l, total);
    return;
  }
  float l[kLsePerLane];
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i) {
    const int c = lane + 32 * i;
    l[i] = c < count ? lse[c * p.lse_split_stride] : -INFINITY;
  }
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i) m = fmaxf(m, l[i]);
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i)
    if (lane + 32 * i < count) sum += merge_weight(l[i], m);
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float total = m == -INFINITY ? -INFINITY : m + logf(sum);
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i)
    if (lane + 32 * i < count) weight[lane + 32 * i] = merge_weight(l[i], total);
}

// grid (N, ceil(V/32), ceil(S/8)). At small S the kernel is latency-bound (B = 1 with 64 splits:
// 48 CTAs, each merging 64 partial rows of 2 KB per head), so loads come in as few round trips as
// possible: step 3's W_UV rows first (constant: loaded before waiting for attend, cuda/pdl.cuh),
// then the gate values, the first batch of partial o rows and the partials' lse; then the merge
// with the partials split over 4 thread groups, 8 rows in flight a thread.
// kBf16: the partial o rows are bf16 (PostParams.o_bf16), else f32.
// kCluster > 1 (MLA_POST_CLUSTER, session 37; the default since session 38, =0 off): the V / 32 CTAs of
// a head and token block run as clusters of kCluster along y, each merging a kCluster-th of the
// partials (the thread groups of all its CTAs share them out), then every CTA adds the kCluster
// partial sums from the cluster's shared memory in rank order, so all hold the same merged o. On an
// H100 (session 37) the step of one 128K request took 7.4 us more at 256 splits than at 132 with
// attend equal: each CTA merged all 256 partial rows of its head (512 KB) on one SM. Clustered
// (session 38, H100): that step 91.5 -> 82.8 us, at page 1 97.0 -> 88.6, B = 4 x 65536 136.7 ->
// 128.6, B = 1 x 32768 (171 splits) 67.0 -> 62.0; B = 1 x 8192 (43) within the runs' spread.
template <bool kBf16, int kCluster>
__global__ void __launch_bounds__(kPostThreads) post_kernel(const __grid_constant__ PostParams p) {
  __shared__ __align__(16) float o[kPostTokens][kLatent];
  __shared__ float weight[kPostTokens][kMaxPartials];
  __shared__ __align__(16) float group_sum[kPostGroups - 1][kLatent];
  // Token t's partials: count, and the offsets of partial 0's o row and lse (partial c: + c strides).
  __shared__ int tok_count[kPostTokens];
  __shared__ int64_t tok_o[kPostTokens], tok_lse[kPostTokens];
  const int n = blockIdx.x, h = p.head_offset + n;
  const int v0 = blockIdx.y * kPostRows;
  const int64_t s0 = int64_t(blockIdx.z) * kPostTokens;
  const int tokens = int(min(int64_t(kPostTokens), int64_t(p.tokens) - s0));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = tid / kPostGroupThreads, q = tid % kPostGroupThreads;  // q: latent dims 4q .. 4q+3

  // 0. Step 3's W_UV rows (lane owns latent dims 8*lane + 256*k + e), then its gate values.
  constexpr int kRowBytes = kLatent / 2, kRowScales = kLatent / 32;
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
  allow_dependents();
  wait_for_prior_grids();  // o and lse come from attend (or the DCP exchange), the gate from pre
  float gate[kWarpRows];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    gate[r] = p.gate && lane < tokens && vw + r < p.v_dim
                  ? bf16_to_float(p.gate[(s0 + lane) * p.gate_stride + n * p.v_dim + vw + r])
                  : 1.0f;
  }

  if (tid < tokens) {
    const TokenPartials tp = token_partials(p, h, s0 + tid);
    tok_count[tid] = tp.count;
    tok_o[tid] = tp.o;
    tok_lse[tid] = tp.lse;
  }
  __syncthreads();

  // This group's partials [c_begin, c_end) of token t, and the first batch of their o rows (token 0):
  // group gg of the kPostGroups x kCluster groups of the cluster's CTAs.
  constexpr int kGroups = kPostGroups * kCluster;
  int gg = g;
  if constexpr (kCluster > 1) gg += int(tma::cluster_rank()) * kPostGroups;
  int c_begin = 0, c_end = 0;
  auto group_range = [&](int t) {
    const int count = tok_count[t], per_group = (count + kGroups - 1) / kGroups;
    c_begin = min(gg * per_group, count);
    c_end = min(c_begin + per_group, count);
  };
  const bool vec = partials_vectorizable(p);
  uint4 x[kPostBatch];  // as loaded (load_partial)
  auto load_batch = [&](int t, int c) {
    const int64_t base = tok_o[t] + 4 * q;
#pragma unroll
    for (int i = 0; i < kPostBatch; ++i)
      if (c + i < c_end) x[i] = load_partial<kBf16>(p, base + (c + i) * p.o_split_stride, vec);
  };
  group_range(0);
  load_batch(0, c_begin);

  // 1. Merge weights, a warp a token.
  for (int t = warp; t < tokens; t += kPostThreads / 32) merge_weights(p, tok_lse[t], tok_count[t], lane, weight[t]);
  __syncthreads();

  // 2. Merged o of each token: every group sums its partials, group 0 adds the others' sums. The
  //    o of a partial with weight 0 is loaded but never used (it may hold anything, NaN included).
  for (int t = 0; t < tokens; ++t) {
    float4 merged = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    group_range(t);
    for (int c = c_begin; c < c_end; c += kPostBatch) {
      if (t > 0 || c > c_begin) load_batch(t, c);
#pragma unroll
      for (int i = 0; i < kPostBatch; ++i) {
        if (c + i >= c_end) break;
        const float w = weight[t][c + i];
        if (w != 0.0f) {
          const float4 xi = partial_floats<kBf16>(x[i]);
          merged.x += w * xi.x;
          merged.y += w * xi.y;
          merged.z += w * xi.z;
          merged.w += w * xi.w;
        }
      }
    }
    if (g > 0) *reinterpret_cast<float4*>(&group_sum[g - 1][4 * q]) = merged;
    __syncthreads();
    if (g == 0) {
#pragma unroll
      for (int k = 0; k < kPostGroups - 1; ++k) {
        const float4 other = *reinterpret_cast<const float4*>(&group_sum[k][4 * q]);
        merged.x += other.x;
        merged.y += other.y;
        merged.z += other.z;
        merged.w += other.w;
      }
      *reinterpret_cast<float4*>(&o[t][4 * q]) = merged;
    }
    __syncthreads();  // group_sum is reused by the next token
  }
  for (int t = tokens + g; t < kPostTokens; t += kPostGroups)
    *reinterpret_cast<float4*>(&o[t][4 * q]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  __syncthreads();
  if constexpr (kCluster > 1) {
    // o holds this CTA's share; the merged o is the sum of the cluster's shares, added in rank order
    // (the same floats in every CTA). The first sync publishes the shares, the second keeps each
    // until every CTA has read it (and no CTA exits while another reads its shared memory).
    constexpr int kVecs = kPostTokens * kLatent / 4, kPerThread = kVecs / kPostThreads;
    static_assert(kVecs % kPostThreads == 0, "post: the merged o's float4s over the threads");
    float4 sum[kPerThread];
    tma::cluster_sync();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const float* src = &o[0][0] + 4 * (tid + i * kPostThreads);
      sum[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int r = 0; r < kCluster; ++r) {
        const float4 v = tma::load_cluster_float4(src, uint32_t(r));
        sum[i].x += v.x;
        sum[i].y += v.y;
        sum[i].z += v.z;
        sum[i].w += v.w;
      }
    }
    tma::cluster_sync();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) *reinterpret_cast<float4*>(&o[0][0] + 4 * (tid + i * kPostThreads)) = sum[i];
    __syncthreads();
  }

  // 3. out[s, n*V + v] for this warp's rows.
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
      if (p.gate) mine *= gate[r];
      p.out[s * p.out_stride + col] = float_to_bf16(mine);
    }
  }
}

// --- 16+ tokens: W_UV on the tensor cores (mxfp4_mma.cuh) ----------------------------------------
// grid (N, ceil(V / 128), ceil(S / 16)), 16 warps: a CTA merges the partials of 16 tokens of one
// head once (post_kernel merges them in each of a head's V / 32 CTAs, one token after another) and
// multiplies them by 128 W_UV rows, warp w rows 8 w .. 8 w + 7: out^T tile [16 tokens x 8 rows] +=
// o [16 x 16] . W^T [16 x 8] by mma.sync, o as hi + lo bf16 (two MMAs a step), W decoded from
// shared memory a code word a lane. 512 threads keep many of a head's partials in flight at once.
constexpr int kWideTokens = 16;                  // a CTA's tokens: the MMA's M
constexpr int kWideThreads = 512;
constexpr int kWideRows = kWideThreads / 32 * 8;  // W_UV rows a CTA at most: an n8 tile a warp
constexpr int kWideGroups = kWideThreads / (kLatent / 4);  // merge: 4 groups of 128 threads, 4 dims a thread
constexpr int kOPitch = kLatent + 4;             // floats a merged o row: lanes (g, c) load conflict-free
constexpr int kWPitch = kLatent / 8 + 4;         // code words a W_UV row: the same
constexpr int kRowBlocks = kLatent / mxfp4::kBlock;
static_assert(kWideGroups * kLatent / 4 == kWideThreads && kWideRows == 128, "post_mma_kernel's thread layout");

template <int kRows>
struct PostWideSmem {
  // merged o; then (step 2b) the same bytes hold its MMA A fragments: hi + lo bf16, 16 words a
  // lane and 32-value block, [block][4 uint4][lane] so a warp's 16-byte stores and loads are
  // contiguous (conflict-free)
  union {
    float o[kWideTokens][kOPitch];
    uint4 afrag[kRowBlocks][4][32];
  };
  float weight[kWideTokens][kMaxPartials];  // merge weights
  uint32_t codes[kRows][kWPitch];           // the CTA's W_UV rows
  uint8_t scales[kRows][kRowBlocks];
  int tok_count[kWideTokens];
  int64_t tok_o[kWideTokens], tok_lse[kWideTokens];
};

// kRows: W_UV rows a CTA (128, or 32 where the grid would fill less than the GPU: each of a head's
// CTAs then merges the same partials, as post_kernel's do, with 4 x the loads in flight).
template <bool kBf16, int kRows>
__global__ void __launch_bounds__(kWideThreads, 2) post_mma_kernel(const __grid_constant__ PostParams p) {
  static_assert(kRows % 8 == 0 && kRows <= kWideRows);
  extern __shared__ __align__(16) uint8_t post_smem[];
  auto& sm = *reinterpret_cast<PostWideSmem<kRows>*>(post_smem);
  const int n = blockIdx.x, h = p.head_offset + n;
  const int v0 = blockIdx.y * kRows;
  const int64_t s0 = int64_t(blockIdx.z) * kWideTokens;
  const int tokens = int(min(int64_t(kWideTokens), int64_t(p.tokens) - s0));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;

  // 0. The CTA's W_UV rows (constant: before waiting for attend); rows past V are zero.
  constexpr int kRowChunks = kLatent / 2 / 16;  // 16-byte chunks of a row's codes
  for (int i = tid; i < kRows * (kRowChunks + 1); i += kWideThreads) {
    const int r = i / (kRowChunks + 1), k = i % (kRowChunks + 1), v = v0 + r;
    const int64_t row = int64_t(n) * p.v_dim + (v < p.v_dim ? v : 0);
    if (k < kRowChunks)
      ptx::cp_async_16(ptx::smem_addr(&sm.codes[r][4 * k]), p.w_codes + row * (kLatent / 2) + 16 * k, v < p.v_dim);
    else  // the row's 16 scales
      ptx::cp_async_16(ptx::smem_addr(&sm.scales[r][0]), p.w_scales + row * kRowBlocks, v < p.v_dim);
  }
  ptx::cp_async_commit();
  allow_dependents();
  wait_for_prior_grids();  // o and lse come from attend (or the DCP exchange), the gate from pre

  // The gate values of lane (g, c)'s outputs (step 4), loaded now: at the end they were a DRAM round
  // trip of their own (ncu at B64, session 27).
  const int out_warp = 8 * warp < kRows;  // warps with an out^T tile (step 3)
  uint16_t gate_bits[4] = {0x3F80, 0x3F80, 0x3F80, 0x3F80};  // 1.0
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int t = g + 8 * (e >> 1), v = v0 + 8 * warp + 2 * c + (e & 1);
    if (p.gate && out_warp && t < tokens && v < p.v_dim)
      gate_bits[e] = p.gate[(s0 + t) * p.gate_stride + int64_t(n) * p.v_dim + v];
  }

  // 1. Each token's partials (post_kernel's rule), then their merge weights, a warp a token.
  if (tid < kWideTokens) {
    const TokenPartials tp = tid < tokens ? token_partials(p, h, s0 + tid) : TokenPartials{0, 0, 0};
    sm.tok_count[tid] = tp.count;
    sm.tok_o[tid] = tp.o;
    sm.tok_lse[tid] = tp.lse;
  }
  for (int i = tid; i < kWideTokens * kLatent / 4; i += kWideThreads)
    *reinterpret_cast<float4*>(&sm.o[i / (kLatent / 4)][4 * (i % (kLatent / 4))]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  __syncthreads();
  for (int t = warp; t < tokens; t += kWideThreads / 32)
    merge_weights(p, sm.tok_lse[t], sm.tok_count[t], lane, sm.weight[t]);
  __syncthreads();

  // 2. o[t] = sum_c weight[t][c] o_c[t]: group k (128 threads, 4 dims 4 q .. 4 q + 3 each) merges
  //    tokens k, k + 4, .. walking their (token, partial) pairs in order, kPostBatch loads in flight
  //    (16 spilled at 2 CTAs an SM; one token after another would wait a round trip a token). A
  //    partial of weight 0 is loaded, never used.
  const bool vec = partials_vectorizable(p);
  const int group = tid / (kLatent / 4), q = tid % (kLatent / 4);
  int t_at = group, c_at = 0;
  auto skip_empty = [&] {
    while (t_at < tokens && c_at >= sm.tok_count[t_at]) t_at += kWideGroups, c_at = 0;
  };
  skip_empty();
  while (t_at < tokens) {
    uint4 x[kPostBatch];
    int tt[kPostBatch], cc[kPostBatch];
#pragma unroll
    for (int i = 0; i < kPostBatch; ++i) {
      tt[i] = t_at, cc[i] = c_at;
      if (t_at < tokens) {
        x[i] = load_partial<kBf16>(p, sm.tok_o[t_at] + c_at * p.o_split_stride + 4 * q, vec);
        c_at += 1;
        skip_empty();
      }
    }
#pragma unroll
    for (int i = 0; i < kPostBatch; ++i) {
      if (tt[i] >= tokens) break;
      const float w = sm.weight[tt[i]][cc[i]];
      if (w != 0.0f) {
        const float4 xi = partial_floats<kBf16>(x[i]);
        float4& o = *reinterpret_cast<float4*>(&sm.o[tt[i]][4 * q]);
        o.x += w * xi.x, o.y += w * xi.y, o.z += w * xi.z, o.w += w * xi.w;
      }
    }
  }
  ptx::cp_async_wait_all();
  __syncthreads();

  // 2b. The merged o as MMA A fragments, once a CTA (every warp's tile takes the same ones; made in
  //     each warp they were ~100 of its ~170 instructions a block, ncu at D, session 27): thread
  //     (blk, lane) splits its 16 values into hi + lo bf16, then overwrites o with them.
  {
    static_assert(kRowBlocks * 32 == kWideThreads && sizeof(sm.afrag) <= sizeof(sm.o));
    const int blk = tid / 32;
    float x0[8], x1[8], hi0[8], lo0[8], hi1[8], lo1[8];
    mxfp4::load8(&sm.o[g][mxfp4::kBlock * blk + 8 * c], x0);
    mxfp4::load8(&sm.o[g + 8][mxfp4::kBlock * blk + 8 * c], x1);
    mxfp4::split_hi_lo(x0, hi0, lo0);
    mxfp4::split_hi_lo(x1, hi1, lo1);
    uint32_t a_hi[2][4], a_lo[2][4];
    mxfp4::a_fragments(hi0, hi1, a_hi);
    mxfp4::a_fragments(lo0, lo1, a_lo);
    __syncthreads();  // every thread has read o
    sm.afrag[blk][0][lane] = make_uint4(a_hi[0][0], a_hi[0][1], a_hi[0][2], a_hi[0][3]);
    sm.afrag[blk][1][lane] = make_uint4(a_hi[1][0], a_hi[1][1], a_hi[1][2], a_hi[1][3]);
    sm.afrag[blk][2][lane] = make_uint4(a_lo[0][0], a_lo[0][1], a_lo[0][2], a_lo[0][3]);
    sm.afrag[blk][3][lane] = make_uint4(a_lo[1][0], a_lo[1][1], a_lo[1][2], a_lo[1][3]);
    __syncthreads();
  }

  // 3. Warp w's out^T tile: rows v0 + 8 w + (0..7), every token.
  if (!out_warp) return;
  float acc[4] = {};
  const int r = 8 * warp + g;
#pragma unroll 4
  for (int blk = 0; blk < kRowBlocks; ++blk) {
    uint32_t b[2][2];
    mxfp4::b_fragments(sm.codes[r][4 * blk + c], sm.scales[r][blk], b);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint4 hi = sm.afrag[blk][s][lane], lo = sm.afrag[blk][2 + s][lane];
      ptx::mma_bf16(acc, hi.x, hi.y, hi.z, hi.w, b[s][0], b[s][1]);
      ptx::mma_bf16(acc, lo.x, lo.y, lo.z, lo.w, b[s][0], b[s][1]);
    }
  }

  // 4. Lane (g, c) holds tokens g, g + 8 x rows 2c, 2c + 1: times the gate, bf16 out.
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int t = g + 8 * (e >> 1), v = v0 + 8 * warp + 2 * c + (e & 1);
    if (t >= tokens || v >= p.v_dim) continue;
    const int64_t s = s0 + t, col = int64_t(n) * p.v_dim + v;
    float y = acc[e];
    if (p.gate) y *= bf16_to_float(gate_bits[e]);
    p.out[s * p.out_stride + col] = float_to_bf16(y);
  }
}

}  // namespace

bool post_clusters(int splits, int v_blocks) {
  // MLA_POST_CLUSTER: 1 (unset: the default since session 38), 0, force
  static const int mode = env_choice("MLA_POST_CLUSTER", {{"force", 2}, {"0", 0}}, 1);
  if (mode == 0 || v_blocks % kPostCluster != 0) return false;
  return mode == 2 || splits >= kPostClusterMinPartials;
}

bool mma_products(int64_t tokens, int heads) {
  static const int forced = [] {  // MLA_MMA_PRODUCTS_MIN, 0 where unset
    const char* env = std::getenv("MLA_MMA_PRODUCTS_MIN");
    return env && std::atoi(env) > 0 ? std::atoi(env) : 0;
  }();
  if (forced > 0) return tokens >= forced;
  return tokens >= kMmaProductsMinTokens && tokens * heads >= kMmaProductsMinRows;
}

void prepare_post_kernels() {  // (every instance's dynamic shared memory is over 48 KB)
  auto set = [](auto kernel, size_t smem) {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  };
  set(post_mma_kernel<true, 32>, sizeof(PostWideSmem<32>));
  set(post_mma_kernel<false, 32>, sizeof(PostWideSmem<32>));
  set(post_mma_kernel<true, kWideRows>, sizeof(PostWideSmem<kWideRows>));
  set(post_mma_kernel<false, kWideRows>, sizeof(PostWideSmem<kWideRows>));
}

void launch_post(const PostParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  MLA_REQUIRE(p.splits <= kMaxPartials, "CUDA post: at most ", kMaxPartials, " partials (splits x DCP ranks), got ",
              p.splits);
  const bool aligned = reinterpret_cast<uintptr_t>(p.w_codes) % 16 == 0 && reinterpret_cast<uintptr_t>(p.w_scales) % 16 == 0;
  if (mma_products(p.tokens, p.heads) && aligned) {
    auto launch = [&](auto kernel, int rows, size_t smem) {
      const dim3 grid(unsigned(p.heads), unsigned((p.v_dim + rows - 1) / rows),
                      unsigned((p.tokens + kWideTokens - 1) / kWideTokens));
      launch_dependent(kernel, grid, dim3(kWideThreads), smem, stream, p);
    };
    // 128-row CTAs where they fill the GPU's SMs, else 32-row ones (4 x the CTAs, each merging).
    const int64_t ctas = int64_t(p.heads) * ((p.v_dim + kWideRows - 1) / kWideRows) *
                         ((p.tokens + kWideTokens - 1) / kWideTokens);
    const bool narrow = ctas < p.sms;
    if (narrow && p.o_bf16) launch(post_mma_kernel<true, 32>, 32, sizeof(PostWideSmem<32>));
    else if (narrow) launch(post_mma_kernel<false, 32>, 32, sizeof(PostWideSmem<32>));
    else if (p.o_bf16) launch(post_mma_kernel<true, kWideRows>, kWideRows, sizeof(PostWideSmem<kWideRows>));
    else launch(post_mma_kernel<false, kWideRows>, kWideRows, sizeof(PostWideSmem<kWideRows>));
    MLA_CUDA_CHECK_LAUNCH();
    return;
  }
  const dim3 grid(unsigned(p.heads), unsigned((p.v_dim + kPostRows - 1) / kPostRows),
                  unsigned((p.tokens + kPostTokens - 1) / kPostTokens));
  const int cluster = post_clusters(p.part_first ? 0 : p.splits, int(grid.y)) ? kPostCluster : 1;
  void (*kernel)(PostParams) = cluster > 1 ? (p.o_bf16 ? post_kernel<true, kPostCluster> : post_kernel<false, kPostCluster>)
                                           : (p.o_bf16 ? post_kernel<true, 1> : post_kernel<false, 1>);
  launch_dependent(kernel, grid, dim3(kPostThreads), 0, stream, p, unsigned(cluster));
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
