#pragma once
// The wgmma attend kernels' building blocks (attend_wgmma.cu, attend_rows.cu, attend_rows_bf16.cu):
// their shapes, the 16-row kernel's shared-memory layout, where a key's 16-byte chunk sits in a tile
// (cp.async core matrices or TMA's swizzled slabs), the TMA boxes and bulk row copies, the query
// tile load, P^T's store, and the V^T fragments for p.v (ldmatrix.trans, byte mask, widening). How
// they walk their segments and store results (serve_segments, sync_consumers, OutRow): attend_segments.cuh.
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/query_split.hpp"
#include "cuda/attend_keys.cuh"
#include "cuda/device_math.cuh"
#include "cuda/flat_plan.hpp"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/tma.cuh"
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
constexpr int kBf16Slabs = 2 * kRow / 128;  // a bf16 key row: nine 128-byte slabs, none of it padding

// How key tiles reach shared memory, and in which layout:
//  - kCopies: cp.async 16-byte chunks from every thread into K-major core matrices (q.k's A from
//    shared memory, wgmma::kmajor_offset);
//  - kBoxes: TMA boxes of whole pages (a power of two rows) into the 128-byte swizzled slabs, on an
//    mbarrier (q.k's A from shared memory);
//  - kRows (v24): one bulk copy a key row (cp.async.bulk, 576 bytes, any page size) into rows
//    kRowPitch bytes apart, on an mbarrier: TMA's asynchrony for pages it cannot box (a box holds
//    one page's rows, and a swizzled row of one key is five boxes). wgmma cannot read K-major rows
//    576 bytes apart from shared memory (a core matrix's rows are 16 bytes apart), so q.k takes K
//    from registers, loaded by ldmatrix (the mma.sync A layout is wgmma's register A layout).
enum class Tiles { kCopies, kBoxes, kRows };
// kRows: rows 592 bytes (148 words) apart, so the 8 rows of an ldmatrix phase start 20 words mod 32
// apart and their 16-byte chunks fall in 8 different bank quads (576 would put 4 rows on one).
constexpr int kRowPitch = kRow + 16;
constexpr int kRowTileBytes = kTileKeys * kRowPitch;

