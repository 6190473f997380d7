// attend on the GPU (issue 4, v4): one CTA per (request, split, 16-row query tile).
// The CTA holds up to 16 query rows (G heads x Q queries of one request) and streams the request's
// cache rows through shared memory once, in tiles of 64 keys (cp.async, kStages deep), with
// mma.sync tensor-core products for q.k and p.v. An fp8 cache stays fp8 in shared memory and is
// widened to f16 in registers (mma.sync with e4m3 operands exists on sm_90 but is emulated: the
// compiler widens both operands and issues two f16 mma, measured in docs/attention.md).
// docs/attention.md has the fragment layouts and the roofline.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdlib>
#include <iterator>
#include <string_view>

#include "core/softmax_state.hpp"
#include "cuda/attend_keys.cuh"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda {
namespace {

constexpr int kWarps = 8;  // q.k: 8 keys a warp; p.v: 64 of the 512 latent dims a warp
constexpr int kThreads = kWarps * 32;
constexpr int kMTile = 16;  // query rows of one mma tile
constexpr int kPStride = kTileKeys + 8;  // P row: 36 words = 4 (mod 32), ldmatrix rows hit distinct banks

template <bool kFp8>
struct Traits;
// fp8 cache: rows of 576 bytes padded to 592 (148 words: the 8 rows an ldmatrix reads start 20
// words apart, on distinct banks); f16 math (e4m3 -> f16 is exact). The f16 query tile is stored
// fragment-major (q_word): 36 k16 steps x 32 lanes x one 16-byte A fragment, so a lane's fragment
// is one conflict-free 16-byte load into the four registers the mma reads (no register moves).
template <>
struct Traits<true> {
  static constexpr int kElemBytes = 1;
  static constexpr int kRowBytes = kRow + 16;
  static constexpr int kQStride = kRow;  // 16 rows x 576 halves = 36 x 32 x 16 bytes
};
// bf16 cache: rows of 1152 bytes padded to 1168 (292 words = 4 mod 32); bf16 math.
template <>
struct Traits<false> {
  static constexpr int kElemBytes = 2;
  static constexpr int kRowBytes = 2 * kRow + 16;
  static constexpr int kQStride = kRow + 8;
};

// The kernel's compile-time shape: cache dtype, P kept as hi + lo (see store_p), pipeline depth.
template <bool kFp8_, bool kSplitP_, int kStages_>
struct Variant {
  static constexpr bool kFp8 = kFp8_, kSplitP = kSplitP_;
  static constexpr int kStages = kStages_;
  static constexpr int kQRowBytes = 2 * Traits<kFp8>::kQStride;  // f16 or bf16 halves
};

// kStages key tiles in shared memory: kStages - 1 loading while one is used.
template <class V>
struct SharedPlan {
  static constexpr int kStages = V::kStages;
  alignas(128) uint8_t kv[kStages][kTileKeys][Traits<V::kFp8>::kRowBytes];
  alignas(16) uint8_t q[kMTile][V::kQRowBytes];  // query tile: f16 fragment-major (q_word) or bf16 rows
  // Softmax weights of the tile in 16 bits; with kSplitP as a sum hi + lo (see store_p).
  alignas(16) uint16_t p[V::kSplitP ? 2 : 1][kMTile][kPStride];
  // kStages + 1 tiles' key rows: tile t in use, t+1 .. t+kStages-1 loading, t+kStages's page ids
  // arriving.
  const uint8_t* rows[kStages + 1][kTileKeys];  // global address of each key row; null: masked, zero-filled
  int32_t pos[kStages + 1][kTileKeys];          // global position of each key; INT_MAX: masked
  float red_max[kWarps][kMTile];
  float red_sum[kWarps][kMTile];
};

// q.k for this warp's 8 keys of the tile: s = 16 rows x 8 keys (mma C fragment).
// fp8: one ldmatrix row segment holds 16 dims of a key; lane (g, c) gets dims 4c..4c+3 and uses
// them as the k16 step's pairs (2c, 2c+1) and (2c+8, 2c+9). That permutes k inside each 16-dim
// block, so the query's A fragment holds the same dims of its rows: a0 = row g dims 4c, 4c+1;
// a1 = row g+8, the same dims; a2 = row g dims 4c+2, 4c+3; a3 = row g+8. The dot product is
// unchanged. q_word gives the 32-bit word of the fragment-major tile that holds row r, dims d, d+1.
__device__ __forceinline__ int q_word(int r, int d) {
  const int step = d / 16, c = (d % 16) / 4, h = (d % 4) / 2;
  const int lane = 4 * (r % 8) + c;
  return (step * 32 + lane) * 4 + 2 * h + r / 8;
}

template <class V>
__device__ __forceinline__ void qk_tile_f16(const SharedPlan<V>& sm, int buf, int warp, int lane, float (&s)[4]) {
  const uint32_t kbase = ptx::smem_addr(&sm.kv[buf][warp * 8 + (lane & 7)][(lane >> 3) * 16]);
  const uint4* qf = reinterpret_cast<const uint4*>(&sm.q[0][0]) + lane;
  // Four accumulators: chains of 9 dependent mma instead of 36.
  float s4[4][4] = {};
#pragma unroll 3
  for (int kb = 0; kb < kRow / 64; ++kb) {
    uint32_t r[4];
    ptx::ldmatrix_x4(r, kbase + kb * 64);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint4 a = qf[(kb * 4 + j) * 32];
      uint32_t k0, k1;
      ptx::fp8x4_to_f16x2x2(r[j], k0, k1);
      ptx::mma_f16(s4[j], a.x, a.y, a.z, a.w, k0, k1);
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) s[e] = (s4[0][e] + s4[1][e]) + (s4[2][e] + s4[3][e]);
}

template <class V>
__device__ __forceinline__ void qk_tile_bf16(const SharedPlan<V>& sm, int buf, int warp, int lane, float (&s)[4]) {
  const int g = lane / 4, c = lane % 4;
  const uint32_t kbase = ptx::smem_addr(&sm.kv[buf][warp * 8 + (lane & 7)][(lane >> 3) * 16]);
  const uint16_t* q0 = reinterpret_cast<const uint16_t*>(sm.q[g]) + 2 * c;
  const uint16_t* q1 = reinterpret_cast<const uint16_t*>(sm.q[g + 8]) + 2 * c;
  float s2[2][4] = {};
#pragma unroll 6
  for (int kb = 0; kb < kRow / 32; ++kb) {
    uint32_t r[4];
    ptx::ldmatrix_x4(r, kbase + kb * 64);
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      const int d = kb * 32 + step * 16;
      ptx::mma_bf16(s2[step], *reinterpret_cast<const uint32_t*>(q0 + d), *reinterpret_cast<const uint32_t*>(q1 + d),
                    *reinterpret_cast<const uint32_t*>(q0 + d + 8), *reinterpret_cast<const uint32_t*>(q1 + d + 8),
                    r[2 * step], r[2 * step + 1]);
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) s[e] = s2[0][e] + s2[1][e];
}

template <class V>
__device__ __forceinline__ void qk_tile(const SharedPlan<V>& sm, int buf, int warp, int lane, float (&s)[4]) {
  if constexpr (V::kFp8) qk_tile_f16(sm, buf, warp, lane, s);
  else qk_tile_bf16(sm, buf, warp, lane, s);
}

// p.v for this warp's 64 latent dims: acc = 16 rows x 8 n-tiles of 8.
// fp8: ldmatrix.trans on the fp8 rows as b16 gives lane (g, c) the byte pairs of dims (2g, 2g+1)
// at keys 2c and 2c+1; a byte permute splits them into an even-dim and an odd-dim B fragment, so
// n-tile 2k covers the even dims of 16-dim chunk k and n-tile 2k+1 its odd dims (dim_of below).
template <class V>
__device__ __forceinline__ void pv_tile(const SharedPlan<V>& sm, int buf, int warp, int lane, float (&acc)[8][4]) {
  constexpr bool kLo = V::kSplitP;
  constexpr int kElemBytes = Traits<V::kFp8>::kElemBytes, kRowBytes = Traits<V::kFp8>::kRowBytes;
  const int prow = (lane & 7) + ((lane >> 3) & 1) * 8;
  const uint32_t pbase = ptx::smem_addr(&sm.p[0][prow][(lane >> 4) * 8]);
  const uint32_t plo = ptx::smem_addr(&sm.p[kLo ? 1 : 0][prow][(lane >> 4) * 8]) - pbase;
  // This warp's 64 latent dims: 64 (fp8) or 128 (bf16) bytes of each key row, 32 bytes an ldmatrix.
  const uint32_t vbase = ptx::smem_addr(&sm.kv[buf][prow][warp * 64 * kElemBytes + (lane >> 4) * 16]);
#pragma unroll
  for (int ks = 0; ks < kTileKeys / 16; ++ks) {
    uint32_t a[4], b[4];
    ptx::ldmatrix_x4(a, pbase + ks * 32);
    if constexpr (kLo) ptx::ldmatrix_x4(b, pbase + plo + ks * 32);
#pragma unroll
    for (int grp = 0; grp < 2 * kElemBytes; ++grp) {
      uint32_t r[4];
      ptx::ldmatrix_x4_trans(r, vbase + ks * 16 * kRowBytes + grp * 32);
      if constexpr (V::kFp8) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t lo = r[2 * h], hi = r[2 * h + 1];
          const int chunk = 2 * grp + h;
          // One byte permute puts the even dims' bytes in the low half, the odd dims' in the high.
          uint32_t even0, odd0, even1, odd1;
          ptx::fp8x4_to_f16x2x2(__byte_perm(lo, 0, 0x3120), even0, odd0);
          ptx::fp8x4_to_f16x2x2(__byte_perm(hi, 0, 0x3120), even1, odd1);
          ptx::mma_f16(acc[2 * chunk], a[0], a[1], a[2], a[3], even0, even1);
          ptx::mma_f16(acc[2 * chunk + 1], a[0], a[1], a[2], a[3], odd0, odd1);
          if constexpr (kLo) {
            ptx::mma_f16(acc[2 * chunk], b[0], b[1], b[2], b[3], even0, even1);
            ptx::mma_f16(acc[2 * chunk + 1], b[0], b[1], b[2], b[3], odd0, odd1);
          }
        }
      } else {
        ptx::mma_bf16(acc[2 * grp], a[0], a[1], a[2], a[3], r[0], r[1]);
        ptx::mma_bf16(acc[2 * grp + 1], a[0], a[1], a[2], a[3], r[2], r[3]);
        if constexpr (kLo) {
          ptx::mma_bf16(acc[2 * grp], b[0], b[1], b[2], b[3], r[0], r[1]);
          ptx::mma_bf16(acc[2 * grp + 1], b[0], b[1], b[2], b[3], r[2], r[3]);
        }
      }
    }
  }
}

