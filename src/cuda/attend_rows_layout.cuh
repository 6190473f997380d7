#pragma once
// The many-rows kernel's layout (attend_rows_kernel.cuh, its instances in attend_rows.cu and
// attend_rows_q_split.cu): its warpgroups and named barriers, the stamps of its measured twins
// (MLA_ROWS_TIMELINE), a CTA's row shapes and its shared memory (RowsSmem, rows_smem_bytes), and the
// host's dynamic shared-memory limit a kernel instance (prepare_rows_kernel).
#include <cstdint>

#include "cuda/attend_keys.cuh"
#include "cuda/attend_segments.cuh"
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/check.hpp"
#include "cuda/flat_plan.hpp"
#include "cuda/stages.hpp"

namespace mla::cuda {
// (internal linkage, as the kernel: each translation unit compiles the instances it launches)
namespace {

using namespace wgmma_attend;

constexpr int kGroups = 2;                      // consumer warpgroups
constexpr int kRowThreads = 128 * kGroups;      // the consumers
template <bool kTma>
constexpr int kRowsCtaThreads = kTma ? kRowThreads + 128 : kRowThreads;  // TMA: + the producer warpgroup
// Named barriers kPtBarrier + w (w = 0, 1): warpgroup w's p.v of the previous pair is done (it has
// read the other's rows of P^T); after sync_consumers' kConsumerBarrier.
constexpr int kPtBarrier = kConsumerBarrier + 1;
constexpr int kGroupDimBlocks = kDimBlocks / kGroups;  // p.v: 4 blocks of 64 dims a warpgroup
constexpr int kQkGroup = 2;                     // k32 steps an f32-summed q.k accumulator takes
// kStamps (MLA_ROWS_TIMELINE, a measurement; session 55): consumer thread 0 stamps the SM clock (clock64) at a CTA's
// phases into p.timeline[kRowsStampWords x CTA + word]: word 0 the SM id + 1, word 1 the CTA's start, then for each of
// its first kRowsStampSegments segments kRowsSegmentWords words (RowsSegmentStamp). kStamps = kStampsNoStore (a probe,
// MLA_ROWS_TIMELINE_PROBE=nostore; results wrong): the same without o's and lse's stores, so the epilogue's time
// without them shows what the stores cost (session 55's stamps: 8.3 µs at F, 14.6 at D, the CTAs ending together).
constexpr int kStampsNoStore = 2;
enum RowsSegmentStamp : int {
  kSegEntry,        // serve entered (the segment's keys published to the consumers)
  kSegPrologue,     // the query stored and the consumers' barrier passed (the pair loop starts)
  kSegFirstLanded,  // warpgroup 0's wait for the first pair's tile 0 passed
  kSegLastPv,       // the last pair's p.v retired (the epilogue starts)
  kSegEnd,          // o and lse stored
  kSegTiles,        // (a count, not a time: the segment's tiles)
  kSegLastPv1,      // the epilogue's parts (session 56): warpgroup 1's thread 0 (tid 128) past its last p.v,
  kSegSums,         // thread 0 past the row sums' second barrier (every consumer warp has come to the epilogue),
  kSegFinal,        // and past the third (the rows' final state in shared memory: o's stores start)
  kRowsSegmentWords
};
constexpr int kRowsStampSegments = 8;
// And each consumer warpgroup's thread 0 (tids 0 and 128) stamps the first kRowsStampPairs pairs of the CTA's first
// segment (session 63, s67a: where a pair's ~5900 cycles go at D; the pipe model in docs/attention.md's plan):
// pair j of warpgroup w at word kRowsPairBase + (w kRowsStampPairs + j) kRowsPairEvents + event.
enum RowsPairStamp : int {
  kPairQkIssued,   // the pair's first q.k groups issued and the previous pair's p.v retired (pv_done)
  kPairQkDone,     // q.k's last group retired and summed (the scores in registers)
  kPairPtFree,     // masked, growth checked, past the other warpgroup's p.v of the previous pair (P^T free; session 66)
  kPairPWritten,   // P^T written (both tiles), before the pair's barrier and vote
  kPairVoted,      // past that barrier (both warpgroups' P^T; the lazy rescale's vote)
  kPairPvIssued,   // p.v's MMAs issued (its last step in flight)
  kPairNextLanded, // the first of the stamps from kPairQkDone on at which pair j + 1's first q.k tile (tile 0; the split
                   // q.k: tile wg) had landed, polled without waiting; 0 if not by kPairPvIssued or no next pair
                   // (session 67: can pair j + 1's q.k start under pair j's softmax, with two stages?)
  kRowsPairEvents
};
constexpr int kRowsStampPairs = 16;
constexpr int kRowsPairBase = 2 + kRowsStampSegments * kRowsSegmentWords;
constexpr int kRowsStampWords = kRowsPairBase + kGroups * kRowsStampPairs * kRowsPairEvents;

// A CTA's query rows (wgmma N of p.v): kAttendRowsPerCta (64), or 48 or 32 where that many CTAs a
// request hold its rows (48 rows of 12 heads x qlen 4, 96 of 12 x 8 or 96 heads, 32 of 16 x 2:
// 64-row CTAs padded their MMAs and softmax with rows past the request's).
template <int kRowsN>
struct RowShape {
  static_assert(kRowsN == 64 || kRowsN == 48 || kRowsN == 32, "64-, 48- or 32-row CTAs");
  static constexpr int kWgRows = kRowsN / kGroups;         // q.k's N: a warpgroup's rows (32, 24, 16)
  static constexpr int kPvAcc = kRowsN / 2;                // a thread's o of one dim block (32, 24, 16)
  static constexpr int kRowChunkStride = kRowsN / 8 * 128;  // B operands' leading byte offset
};

// kQSplit (a bf16 query split into hi and lo e4m3 rows, 32-row CTAs: attend_rows_q_split.cu): the
// query tile twice (the lo rows after the hi ones, SplitQueryTile's kLoBlock) and the rows' exponents.
template <int kRowsN, bool kQSplit = false>
struct RowsSmem {
  alignas(1024) uint8_t kv[2][kGroups][kTmaTileBytes];  // [stage][tile of the pair], swizzled slabs
  alignas(128) uint8_t q[kRowsN * kRow * (kQSplit ? 2 : 1)];  // e4m3 query rows, b_offset_n<kRowsN>
  alignas(128) uint16_t p[kGroups][kRowsN * kTileKeys]; // f16 P^T of each tile of the pair
  float red[kGroups * 4][kRowsN];                       // per-warp row maxima, then row sums
  int32_t limit[kRowsN];                                // a row's last visible position (causal)
  float alpha[kRowsN];                                  // a row's rescale factor (lazy rescale)
  float final_m[kRowsN], final_d[kRowsN];               // a row's softmax state at the end
  alignas(8) uint64_t full[2][kGroups];                 // a tile landed (mbarrier: an arrival a slot)
  uint64_t empty[2];                                    // a stage's pair (kTileRelease: tile 0) consumed (an arrival a consumer warp)
  uint64_t key_mask[2][kGroups][4];                     // its real keys, by the warp that issued them
  const uint8_t* rows[2][kGroups][kTileKeys];           // cp.async tiles: [pair & 1][tile]: row or null (masked)
  int32_t flat_start[kMaxFlatBatch + 1];
  KeyStream segment;
  uint64_t empty1[2];                                   // kTileRelease: a stage's tile 1 consumed
  alignas(16) int32_t box_y[4][16];                     // small boxes: a producer warp's box rows (TmaTiles::issue)
  int32_t q_exp[kQSplit ? kRowsN : 1];                  // kQSplit: row n's power-of-two scale (SplitQueryTile)
  int32_t edge_pair[2][4];                              // 64 rows (s72a): a consumer warp's first pair past the edge
};
template <int kRowsN, bool kQSplit = false>
constexpr int rows_smem_bytes() { return int(sizeof(RowsSmem<kRowsN, kQSplit>)) + 1024; }
static_assert(rows_smem_bytes<64>() <= 227 * 1024, "over the H200's shared memory a block");
// An instance's dynamic shared-memory limit (host; once a process, before its first launch).
template <auto kKernel, int kRowsN, bool kQSplit = false>
void prepare_rows_kernel() {
  MLA_CUDA_CHECK(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, rows_smem_bytes<kRowsN, kQSplit>()));
}
static_assert(rows_smem_bytes<32, true>() <= 227 * 1024 && rows_smem_bytes<48, true>() > 227 * 1024,
              "the split query fits 32-row CTAs only");
static_assert(kRowTileBytes <= kTmaTileBytes, "bulk-copied rows (kRowCopies) in a box tile's place");

}  // namespace
}  // namespace mla::cuda