// Row tiles (Tiles::kRows): q.k's K as wgmma A fragments from registers, for warp w's keys 16 w ..
// 16 w + 15 (the mma.sync m16n8k32 A layout that wgmma's register A takes). k_frag_row: lane l's
// ldmatrix address in the tile at shared address `tile` (key row l % 8 + 8 ((l / 8) % 2), bytes
// 16 (l / 16) of a k32 step's 32); k_frag_load: the fragments of kSteps k32 steps from step `first`.
__device__ __forceinline__ uint32_t k_frag_row(uint32_t tile, int warp, int lane) {
  return tile + (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * kRowPitch + 16 * (lane >> 4);
}
template <int kSteps>
__device__ __forceinline__ void k_frag_load(uint32_t (&a)[kSteps][4], uint32_t row, int first) {
#pragma unroll
  for (int v = 0; v < kSteps; ++v) ptx::ldmatrix_x4(a[v], row + (first + v) * 32);
}

// Byte offset of a key's 16-byte chunk in a tile: K-major core matrices (cp.async), the swizzled
// slabs (TMA boxes: chunk c of a 128-byte line at c ^ (line % 8)) or plain rows (bulk row copies).
template <Tiles kTiles>
__host__ __device__ __forceinline__ constexpr int tile_offset(int key, int chunk) {
  if constexpr (kTiles == Tiles::kBoxes)
    return (chunk >> 3) * kSlabBytes + key * 128 + (((chunk & 7) ^ (key & 7)) << 4);
  else if constexpr (kTiles == Tiles::kRows) return key * kRowPitch + chunk * 16;
  else return wgmma::kmajor_offset(key, chunk);
}
// Byte offset of q.k's A operand (64 keys x 32 bytes) for k32 step `step` from the tile's start
// (the layouts wgmma reads from shared memory).
template <Tiles kTiles>
__host__ __device__ constexpr int key_step_offset(int step) {
  static_assert(kTiles != Tiles::kRows, "bulk-copied rows: q.k's A comes from registers");
  return kTiles == Tiles::kBoxes ? (step >> 2) * kSlabBytes + (step & 3) * 32 : step * 2 * wgmma::kChunkStride;
}
// Running maxima move only by more than this (log2 units): weights stay <= 2^8.
constexpr float kLazyRescale = 8.0f;

// B operands (kRowsN rows: the query tile, P^T) in K-major core matrices of 8 rows x 16 bytes:
// chunk k of row n; the descriptors' leading byte offset is the chunk stride.
template <int kRowsN>
__host__ __device__ constexpr int b_offset_n(int n, int chunk) { return chunk * (kRowsN / 8 * 128) + (n / 8) * 128 + (n % 8) * 16; }
constexpr int kBChunkStride = kN / 8 * 128;  // 256 bytes

// kQRows: the query tile's rows (kN; 2 kN for a bf16 query split into hi and lo e4m3 rows, kQSplit).
// kBf16: a bf16 cache and query (1152-byte rows: nine slabs a key tile, 72 KB; a 16-row query tile of
// 18 KB; the 16-row kernel's kBf16).
template <int kStages, Tiles kTiles, int kQRows = kN, bool kBf16 = false>
struct WgSmem {
  static constexpr bool kTma = kTiles != Tiles::kCopies;
  // key tiles, tile_offset<kTiles>
  alignas(1024) uint8_t kv[kStages][kBf16 ? kBf16Slabs * kSlabBytes
                                    : kTiles == Tiles::kBoxes ? kTmaTileBytes
                                    : kTiles == Tiles::kRows ? kRowTileBytes
                                                             : kTileBytes];
  alignas(128) uint8_t q[kQRows * kRow * (kBf16 ? 2 : 1)];  // e4m3 (bf16) query rows, b_offset_n<kQRows>(n, chunk)
  alignas(128) uint16_t p[kN * kTileKeys];  // f16 (kBf16: bf16) P^T: byte b_offset_n<kN>(n, key / 8) + 2 (key % 8)
  // cp.async: tiles t .. t+kStages: row address (null: masked) and global position (INT_MAX: masked)
  const uint8_t* rows[kTma ? 1 : kStages + 1][kTileKeys];
  int32_t pos[kTma ? 1 : kStages + 1][kTileKeys];
  float red[4][kN];  // per-warp row maxima, then row sums
  // TMA (boxes or rows): a stage's loads landed (mbarrier), and which of its keys are real (bit k:
  // key k is in the split and on a good page; the rest of the tile may hold anything, NaN included).
  alignas(8) uint64_t full[kStages];
  uint64_t empty[kStages];  // kRows: the consumer warps are done with a stage (4 arrivals)
  uint64_t key_mask[kStages][4];  // by the issuing warp (TmaTiles slots; the rest stay 0)
  int32_t flat_start[kMaxFlatBatch + 1];  // the flat plan: request b's first tile (TMA or cp.async tiles)
  KeyStream next_segment;  // the flat plan: the CTA's next segment (read by the issuing warps)
  int32_t q_exp[kQRows == kN ? 1 : kN];  // kQSplit: row n's power-of-two scale (SplitQueryTile)
};
template <int kStages, Tiles kTiles, int kQRows = kN, bool kBf16 = false>
constexpr int smem_bytes() { return int(sizeof(WgSmem<kStages, kTiles, kQRows, kBf16>)) + 1024; }  // + alignment slack

// This thread's accumulator element i (0..7) of an m64n16 wgmma: M row 16 warp + g + 8 half(i),
// N column col(i, c).
__device__ __forceinline__ int acc_half(int i) { return (i >> 1) & 1; }
__device__ __forceinline__ int acc_col(int i, int c) { return 8 * (i >> 2) + 2 * c + (i & 1); }
// The thread's 4 query rows are acc_col(i) for i = 0, 1, 4, 5; row slot r of element i:
__device__ __forceinline__ int row_slot(int i) { return 2 * (i >> 2) + (i & 1); }
__device__ __forceinline__ int slot_col(int r, int c) { return 8 * (r >> 1) + 2 * c + (r & 1); }

// P^T for p.v's B operand (b_offset_n<kRowsN>: keys along K) from the f16 weights w of a q.k
// accumulator (keys on M, the rows row0 .. row0 + 2 kAcc - 1 on N, row0 a multiple of 8): elements
// 2 m and 2 m + 1 are rows n, n + 1 of one key, so they pack into one f16x2 of the 8 x 8 block m
// (keys 16 warp + 8 (m & 1) .., rows row0 + 8 (m >> 1) ..), which stmatrix.trans stores as 8 rows
// of 8 keys, one 16-byte core-matrix row each: kAcc / 2 conversions and kAcc / 8 stores a thread
// instead of kAcc of each (st.shared.b16 of every weight, which lands keys, not rows, in pairs).
// (kBf16P: bf16 weights, for p.v against a bf16 cache's V.)
template <int kRowsN, int kAcc, bool kBf16P = false>
__device__ __forceinline__ void store_p_t(uint32_t p_smem, const float (&w)[kAcc], int row0, int warp, int lane) {
  auto pack = [](float lo, float hi) { return kBf16P ? ptx::pack_bf16x2(lo, hi) : ptx::pack_f16x2(lo, hi); };
  static_assert(kAcc % 4 == 0, "whole 8 x 8 blocks, in pairs");
  const int m = lane / 8;  // the block whose row lane % 8 this lane addresses (first of each 4)
  const uint32_t addr = p_smem + b_offset_n<kRowsN>(row0 + 8 * (m >> 1) + lane % 8, 2 * warp + (m & 1));
#pragma unroll
  for (int s = 0; s < kAcc / 8; ++s)  // blocks 4 s .. 4 s + 3: rows row0 + 16 s ..
    ptx::stmatrix_x4_trans(addr + s * 2 * 128, pack(w[8 * s], w[8 * s + 1]), pack(w[8 * s + 2], w[8 * s + 3]),
                           pack(w[8 * s + 4], w[8 * s + 5]), pack(w[8 * s + 6], w[8 * s + 7]));
  if constexpr (kAcc % 8 != 0)
    ptx::stmatrix_x2_trans(addr + kAcc / 8 * 2 * 128, pack(w[kAcc - 4], w[kAcc - 3]), pack(w[kAcc - 2], w[kAcc - 1]));
}

// The query rows m_base .. m_base + kRowsN - 1 of request b (fp8, zero past the request's rows),
// loaded into registers (load: every load of a thread issued before any is used) and stored to
// shared memory at b_offset_n<kRowsN> (store). Split in two so a kernel can issue the loads before
// it waits on something else (the page ids of its first tile) and store after.
// kElemBytes = 2 (the 16-row kernel's kBf16): bf16 rows, 72 chunks of 16 bytes each.
template <int kRowsN, int kThreadsN, int kElemBytes = 1>
struct QueryTile {
  static constexpr int kChunksE = kChunks * kElemBytes;
  static constexpr int kUnits = kRowsN * kChunksE, kPerThread = (kUnits + kThreadsN - 1) / kThreadsN;
  uint4 raw[kPerThread];

  // kFastDiv: the rows' token and head by AttendParams.heads_magic (the 16-row kernel, s22e).
  template <bool kFastDiv = false>
  __device__ __forceinline__ void load(const AttendParams& p, int b, int m_base, int rows_total, int tid) {
    const uint8_t* q = static_cast<const uint8_t*>(p.q);
    const bool vec = (reinterpret_cast<uintptr_t>(q) | uintptr_t(kElemBytes * p.q_s_stride) |
                      uintptr_t(kElemBytes * p.q_h_stride)) % 16 == 0;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      raw[k] = make_uint4(0, 0, 0, 0);
      const int u = tid + k * kThreadsN, n = u / kChunksE, chunk = u % kChunksE;
      if (u >= kUnits || m_base + n >= rows_total) continue;
      const int m = m_base + n, t = kFastDiv ? fast_div(m, p.heads_magic) : 0;
      const uint8_t* src;
      if constexpr (kElemBytes == 1)
        src = q + (kFastDiv ? query_offset(p, b, t, m - t * p.heads, chunk * 16) : query_offset(p, b, m, chunk * 16));
      else
        src = q + kElemBytes * (kFastDiv ? query_offset(p, b, t, m - t * p.heads, chunk * 16 / kElemBytes)
                                         : query_offset(p, b, m, chunk * 16 / kElemBytes));
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
  }
  __device__ __forceinline__ void store(uint8_t* q_smem, int tid) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int u = tid + k * kThreadsN;
      if (u < kUnits) *reinterpret_cast<uint4*>(&q_smem[b_offset_n<kRowsN>(u / kChunksE, u % kChunksE)]) = raw[k];
    }
  }
};