// Stores the weights (a, b) at P[row][col..col+1] in 16 bits (f16 with an fp8 cache, bf16 with a
// bf16 one). With kSplitP as hi + lo: hi = their 16-bit rounding, lo = the rounding of what hi
// missed; p.v then costs two mma per fragment but keeps the weights to ~2^-20 (f16) / 2^-16
// (bf16) instead of 2^-11 / 2^-8. One rounded P alone gives o a relative error of about 3e-4
// (f16) and 2e-3 (bf16): over SPEC.md's 1e-4 for an f32 o, far under the 1e-2 of a bf16 o or of
// the step's bf16 output, so only an attend() into an f32 o pays for hi + lo (AttendParams.exact_p).
template <class V>
__device__ __forceinline__ void store_p(SharedPlan<V>& sm, int row, int col, float a, float b) {
  uint32_t hi, lo;
  if constexpr (V::kFp8) {
    const __half2 h = __floats2half2_rn(a, b);
    const float2 back = __half22float2(h);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = ptx::pack_f16x2(a - back.x, b - back.y);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const float2 back = __bfloat1622float2(h);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = ptx::pack_bf16x2(a - back.x, b - back.y);
  }
  *reinterpret_cast<uint32_t*>(&sm.p[0][row][col]) = hi;
  if constexpr (V::kSplitP) *reinterpret_cast<uint32_t*>(&sm.p[V::kSplitP ? 1 : 0][row][col]) = lo;
}

