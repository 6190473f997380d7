#pragma once
// The bf16 many-rows kernel's layout (attend_rows_bf16.cu, the kernel and its instances): its shapes, named
// barriers and tile stamps (s52a), its shared memory (Bf16RowsSmem), and the query's two paths into q.k: dims
// 0..511 through shared memory (QueryRowsBf16) and the rope dims as register A fragments (load_rope).
#include <cstdint>

#include "cuda/attend_keys.cuh"
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/stages.hpp"
#include "cuda/wgmma.cuh"

namespace mla::cuda {
// (internal linkage, as the kernel: attend_rows_bf16.cu compiles the instances it launches)
namespace {

using namespace wgmma_attend;

constexpr int kRowsM = kAttendRowsPerCta;              // query rows a CTA: wgmma M (64)
constexpr int kGroups = 2;                             // warpgroups
constexpr int kThreadsB = 128 * kGroups;
constexpr int kRowSlabs = 2 * kRow / 128;              // 128-byte slabs of a bf16 key row (9)
constexpr int kTileBytesB = kRowSlabs * kSlabBytes;    // 72 KB
constexpr int kDimSlabs = kLatent / 64 / kGroups;      // slabs of a warpgroup's dims (4)
constexpr int kRopeSlab = kLatent / 64;                // the rope dims' slab (8), then P
constexpr int kQkSmemSteps = kLatent / 16;             // q.k k16 steps from shared memory (32)
constexpr int kRopeSteps = (kRow - kLatent) / 16;      // ... and from registers (4)
constexpr int kPvSteps = kTileKeys / 16;               // p.v k16 steps a tile (4)
constexpr int kHalfDims = kLatent / kGroups;           // o's dims a warpgroup (256)
constexpr int kChunkStrideM = kRowsM / 8 * 128;        // K-major core-matrix tiles of 64 rows: 1024
constexpr int kQChunks = kLatent * 2 / 16;             // the query's 16-byte chunks in shared memory (64)
constexpr int kBarPublished = 1;                       // + w: warpgroup w published a tile (named barrier)
constexpr int kBarGroup = 3;                           // + w: warpgroup w's 128 threads
// kStamps (s52a): a tile's events, each stamped once (SM clock) by the first thread of the warpgroup named.
enum RowsStamp : int {
  kStampIssueOwner,      // the owner warpgroup issued its part of the tile (its dims' slabs)
  kStampIssueOther,      // the other warpgroup issued its part (its dims' slabs and the rope slab)
  kStampQkStart,         // owner: q.k(t) called (before its first slab wait)
  kStampFirstSlab,       // owner: q.k's first slab wait passed
  kStampQkIssued,        // owner: every slab waited for and q.k's MMAs issued
  kStampQkDone,          // owner: q.k(t) retired (by default with pv_other(t - 1)'s p.v, whose wait it is)
  kStampPublished,       // owner: the publication barrier of tile t passed (own)
  kStampPvDone,          // owner: its p.v(t) retired
  kStampOtherPublished,  // other: its pv_other(t) barrier passed
  kStampSegmentStart,    // a segment's first tile: warpgroup 0 entered serve (before the query's loads)
  kStampSegmentEnd,      // a segment's last tile: warpgroup 0 stored its share of o and lse (the epilogue's end)
  kStampSmid,            // tile 0's word: the SM id (+ 1, so 0 means "not stamped")
  kStampWords
};
constexpr int kStampTiles = 512;  // tiles a CTA stamped (E's 512 a CTA at one split), over all its segments
static_assert(kTileKeys / 8 * kChunkStrideM == kSlabBytes, "P [64 rows x 64 keys] fills the rope slab");

struct Bf16RowsSmem {
  alignas(1024) uint8_t kv[2][kTileBytesB];              // [buffer], swizzled slabs (tile_offset<Tiles::kBoxes>)
  alignas(128) uint8_t q[kQChunks * kChunkStrideM];     // dims 0..511: wgmma::kmajor_offset(row, chunk)
  float m_pub[2][kRowsM];                                // the running maxima after tile j ([j & 1], log2 units)
  float red[kGroups][kRowsM];                            // each warpgroup's share of the row sums
  int32_t limit[kRowsM];                                 // a row's last visible position (causal)
  alignas(8) uint64_t full[2][3];                        // [buffer][part]: warpgroup 0's, 1's slabs, the rope slab
  uint64_t key_mask[2][kGroups][4];                      // a tile's real keys, by each warpgroup's issuing warps
  int32_t flat_start[kMaxFlatBatch + 1];
  KeyStream segment;
  alignas(8) uint64_t slab_full[2][kRowSlabs];           // kSlabBars: [buffer][slab] (0-3 warpgroup 0's, 4-7 1's, 8 rope)
};
constexpr int bf16_rows_smem_bytes() { return int(sizeof(Bf16RowsSmem)) + 1024; }
static_assert(bf16_rows_smem_bytes() <= 227 * 1024, "over the H200's shared memory a block");

// The query rows m_base .. m_base + 63 (zero past the request's): dims 0..511 to shared memory in
// K-major core matrices, through registers (load, then store: a kernel issues the loads before it
// waits on something else), a warp 8 rows x 4 chunks an instruction so both sides are dense
// (64 contiguous bytes a row; 8 rows' 16-byte chunks on distinct banks a quarter warp).
struct QueryRowsBf16 {
  static constexpr int kPerThread = kRowsM * kQChunks / kThreadsB;  // 16
  uint4 raw[kPerThread];