// kQSplit (attend_wgmma_kernel.cuh, MLA_ATTEND_Q_SPLIT): the kRowsN bf16 query rows m_base .. of
// request b, each scaled by its own power of two and split into two e4m3 rows (core/query_split.hpp):
// hi at row n, lo at row kRowsN + n of a 2 kRowsN-row B tile (b_offset_n<2 kRowsN>: the 16-row
// kernel's q.k takes both as one N = 32 operand), or (kLoBlock: the many-rows kernel's kQSplit, whose
// q.k reads the lo rows as k32 steps after the hi ones) hi at b_offset_n<kRowsN> and lo kRowsN x 576
// bytes after it; the row's exponent into q_exp[n]. Thread t takes row t / 8's 16-dim units
// t % 8 + 8 k (36 a row: 5 or 4 a thread, 32 bytes of bf16 each), so a row's maximum meets in its 8
// lanes by three shuffles (no barrier). Rows past the request's are zero (exponent 0); a row with an
// infinity (and no NaN) stores kQuerySplitInfRow. load issues every load before any is used.
template <int kRowsN = kN, int kThreadsN = kThreads, bool kLoBlock = false>
struct SplitQueryTile {
  static constexpr int kLanes = 8, kUnits = (kChunks + kLanes - 1) / kLanes;  // 5
  static_assert(kThreadsN == kRowsN * kLanes, "a row's units over 8 lanes of one warp");
  static constexpr int hi_offset(int n, int u) { return kLoBlock ? b_offset_n<kRowsN>(n, u) : b_offset_n<2 * kRowsN>(n, u); }
  static constexpr int lo_offset(int n, int u) {
    return kLoBlock ? kRowsN * kRow + b_offset_n<kRowsN>(n, u) : b_offset_n<2 * kRowsN>(kRowsN + n, u);
  }
  uint4 raw[kUnits][2];