// Latent dim of accumulator element e (0..3) of n-tile j for lane quad index c.
template <bool kFp8>
__device__ __forceinline__ int dim_of(int warp, int j, int e, int c) {
  if constexpr (kFp8) return warp * 64 + (j / 2) * 16 + 4 * c + 2 * (e & 1) + (j & 1);
  else return warp * 64 + (j / 2) * 16 + (j & 1) * 8 + 2 * c + (e & 1);
}

// Stores query values x0, x1 of row r, dims d, d+1 (d even) in the tile's layout: f16 fragment-
// major (q_word) for an fp8 cache, bf16 rows for a bf16 one.
template <class V>
__device__ __forceinline__ void store_query_pair(SharedPlan<V>& sm, int r, int d, float x0, float x1) {
  if constexpr (V::kFp8) reinterpret_cast<uint32_t*>(&sm.q[0][0])[q_word(r, d)] = ptx::pack_f16x2(x0, x1);
  else *reinterpret_cast<uint32_t*>(&sm.q[r][2 * d]) = ptx::pack_bf16x2(x0, x1);
}

// The query tile in units of 8 values, every load of a thread (5 units) issued before any is used,
// 8 or 16 bytes at once where the view is aligned. At B = 1 the query prologue is on attend's
// critical path: loading pairs with each load used before the next (v1-v7) cost 22.7 µs of attend
// against 18.4 this way (H200, session 3, docs/attention.md v7b).
template <class V>
__device__ __forceinline__ void load_query_batched(SharedPlan<V>& sm, const AttendParams& p, int b, int m_base,
                                                   int rows_total, int tid) {
  constexpr int kUnitsPerRow = kRow / 8, kUnits = kMTile * kUnitsPerRow;
  constexpr int kPerThread = (kUnits + kThreads - 1) / kThreads;
  const int esize = p.q_fp8 ? 1 : 2;
  const bool vec = (reinterpret_cast<uintptr_t>(p.q) | uintptr_t(p.q_s_stride * esize) | uintptr_t(p.q_h_stride * esize)) %
                       uintptr_t(8 * esize) == 0;
  uint4 raw[kPerThread];  // fp8: 8 bytes in x, y; bf16: 8 values in x..w
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    raw[k] = make_uint4(0, 0, 0, 0);
    const int u = tid + k * kThreads;
    const int r = u / kUnitsPerRow, d = (u % kUnitsPerRow) * 8;
    if (u >= kUnits || m_base + r >= rows_total) continue;
    const int64_t off = query_offset(p, b, m_base + r, d);
    if (p.q_fp8) {
      const uint8_t* q = static_cast<const uint8_t*>(p.q) + off;
      if (vec) {
        const uint2 v = *reinterpret_cast<const uint2*>(q);
        raw[k].x = v.x;
        raw[k].y = v.y;
      } else {
        raw[k].x = uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24;
        raw[k].y = uint32_t(q[4]) | uint32_t(q[5]) << 8 | uint32_t(q[6]) << 16 | uint32_t(q[7]) << 24;
      }
    } else {
      const uint16_t* q = static_cast<const uint16_t*>(p.q) + off;
      if (vec) {
        raw[k] = *reinterpret_cast<const uint4*>(q);
      } else {
        raw[k].x = uint32_t(q[0]) | uint32_t(q[1]) << 16;
        raw[k].y = uint32_t(q[2]) | uint32_t(q[3]) << 16;
        raw[k].z = uint32_t(q[4]) | uint32_t(q[5]) << 16;
        raw[k].w = uint32_t(q[6]) | uint32_t(q[7]) << 16;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int u = tid + k * kThreads;
    if (u >= kUnits) continue;
    const int r = u / kUnitsPerRow, d = (u % kUnitsPerRow) * 8;
    const uint32_t w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x0, x1;
      if (p.q_fp8) {  // values 2e, 2e+1: bytes 2e, 2e+1 of the 8 in x, y
        const uint32_t word = e < 2 ? w[0] : w[1];
        x0 = fp8_to_float(uint8_t(word >> (16 * (e % 2))));
        x1 = fp8_to_float(uint8_t(word >> (16 * (e % 2) + 8)));
      } else {  // values 2e, 2e+1: the halves of word e
        x0 = bf16_to_float(uint16_t(w[e] & 0xFFFFu));
        x1 = bf16_to_float(uint16_t(w[e] >> 16));
      }
      store_query_pair(sm, r, d + 2 * e, x0, x1);
    }
  }
}