  __device__ __forceinline__ static void rc(int tid, int k, int& row, int& chunk) {
    const int unit = tid / 32 + k * (kThreadsB / 32), lane = tid % 32;  // 128 units of 8 rows x 4 chunks
    row = 8 * (unit % 8) + lane % 8;
    chunk = 4 * (unit / 8) + lane / 8;
  }
  __device__ __forceinline__ void load(const AttendParams& p, int b, int m_base, int rows_total, int tid) {
    const uint16_t* q = static_cast<const uint16_t*>(p.q);
    const bool vec = (reinterpret_cast<uintptr_t>(q) | uintptr_t(2 * p.q_s_stride) | uintptr_t(2 * p.q_h_stride)) % 16 == 0;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      int row, chunk;
      rc(tid, k, row, chunk);
      raw[k] = make_uint4(0, 0, 0, 0);
      if (m_base + row >= rows_total) continue;
      const uint16_t* src = q + query_offset(p, b, m_base + row, 8 * chunk);
      if (vec) {
        raw[k] = *reinterpret_cast<const uint4*>(src);
      } else {
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = uint32_t(src[2 * e]) | uint32_t(src[2 * e + 1]) << 16;
        raw[k] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
  __device__ __forceinline__ void store(uint8_t* q_smem, int tid) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      int row, chunk;
      rc(tid, k, row, chunk);
      *reinterpret_cast<uint4*>(&q_smem[wgmma::kmajor_offset(row, chunk)]) = raw[k];
    }
  }
};

// The query's rope dims (512..575) as q.k's register A fragments: k16 step ks, this warp's rows
// 16 warp + g (a[0], a[2]) and + 8 (a[1], a[3]), dims 512 + 16 ks + 2c, +1 (a[0], a[1]) and + 8 (a[2], a[3]).
__device__ __forceinline__ void load_rope(const AttendParams& p, int b, int m_base, int rows_total, int warp, int g,
                                          int c, uint32_t (&a)[kRopeSteps][4]) {
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m_base + 16 * warp + g + 8 * h;
    const uint16_t* row = m < rows_total ? q + query_offset(p, b, m, kLatent) : nullptr;
#pragma unroll
    for (int ks = 0; ks < kRopeSteps; ++ks)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = 16 * ks + 8 * e + 2 * c;
        a[ks][h + 2 * e] = row ? uint32_t(row[d]) | uint32_t(row[d + 1]) << 16 : 0u;
      }
  }
}

}  // namespace
}  // namespace mla::cuda