  template <bool kFastDiv = true>  // (QueryTile's form: the rows' token by heads_magic either way)
  __device__ __forceinline__ void load(const AttendParams& p, int b, int m_base, int rows_total, int tid) {
    const int n = tid / kLanes, j = tid % kLanes, m = m_base + n;
    const bool valid = m < rows_total;
    const int t = fast_div(m, p.heads_magic);
    const uint16_t* row = static_cast<const uint16_t*>(p.q) + (valid ? query_offset(p, b, t, m - t * p.heads, 0) : 0);
    const bool vec = (reinterpret_cast<uintptr_t>(p.q) | uintptr_t(2 * p.q_s_stride) | uintptr_t(2 * p.q_h_stride)) %
                         16 == 0;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      raw[k][0] = raw[k][1] = make_uint4(0, 0, 0, 0);
      const int u = j + kLanes * k;
      if (!valid || u >= kChunks) continue;
      const uint16_t* src = row + 16 * u;
      if (vec) {
        raw[k][0] = reinterpret_cast<const uint4*>(src)[0];
        raw[k][1] = reinterpret_cast<const uint4*>(src)[1];
      } else {
        uint32_t w[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) w[e] = uint32_t(src[2 * e]) | uint32_t(src[2 * e + 1]) << 16;
        raw[k][0] = make_uint4(w[0], w[1], w[2], w[3]);
        raw[k][1] = make_uint4(w[4], w[5], w[6], w[7]);
      }
    }
  }
  __device__ __forceinline__ void store(uint8_t* q_smem, int32_t* q_exp, int tid) const {
    const int n = tid / kLanes, j = tid % kLanes;
    // The row's largest magnitude: bf16 magnitudes order as their bits (a NaN's above every value).
    uint32_t amax = 0;
#pragma unroll
    for (int k = 0; k < kUnits; ++k)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t w[4] = {raw[k][h].x, raw[k][h].y, raw[k][h].z, raw[k][h].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) amax = max(amax, max(w[e] & 0x7FFFu, (w[e] >> 16) & 0x7FFFu));
      }
#pragma unroll
    for (int d = 1; d < kLanes; d *= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    const int e = query_split_exponent(__uint_as_float(amax << 16));
    const float scale = pow2_float(e);
    if (j == 0) q_exp[n] = amax == 0x7F80u ? kQuerySplitInfRow : e;  // (an infinity and no NaN: s33)
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int u = j + kLanes * k;
      if (u >= kChunks) continue;
      uint32_t hi[4], lo[4];  // 16 e4m3 codes each, dim 16 u + i in byte i
      split_e4m3_x4(raw[k][0].x, raw[k][0].y, scale, hi[0], lo[0]);
      split_e4m3_x4(raw[k][0].z, raw[k][0].w, scale, hi[1], lo[1]);
      split_e4m3_x4(raw[k][1].x, raw[k][1].y, scale, hi[2], lo[2]);
      split_e4m3_x4(raw[k][1].z, raw[k][1].w, scale, hi[3], lo[3]);
      *reinterpret_cast<uint4*>(&q_smem[hi_offset(n, u)]) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(&q_smem[lo_offset(n, u)]) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  }
};