template <class V>
__global__ void __launch_bounds__(kThreads, V::kFp8 && V::kStages == 2 ? 2 : 1)
    attend_kernel(const __grid_constant__ AttendParams p) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<SharedPlan<V>*>(smem_raw);
  constexpr bool kFp8 = V::kFp8;
  constexpr int kStages = V::kStages;
  constexpr int kSlots = kStages + 1;
  constexpr int kElemBytes = Traits<kFp8>::kElemBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const CtaWork cta(p, kMTile, tid);
  const int rows_total = cta.rows_total, b = cta.b, split = cta.split, m_base = cta.m_base;
  // The request's local keys, this split's chunk of them, and the causal limits of this thread's
  // two rows; the tile's last visible position bounds the keys loaded at all.
  const KeyStream keys(p, b, split, cta.last_row(kMTile), cta.reporter);
  const int m0 = m_base + g, m1 = m_base + g + 8;
  const int32_t limit0 = keys.limit(p, m0, rows_total), limit1 = keys.limit(p, m1, rows_total);

  // Query tile -> shared memory in the mma type; rows past the tile's last row are zero.
  load_query_batched(sm, p, b, m_base, rows_total, tid);

  const uint8_t* cache = static_cast<const uint8_t*>(p.cache);
  const int n_tiles = keys.n_tiles();
  auto page_of = [&](int tile) { return keys.page_of(p, tile, tid); };
  auto publish = [&](const KeyRow& k, int slot) {
    if (tid < kTileKeys) keys.publish(p, k, sm.rows[slot][tid], sm.pos[slot][tid]);
  };
  // Each thread copies 16-byte chunks q, q+4, q+8, ... of one key row (4 threads a row): one row
  // address a tile, constant offsets after it, and a warp's 8 rows x 64 bytes per instruction.
  static_assert(kThreads == 4 * kTileKeys);
  auto issue_tile = [&](int slot, int buf) {
    constexpr int kChunks = kRow * kElemBytes / 16;
    const int r = tid / 4, q0 = tid % 4;
    const uint8_t* row = sm.rows[slot][r];
    const uint32_t dst = ptx::smem_addr(&sm.kv[buf][r][q0 * 16]);
    const uint8_t* src = row ? row + q0 * 16 : cache;
#pragma unroll
    for (int q = 0; q < kChunks / 4; ++q) ptx::cp_async_16(dst + q * 64, src + (row ? q * 64 : 0), row != nullptr);
    ptx::cp_async_commit();
  };

  for (int t = 0; t < kStages && t < n_tiles; ++t) publish(page_of(t), t);
  __syncthreads();  // the query tile and the first tiles' rows
  // One cp.async group per tile slot, empty past the last tile, so that wait_group counts tiles.
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < n_tiles) issue_tile(t, t);
    else ptx::cp_async_commit();
  }

  SoftmaxState st0, st1;  // rows g and g+8; d holds this thread's share of the sum
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int buf = t % kStages, slot = t % kSlots;
    ptx::cp_async_wait_group<kStages - 2>();
    // Tile t has landed for every thread, tile t+kStages-1's rows are published, and every warp
    // has finished tile t-1 (its buffer is refilled next).
    __syncthreads();
    const int next = t + kStages - 1;
    if (next < n_tiles) issue_tile(next % kSlots, next % kStages);
    else ptx::cp_async_commit();
    // The page ids of tile t+kStages: loaded now, published after q.k (the latency hides behind it).
    const KeyRow ahead = t + kStages < n_tiles ? page_of(t + kStages) : KeyRow{};

    float s[4];
    qk_tile(sm, buf, warp, lane, s);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int32_t pos = sm.pos[slot][warp * 8 + 2 * c + (e & 1)];
      s[e] = pos <= (e < 2 ? limit0 : limit1) ? s[e] * p.score_scale : -INFINITY;
    }
    if (t + kStages < n_tiles) publish(ahead, (t + kStages) % kSlots);
    float mx0 = fmaxf(s[0], s[1]), mx1 = fmaxf(s[2], s[3]);
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if (c == 0) {
      sm.red_max[warp][g] = mx0;
      sm.red_max[warp][g + 8] = mx1;
    }
    __syncthreads();  // every warp's row maxima
    float tile_max0 = -INFINITY, tile_max1 = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      tile_max0 = fmaxf(tile_max0, sm.red_max[w][g]);
      tile_max1 = fmaxf(tile_max1, sm.red_max[w][g + 8]);
    }
    // Every warp moves its states to the same maxima, so the per-thread sums add up at the end.
    const float alpha0 = st0.rescale(tile_max0), alpha1 = st1.rescale(tile_max1);
    const float p0 = st0.weight(s[0]), p1 = st0.weight(s[1]);
    const float p2 = st1.weight(s[2]), p3 = st1.weight(s[3]);
    st0.add(p0 + p1);
    st1.add(p2 + p3);
    store_p(sm, g, warp * 8 + 2 * c, p0, p1);
    store_p(sm, g + 8, warp * 8 + 2 * c, p2, p3);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      acc[j][0] *= alpha0;
      acc[j][1] *= alpha0;
      acc[j][2] *= alpha1;
      acc[j][3] *= alpha1;
    }
    __syncthreads();  // the whole P tile
    pv_tile(sm, buf, warp, lane, acc);
  }

  // Sum of the weights: over the quad, then over the warps.
  float d0 = st0.d, d1 = st1.d;
  d0 += __shfl_xor_sync(0xffffffffu, d0, 1);
  d0 += __shfl_xor_sync(0xffffffffu, d0, 2);
  d1 += __shfl_xor_sync(0xffffffffu, d1, 1);
  d1 += __shfl_xor_sync(0xffffffffu, d1, 2);
  __syncthreads();  // red_sum is free (no warp still reads red_max of the last tile)
  if (c == 0) {
    sm.red_sum[warp][g] = d0;
    sm.red_sum[warp][g + 8] = d1;
  }
  __syncthreads();
  SoftmaxState f0, f1;
  f0.m = st0.m;
  f1.m = st1.m;
  for (int w = 0; w < kWarps; ++w) {
    f0.d += sm.red_sum[w][g];
    f1.d += sm.red_sum[w][g + 8];
  }
  // Empty rows (no visible key): inv_sum() = 0 gives o = 0 and lse() = -inf.
  const float scale0 = f0.inv_sum() * p.v_scale, scale1 = f1.inv_sum() * p.v_scale;

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int m = half ? m1 : m0;
    if (m >= rows_total) continue;
    const float scale = half ? scale1 : scale0;
    const int64_t s = int64_t(b) * p.qlen + m / p.heads;
    const int h = m % p.heads;
    const int64_t base = int64_t(split) * p.o_split_stride + s * p.o_s_stride + int64_t(h) * p.o_h_stride;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = acc[j][2 * half + e] * scale;
        const int64_t off = base + dim_of<kFp8>(warp, j, e, c);
        if (p.o_bf16) static_cast<uint16_t*>(p.o)[off] = float_to_bf16(v);
        else static_cast<float*>(p.o)[off] = v;
      }
    }
    if (warp == 0 && c == 0)
      p.lse[int64_t(split) * p.lse_split_stride + s * p.lse_s_stride + int64_t(h) * p.lse_h_stride] =
          half ? f1.lse() : f0.lse();
  }
}

