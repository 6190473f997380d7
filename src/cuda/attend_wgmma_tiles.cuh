#pragma once
// The wgmma attend kernel's building blocks (attend_wgmma.cu): its shapes, the shared-memory layout
// of a CTA, where a key's 16-byte chunk sits in a tile (cp.async core matrices or TMA's swizzled
// slabs), the query tile load, and the V^T fragments for p.v (ldmatrix.trans, byte mask, widening).
// Only attend_wgmma.cu includes it.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attend_keys.cuh"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/wgmma.cuh"

namespace mla::cuda::wgmma_attend {

constexpr int kN = 16;           // query rows a CTA: wgmma N
constexpr int kThreads = 128;    // one warpgroup
constexpr int kChunks = kRow / 16;  // 36 chunks of 16 bytes a key row
constexpr int kTileBytes = kChunks * wgmma::kChunkStride;
constexpr int kQkSteps = kRow / 32;  // 18 k32 steps
constexpr int kQkWave = 9;           // q.k accumulators in flight at once (registers)
constexpr int kDimBlocks = kLatent / 64;  // p.v: 8 wgmma M blocks of 64 latent dims
constexpr int kPvSteps = kTileKeys / 16;  // p.v: 4 k16 steps a tile
static_assert(kTileKeys == wgmma::kTileRows);
// TMA tiles: five slabs of 64 keys x 128 bytes in the 128-byte swizzle (the fifth half past the
// 576-byte row: zero-filled, never read), one 2-D box of the cache viewed as [rows, 576] each.
constexpr int kSlabBytes = kTileKeys * 128;
constexpr int kSlabs = (kRow + 127) / 128;
constexpr int kTmaTileBytes = kSlabs * kSlabBytes;

// Byte offset of a key's 16-byte chunk in a tile: K-major core matrices (cp.async) or the swizzled
// slabs (TMA: chunk c of a 128-byte line at c ^ (line % 8)).
template <bool kTma>
__device__ __forceinline__ int tile_offset(int key, int chunk) {
  if constexpr (kTma) return (chunk >> 3) * kSlabBytes + key * 128 + (((chunk & 7) ^ (key & 7)) << 4);
  else return wgmma::kmajor_offset(key, chunk);
}
// Byte offset of q.k's A operand (64 keys x 32 bytes) for k32 step `step` from the tile's start.
template <bool kTma>
__host__ __device__ constexpr int key_step_offset(int step) {
  return kTma ? (step >> 2) * kSlabBytes + (step & 3) * 32 : step * 2 * wgmma::kChunkStride;
}
// Running maxima move only by more than this (log2 units): weights stay <= 2^8.
constexpr float kLazyRescale = 8.0f;

// B operands (16 rows) in K-major core matrices of 8 rows x 16 bytes: chunk k of row n.
constexpr int kBChunkStride = kN / 8 * 128;  // 256 bytes: the descriptors' leading byte offset
__host__ __device__ constexpr int b_offset(int n, int chunk) { return chunk * kBChunkStride + (n / 8) * 128 + (n % 8) * 16; }

template <int kStages, bool kTma>
struct WgSmem {
  alignas(1024) uint8_t kv[kStages][kTma ? kTmaTileBytes : kTileBytes];  // key tiles, tile_offset<kTma>
  alignas(128) uint8_t q[kN * kRow];        // e4m3 query rows, b_offset(n, chunk)
  alignas(128) uint16_t p[kN * kTileKeys];  // f16 weights: byte b_offset(n, key / 8) + 2 (key % 8)
  // cp.async: tiles t .. t+kStages: row address (null: masked) and global position (INT_MAX: masked)
  const uint8_t* rows[kTma ? 1 : kStages + 1][kTileKeys];
  int32_t pos[kTma ? 1 : kStages + 1][kTileKeys];
  float red[4][kN];  // per-warp row maxima, then row sums
  // TMA: a stage's loads landed (mbarrier), and which of its keys are real (bit k: key k is in the
  // split and on a good page; the rest of the tile may hold anything, NaN included).
  alignas(8) uint64_t full[kStages];
  uint64_t key_mask[kStages];
  int32_t flat_start[kTma ? kMaxFlatBatch + 1 : 1];  // the flat plan: request b's first tile
  KeyStream next_segment;  // the flat plan: the CTA's next segment (read by warp 0 at a boundary)
};
template <int kStages, bool kTma>
constexpr int smem_bytes() { return int(sizeof(WgSmem<kStages, kTma>)) + 1024; }  // + alignment slack

// This thread's accumulator element i (0..7) of an m64n16 wgmma: M row 16 warp + g + 8 half(i),
// N column col(i, c).
__device__ __forceinline__ int acc_half(int i) { return (i >> 1) & 1; }
__device__ __forceinline__ int acc_col(int i, int c) { return 8 * (i >> 2) + 2 * c + (i & 1); }
// The thread's 4 query rows are acc_col(i) for i = 0, 1, 4, 5; row slot r of element i:
__device__ __forceinline__ int row_slot(int i) { return 2 * (i >> 2) + (i & 1); }
__device__ __forceinline__ int slot_col(int r, int c) { return 8 * (r >> 1) + 2 * c + (r & 1); }

// The query rows m_base .. m_base+15 of request b (fp8, zero past the request's rows) into
// shared memory, every load of a thread issued before any store.
template <int kStages, bool kTma>
__device__ __forceinline__ void load_query(WgSmem<kStages, kTma>& sm, const AttendParams& p, int b, int m_base,
                                           int rows_total, int tid) {
  constexpr int kUnits = kN * kChunks, kPerThread = (kUnits + kThreads - 1) / kThreads;
  const uint8_t* q = static_cast<const uint8_t*>(p.q);
  const bool vec = (reinterpret_cast<uintptr_t>(q) | uintptr_t(p.q_s_stride) | uintptr_t(p.q_h_stride)) % 16 == 0;
  uint4 raw[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    raw[k] = make_uint4(0, 0, 0, 0);
    const int u = tid + k * kThreads, n = u / kChunks, chunk = u % kChunks;
    if (u >= kUnits || m_base + n >= rows_total) continue;
    const uint8_t* src = q + query_offset(p, b, m_base + n, chunk * 16);
    if (vec) {
      raw[k] = *reinterpret_cast<const uint4*>(src);
    } else {
      uint32_t w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w[e] = uint32_t(src[4 * e]) | uint32_t(src[4 * e + 1]) << 8 | uint32_t(src[4 * e + 2]) << 16 |
               uint32_t(src[4 * e + 3]) << 24;
      raw[k] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int u = tid + k * kThreads;
    if (u < kUnits) *reinterpret_cast<uint4*>(&sm.q[b_offset(u / kChunks, u % kChunks)]) = raw[k];
  }
}

// One k16 step of V^T for this warp: for dim blocks 2j and 2j+1, the 16 dims 64 blk + 16 warp ..
// +15 x keys 16 ks .. +15 as wgmma A fragments. ldmatrix.trans on fp8 rows viewed as b16 gives
// lane (g, c) the dims (2g, 2g+1) of keys 2c and 2c+1; a byte permute splits them into dim 2g
// (fragment row g) and dim 2g+1 (row g+8). So A row r of the warp is dim 2r (r < 8) or
// 2(r - 8) + 1 of its 16: accumulator M row g + 8 h holds dim 64 blk + 16 warp + 2g + h.
// (v_load issues the ldmatrix early, v_convert makes the fragments when they are needed.)
template <bool kTma>
__device__ __forceinline__ void v_load(uint32_t tile, int ks, int j, int warp, int lane, uint32_t (&r)[4]) {
  const int key = 16 * ks + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int chunk = 4 * (2 * j + (lane >> 4)) + warp;
  ptx::ldmatrix_x4_trans(r, tile + tile_offset<kTma>(key, chunk));
}
// TMA tiles are not zero-filled where keys are masked, and 0 x NaN is NaN in p.v: the raw V bytes
// of masked keys are zeroed before widening. Lane (g, c) holds keys 16 ks + 2c, +1 (r[0], r[2]) and
// 16 ks + 8 + 2c, +1 (r[1], r[3]), one 16-bit half each.
__device__ __forceinline__ void v_mask(uint32_t (&r)[4], uint64_t key_mask, int ks, int c) {
  const uint32_t bits = uint32_t(key_mask >> (16 * ks + 2 * c));
  const uint32_t lo = ((bits & 1) ? 0xFFFFu : 0u) | ((bits & 2) ? 0xFFFF0000u : 0u);
  const uint32_t hi = ((bits & 0x100) ? 0xFFFFu : 0u) | ((bits & 0x200) ? 0xFFFF0000u : 0u);
  r[0] &= lo, r[2] &= lo, r[1] &= hi, r[3] &= hi;
}
__device__ __forceinline__ void v_convert(const uint32_t (&r)[4], uint32_t (&a0)[4], uint32_t (&a1)[4]) {
  ptx::fp8x4_to_f16x2x2(__byte_perm(r[0], 0, 0x3120), a0[0], a0[1]);  // keys 2c, 2c+1
  ptx::fp8x4_to_f16x2x2(__byte_perm(r[1], 0, 0x3120), a0[2], a0[3]);  // keys 2c+8, 2c+9
  ptx::fp8x4_to_f16x2x2(__byte_perm(r[2], 0, 0x3120), a1[0], a1[1]);
  ptx::fp8x4_to_f16x2x2(__byte_perm(r[3], 0, 0x3120), a1[2], a1[3]);
}

}  // namespace mla::cuda::wgmma_attend