// One k16 step of V^T for this warp: for dim blocks 2j and 2j+1, the 16 dims 64 blk + 16 warp ..
// +15 x keys 16 ks .. +15 as wgmma A fragments. ldmatrix.trans on fp8 rows viewed as b16 gives
// lane (g, c) the dims (2g, 2g+1) of keys 2c and 2c+1; a byte permute splits them into dim 2g
// (fragment row g) and dim 2g+1 (row g+8). So A row r of the warp is dim 2r (r < 8) or
// 2(r - 8) + 1 of its 16: accumulator M row g + 8 h holds dim 64 blk + 16 warp + 2g + h.
// (v_load issues the ldmatrix early, v_convert makes the fragments when they are needed.)
__host__ __device__ __forceinline__ constexpr int v_key(int ks, int lane) {
  return 16 * ks + (lane & 7) + ((lane >> 3) & 1) * 8;
}
__host__ __device__ __forceinline__ constexpr int v_chunk(int j, int warp, int lane) {
  return 4 * (2 * j + (lane >> 4)) + warp;
}
template <Tiles kTiles>
__device__ __forceinline__ void v_load(uint32_t tile, int ks, int j, int warp, int lane, uint32_t (&r)[4]) {
  // (v_key's and v_chunk's formulas written out: through the functions ptxas allocated the 16-row kernel's
  // registers differently, scripts/sass-compare, and that kernel was measured in this form)
  const int key = 16 * ks + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int chunk = 4 * (2 * j + (lane >> 4)) + warp;
  ptx::ldmatrix_x4_trans(r, tile + tile_offset<kTiles>(key, chunk));
}
// v_load's address is the lane's at step 0 of block pair j0 plus constants: each layout is linear in 16 keys and 8
// chunks (the swizzle reads key & 7 and chunk & 7 only). So a loop over steps and block pairs can hold one address
// and add immediates (the many-rows kernel's p.v, s68a: ptxas had kept an address a step and pair, spilled).
template <Tiles kTiles>
inline constexpr int kVStepBytes = tile_offset<kTiles>(16, 0) - tile_offset<kTiles>(0, 0);  // ks + 1
template <Tiles kTiles>
inline constexpr int kVPairBytes = tile_offset<kTiles>(0, 8) - tile_offset<kTiles>(0, 0);  // j + 1
template <Tiles kTiles>
__host__ __device__ __forceinline__ constexpr int v_lane_offset(int j0, int warp, int lane) {
  return tile_offset<kTiles>(v_key(0, lane), v_chunk(j0, warp, lane));
}
template <Tiles kTiles>
constexpr bool v_offsets_linear() {
  for (int lane = 0; lane < 32; ++lane)
    for (int warp = 0; warp < 4; ++warp)
      for (int ks = 0; ks < kPvSteps; ++ks)
        for (int j = 0; j < kDimBlocks / 2; ++j)
          if (tile_offset<kTiles>(v_key(ks, lane), v_chunk(j, warp, lane)) !=
              v_lane_offset<kTiles>(0, warp, lane) + ks * kVStepBytes<kTiles> + j * kVPairBytes<kTiles>)
            return false;
  return true;
}
static_assert(v_offsets_linear<Tiles::kBoxes>() && v_offsets_linear<Tiles::kRows>() &&
                  v_offsets_linear<Tiles::kCopies>(),
              "v_load's address: the lane's plus a step's and a block pair's constants");
// TMA tiles (boxes or rows) are not zero-filled where keys are masked, and 0 x NaN is NaN in p.v:
// the raw V bytes of masked keys are zeroed before widening. Lane (g, c) holds keys 16 ks + 2c, +1 (r[0], r[2]) and
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

// TMA key tiles (all wgmma kernels): a tile is kTileKeys / box_rows boxes, box_rows = min(page,
// 64) keys of one page (the whole tile for pages of 64 or more), five 128-byte slabs each. The
// boxes are shared by up to 4 warps (slots(p): one a box, at most 4): lane i of warp k < slots
// loads box i * slots + k. Warp 0 alone took all of a tile's box slabs in a loop over its lanes
// (page 16: 20 a tile, inside the many-rows kernel's lock step: D 17% slower than at page 64).
// The caller loads a lane's page id a tile ahead (page_of) and issues the boxes when the stage is
// free (issue); every lane of an issuing warp (issues()) calls both, and the tile's mbarrier
// expects slots(p) arrivals.
struct TmaTiles {
  const AttendParams& p;
  const CUtensorMap* map;
  int lane, box_rows, boxes, slot, box;  // box: this lane's box (when < boxes)
  int per_slot = 0;                      // boxes / slots(p) (FastDivs only: issue<..., true>)

  __host__ __device__ static int slots(const AttendParams& params) {
    const int boxes = kTileKeys / (params.page_size < kTileKeys ? params.page_size : kTileKeys);
    return boxes < 4 ? boxes : 4;
  }
  // lane_ of warp `warp` (0..3) of the warps that share a tile.
  __device__ TmaTiles(const AttendParams& params, const CUtensorMap* cache_map, int lane_, int warp)
      : p(params), map(cache_map), lane(lane_), box_rows(min(params.page_size, kTileKeys)),
        boxes(kTileKeys / min(params.page_size, kTileKeys)), slot(warp), box(lane_ * slots(params) + warp) {}
  // The same by shifts (TMA pages are a power of two rows: attend_wgmma_uses_tma; s23a).
  __device__ static int slots_pow2(const AttendParams& params) {
    const int boxes = kTileKeys >> min(__ffs(params.page_size) - 1, kTileKeysLog2);
    return boxes < 4 ? boxes : 4;
  }
  __device__ TmaTiles(const AttendParams& params, const CUtensorMap* cache_map, int lane_, int warp, FastDivs)
      : p(params), map(cache_map), lane(lane_) {
    const int shift = min(__ffs(params.page_size) - 1, kTileKeysLog2), n_slots = slots_pow2(params);
    box_rows = 1 << shift;
    boxes = kTileKeys >> shift;
    slot = warp;
    box = lane_ * n_slots + warp;
    per_slot = boxes >> (__ffs(n_slots) - 1);
  }
  __device__ bool issues() const { return slot < slots(p); }
  __device__ bool issues_pow2() const { return slot < slots_pow2(p); }