template <class V>
void set_smem_limit() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(attend_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(sizeof(SharedPlan<V>))));
}

template <class V>
void launch(const AttendParams& p, dim3 grid, cudaStream_t stream) {
  attend_kernel<V><<<grid, kThreads, sizeof(SharedPlan<V>), stream>>>(p);
}

// The fp8 cache with one-rounded P (the step's path): 2 stages at 2 CTAs an SM
// (default), or 4 stages at 1 CTA an SM (3 tiles in flight), chosen with MLA_ATTEND_STAGES=4 for
// measurement (docs/attention.md).
int fp8_stages() {
  static const int stages = [] {
    const char* env = std::getenv("MLA_ATTEND_STAGES");
    return env && std::atoi(env) == 4 ? 4 : 2;
  }();
  return stages;
}

// Every variant a launch can pick: {fp8, bf16} cache x {one, hi + lo} P (+ the deep fp8 one).
using Fp8 = Variant<true, false, 2>;
using Fp8Deep = Variant<true, false, 4>;
using Fp8Exact = Variant<true, true, 2>;
using Bf16 = Variant<false, false, 2>;
using Bf16Exact = Variant<false, true, 2>;

}  // namespace

void prepare_attend_kernels() {
  prepare_attend_wgmma_kernels();
  set_smem_limit<Fp8>();
  set_smem_limit<Fp8Deep>();
  set_smem_limit<Fp8Exact>();
  set_smem_limit<Bf16>();
  set_smem_limit<Bf16Exact>();
}

// The wgmma kernel's key-tile copies go through L1 (cp.async.ca): through L2 only (.cg) every 16-byte
// copy was its own L2 request and B64 took 171 µs instead of 134 (docs/attention.md, v8d).
// MLA_ATTEND_COPY=cg gives it .cg again, for measurement. (The mma.sync kernel keeps .cg: through
// L1 it was slower, 167 vs 142 µs.)
bool wgmma_l1_copies() {
  static const bool on = [] {
    const char* env = std::getenv("MLA_ATTEND_COPY");
    return !(env && std::string_view(env) == "cg");
  }();
  return on;
}

const char* attend_kernel_name(AttendKernel k) {
  static constexpr const char* kNames[] = {"mma", "wgmma", "wgmma_q_split", "wgmma_bf16", "rows", "rows_q_split",
                                           "rows_bf16"};
  static_assert(std::size(kNames) == size_t(AttendKernel::kCount));
  return k < AttendKernel::kCount ? kNames[int(k)] : "?";
}


AttendKernel launch_attend(const AttendParams& in, cudaStream_t stream) {
  if (in.batch == 0) return AttendKernel::kCount;
  AttendParams p = in;
  if (attend_wgmma_applies(p) || attend_rows_bf16_applies(p)) {
    p.l1_copies = wgmma_l1_copies();
    return launch_attend_wgmma(p, stream);
  }
  MLA_REQUIRE(p.flat_ctas == 0, "attend: the flat plan is only for the wgmma kernel");
  const dim3 grid = attend_grid(p, kMTile);
  if (!p.cache_fp8) {
    if (p.exact_p) launch<Bf16Exact>(p, grid, stream);
    else launch<Bf16>(p, grid, stream);
  } else if (p.exact_p) {
    launch<Fp8Exact>(p, grid, stream);
  } else if (fp8_stages() == 4) {
    launch<Fp8Deep>(p, grid, stream);
  } else {
    launch<Fp8>(p, grid, stream);
  }
  MLA_CUDA_CHECK_LAUNCH();
  return AttendKernel::kMma;
}

}  // namespace mla::cuda