  // This lane's box of tile `tile` of segment ks: its page's index in the request's page list
  // (-1: no box) and first local key j0.
  __device__ int64_t box_index(const KeyStream& ks, int tile, int64_t& j0) const {
    j0 = ks.k_begin + int64_t(tile) * kTileKeys + int64_t(box) * box_rows;
    if (box >= boxes || j0 >= ks.k_end) return -1;
    const int64_t page_index = j0 >> ks.page_shift;
    return page_index < ks.pages_avail ? page_index : -1;
  }
  __device__ int32_t page_of(const KeyStream& ks, int tile) const {
    int64_t j0;
    const int64_t i = box_index(ks, tile, j0);
    return i < 0 ? -1 : p.kv_indices[ks.page_begin + i];
  }
  // This warp's boxes into the stage at shared address dst, completing on mbarrier bar (its one
  // arrival a slot expects the bytes of the boxes actually issued); lane 0 writes the real keys
  // among this warp's boxes to *key_mask (the tile's: the OR over its slots; a bad page id's keys
  // are masked and reported, never read; nullptr: the caller has them from another part).
  // kSlabsN: 128-byte slabs a key row (fp8 rows: 5, the fifth half past the row and zero-filled;
  // bf16 rows of 1152 bytes: 9), from slab first_slab on (a kernel that loads a tile in parts, a
  // warpgroup's dims at a time: attend_rows_bf16.cu).
  // kUniform: the warp's boxes go out one at a time with warp-uniform operands (a box's page from
  // its lane by a shuffle), each issued by one elected lane, so ptxas keeps them in uniform
  // registers; else each lane issues its own box from its registers, and ptxas loops over the lanes
  // for every slab (ELECT, R2UR, UTMALDG, a branch). Uniform measured faster in the 16-row kernel
  // (B64 0.5-2.2%) and the 48-row many-rows CTAs (F, G 0.7-3.8%), slower in the 32- and 64-row ones
  // (qlen 2 3.3%, D 2.2%; s18d, s18e in docs/attention.md), which keep each lane's own issue. With
  // the many-rows kernel's producer warpgroup issuing (s19), uniform stayed 1-2% slower at 32 and
  // 64 rows (s19b) and each lane's own issue was within noise at 48 (s20e).
  // kPerSlot (s23a): the loop's bound and a box's slot from per_slot and slots_pow2 (FastDivs ctor).
  // kAhead = 4 (kUniform, the many-rows kernel's boxes of 1-4 rows): the boxes' rows through
  // y_scratch (16 words of the warp's, 16-byte aligned), four at a time.
  // kMulticast (the many-rows kernel's 2-CTA clusters): every CTA of the pair arms its own mbarrier
  // with the tile's bytes and masks as here, but only the one with `send` issues the boxes, into
  // both CTAs' shared memory at the same offsets (each CTA's mbarrier gets its bytes).
  // kMapUniform: the tensor map's address through a shuffle, so ptxas knows it warp-uniform and
  // keeps it in uniform registers across the box loop (else it moves it into them again a box).
  template <int kSlabsN = kSlabs, bool kUniform = true, bool kPerSlot = false, int kAhead = 1, bool kMulticast = false,
            bool kMapUniform = false>
  __device__ void issue(const KeyStream& ks, int tile, int32_t page, uint32_t dst, uint32_t bar, uint64_t* key_mask,
                        int first_slab = 0, int32_t* y_scratch = nullptr, bool send = true) const {
    int64_t j0;
    const bool have = box_index(ks, tile, j0) >= 0;
    const bool ok = have && page >= 0 && page < p.num_pages;
    if (have && !ok) atomicOr(p.error, kBadPage);
    const uint64_t mine = ok ? (box_rows == 64 ? ~0ull : ((1ull << box_rows) - 1) << (box * box_rows)) : 0ull;
    const uint64_t loaded = uint64_t(__reduce_or_sync(~0u, uint32_t(mine >> 32))) << 32 |
                            __reduce_or_sync(~0u, uint32_t(mine));
    const int64_t left = ks.k_end - (ks.k_begin + int64_t(tile) * kTileKeys);
    if (lane == 0) {
      if (key_mask) *key_mask = loaded & (left >= 64 ? ~0ull : (1ull << left) - 1);
      tma::arrive_expect_tx(bar, uint32_t(__popcll(loaded)) * 128u * kSlabsN);
    }
    __syncwarp();
    if (kMulticast && !send) return;
    const CUtensorMap* tmap = map;
    if constexpr (kMapUniform) tmap = warp_uniform(map);
    auto load = [&](uint32_t at, int x, int y) {
      if constexpr (kMulticast) tma::load_2d_multicast(at, tmap, x, y, bar, 0b11);
      else tma::load_2d(at, tmap, x, y, bar);
    };
    if constexpr (!kUniform) {
      if (ok) {
        const uint32_t at = dst + box * box_rows * 128;
        const int y = int(int64_t(page) * p.page_size + (j0 & (p.page_size - 1)));
#pragma unroll
        for (int s = 0; s < kSlabsN; ++s)
          load(at + (first_slab + s) * kSlabBytes, 128 * (first_slab + s), y);
      }
    } else {
      const int y = int(int64_t(page) * p.page_size + (j0 & (p.page_size - 1)));
      const uint32_t oks = __ballot_sync(~0u, ok);
      // lanes 0 .. boxes / slots - 1 hold the warp's boxes (box = lane slots + slot)
      if constexpr (kAhead > 1) {
        // Pages of 1-4 rows (16-64 boxes a tile, 4-16 a warp): the boxes' rows go through the
        // warp's 16 words of shared memory (y_scratch) and come back kAhead at a time by one
        // vector load, instead of a shuffle a box whose latency the uniform operand (R2UR) waits
        // for on every box (~7% of the stall samples at D, page 1, session 24).
        const int n = boxes / slots(p);
        if (lane < n) y_scratch[lane] = y;
        __syncwarp();
        static_assert(kAhead == 4 && !kPerSlot, "one 16-byte load of rows; boxes slots(p) apart");
#pragma unroll 1
        for (int k0 = 0; k0 < n; k0 += kAhead) {
          const int4 y4 = *reinterpret_cast<const int4*>(y_scratch + k0);
          const int yk[kAhead] = {y4.x, y4.y, y4.z, y4.w};
#pragma unroll
          for (int i = 0; i < kAhead; ++i) {
            const int k = k0 + i;
            if (k < n && ((oks >> k) & 1) && ptx::elect_one()) {
              const uint32_t at = dst + (k * slots(p) + slot) * box_rows * 128;
#pragma unroll
              for (int s = 0; s < kSlabsN; ++s)
                load(at + (first_slab + s) * kSlabBytes, 128 * (first_slab + s), yk[i]);
            }
            __syncwarp();
          }
        }
        __syncwarp();  // (the next call's stores after every lane's loads)
      } else {
#pragma unroll 1
        for (int k = 0; k < (kPerSlot ? per_slot : boxes / slots(p)); ++k) {
          const int yk = __shfl_sync(~0u, y, k);
          if (((oks >> k) & 1) && ptx::elect_one()) {
            const uint32_t at = dst + (k * (kPerSlot ? slots_pow2(p) : slots(p)) + slot) * box_rows * 128;
#pragma unroll
            for (int s = 0; s < kSlabsN; ++s)
              load(at + (first_slab + s) * kSlabBytes, 128 * (first_slab + s), yk);
          }
          __syncwarp();
        }
      }
    }
  }
};

// A consumer warp's arrivals on a stage's `empty` mbarrier when it is done with the stage (the
// producers wait on it: the 16-row kernel's row copies, the many-rows kernel's `release`). Where the
// stage came by bulk row copies (Tiles::kRows), every lane arrives (the count 32 a warp); on TMA boxes
// lane 0 alone, after __syncwarp. Both order every lane's reads before the producer's next copy
// into the stage (the warp barrier orders them before lane 0's arrival), but racecheck reported the
// row copies' bulk writes against lanes 1-31's ldmatrix reads under lane 0's form (2 lines on the
// 16-row kernel's page-1 tests since session 40, 2 on the 48-row clusters' copies under s41c), and
// nothing when each reading lane arrives itself (session 43, H200: the diagnostic -DMLA_LANES_ARRIVE
// on ManyRows.SmallPagesStepMatchesCpu, FlatPlan.FillFromBandwidthStepMatchesCpu and QuerySplit.*).
// The boxes' stages were clean under lane 0's form, which costs nothing there.
template <bool kRowCopies>
constexpr int kConsumerLaneArrivals = kRowCopies ? 32 : 1;

// Bulk row copies (Tiles::kRows, v24; the 16-row kernel's producer warpgroup, v26): a tile is 64
// copies of one fp8 key row (576 bytes, any page size and stride of 16 bytes) into rows kRowPitch
// bytes apart. A bulk copy takes its operands in uniform registers, so a warp issues its lanes'
// copies one after another; the 4 producer warps share a tile: lane l < 16 of warp w copies key
// 4 l + w. The producer loads a lane's page id two tiles ahead (page_of: the DRAM round trip one
// tile ahead was exposed, v26's profile) and issues when the stage is free (issue); the tile's
// mbarrier expects kWarps arrivals, one a warp with the bytes of its rows actually copied.
struct RowCopies {
  static constexpr int kWarps = 4;
  struct Row {
    int32_t page = -1;  // the page id as loaded
    bool have = false;  // a key of the segment on a page of its page list
  };
  const AttendParams& p;
  int lane, warp;
  __device__ RowCopies(const AttendParams& params, int lane_, int warp_) : p(params), lane(lane_), warp(warp_) {}

  // This lane's key of tile `tile` of segment ks (local index).
  __device__ int64_t key(const KeyStream& ks, int tile) const {
    return ks.k_begin + int64_t(tile) * kTileKeys + kWarps * lane + warp;
  }
  // (the keys of a request fit 32 bits where pages are not a power of two rows)
  __device__ int64_t page_index(const KeyStream& ks, int64_t j) const {
    return ks.page_shift >= 0 ? j >> ks.page_shift : int32_t(j) / p.page_size;
  }
  __device__ Row page_of(const KeyStream& ks, int tile) const {
    Row r;
    const int64_t j = key(ks, tile);
    if (lane >= kTileKeys / kWarps || j >= ks.k_end) return r;
    const int64_t i = page_index(ks, j);
    if (i >= ks.pages_avail) return r;  // a short page table: the stream's reporter says so
    r.have = true;
    r.page = p.kv_indices[ks.page_begin + i];
    return r;
  }
  // This warp's rows into the stage at shared address dst on mbarrier bar; lane 0 writes the real
  // keys among them (bit 4 l + warp) to *key_mask, the tile's being the OR over the 4 warps' (a bad
  // page id's key is masked and reported, never read).
  // kMulticast (the many-rows kernel's 2-CTA clusters): every CTA of the pair arms its own mbarrier
  // with the tile's bytes and masks as here, but only the one with `send` copies the rows, into both
  // CTAs' shared memory at the same offsets. So both CTAs must find the same rows (`ok`) from the
  // segment's keys alone (page ids, num_pages): a mask that differed between them (a causal cut per
  // row tile, say) would leave one CTA's mbarrier waiting for bytes that never come. The boxes'
  // multicast (above) rests on the same invariant.
  template <bool kMulticast = false>
  __device__ void issue(const KeyStream& ks, int tile, Row r, uint32_t dst, uint32_t bar, uint64_t* key_mask,
                        bool send = true) const {
    const bool ok = r.have && r.page >= 0 && r.page < p.num_pages;
    if (r.have && !ok) atomicOr(p.error, kBadPage);
    const uint32_t copied = __ballot_sync(~0u, ok);  // lanes 0..15
    if (lane == 0) {
      uint64_t m = copied & 0xFFFFu;  // lane l -> bit 4 l (+ warp below)
      m = (m | m << 24) & 0x000000FF000000FFull;
      m = (m | m << 12) & 0x000F000F000F000Full;
      m = (m | m << 6) & 0x0303030303030303ull;
      m = (m | m << 3) & 0x1111111111111111ull;
      *key_mask = m << warp;
      tma::arrive_expect_tx(bar, uint32_t(__popc(copied)) * uint32_t(kRow));
    }
    __syncwarp();
#ifdef MLA_CLUSTER_COPY_SELF
    // A diagnostic build only (`scripts/device-check cluster-race`): each CTA of a pair copies every
    // tile for itself alone (multicast to its own rank), the protocol otherwise the same, to tell
    // whether racecheck's report on the clusters' row copies needs the copy into the peer (session 39:
    // it does not, the self-copies by multicast got the same report); =2 copies them by the plain
    // bulk copy (session 39: the same report again, so not the multicast instruction); =3 (prepared)
    // drops the peer's arrivals on the stages too.
    send = true;
    [[maybe_unused]] const uint16_t cta_mask = uint16_t(1u << tma::cluster_rank());
#else
    [[maybe_unused]] const uint16_t cta_mask = 0b11;
#endif
    if (ok && (!kMulticast || send)) {
      const int64_t j = key(ks, tile);
      const int64_t in_page = ks.page_shift >= 0 ? j & (p.page_size - 1) : int32_t(j) % p.page_size;
      const uint8_t* src =
          static_cast<const uint8_t*>(p.cache) + int64_t(r.page) * p.page_stride + in_page * p.row_stride;
      const uint32_t at = dst + (kWarps * lane + warp) * kRowPitch;
#if defined(MLA_CLUSTER_COPY_SELF) && MLA_CLUSTER_COPY_SELF >= 2
      // (=2: the same self-copies by the plain bulk copy: the protocol identical, the instruction not;
      // =3 also without the peer's release of a stage: attend_rows_kernel.cuh)
      tma::load_bytes(at, src, kRow, bar);
#else
      if constexpr (kMulticast) tma::load_bytes_multicast(at, src, kRow, bar, cta_mask);
      else tma::load_bytes(at, src, kRow, bar);
#endif
    }
  }
};

}  // namespace mla::cuda::wgmma_attend
