#pragma once
// attend for many query rows a key (issue 5, v13): 128 heads, qlen 2-8, DCP-gathered heads.
//
// The 16-row wgmma kernel (attend_wgmma.cu) reads each key tile from L2 and widens its V once for
// every 16 query rows: at 128 heads a tile is read 8 times and widened 8 times, and its small MMAs
// (N = 16) leave the tensor cores idle (D: 13% of copy, 267 TFLOP/s). Here a CTA takes 64 query
// rows with two consumer warpgroups at one CTA an SM, and streams key tiles in pairs (keys on
// wgmma's M side as in the 16-row kernel, query rows on N):
//   q.k:  warpgroup w scores both tiles for its 32 rows 32 w .. 32 w + 31:
//         S^T [64 keys x 32 rows] = K . Q^T  (QGMMA m64n32k32 e4m3, in 2-step f32 groups as the
//         16-row kernel: the fp8 MMA's accumulator is short; one tile's group summed while the
//         other tile's runs)
//   softmax: a warpgroup keeps its rows' running state (8 rows a thread); the maxima move lazily
//         (only when a score passes one by more than 2^8) and every row's rescale factor goes
//         through shared memory, since o holds all 64 rows; P^T of both tiles in shared memory as f16
//   p.v:  warpgroup w owns latent dims 256 w .. 256 w + 255 of o for all 64 rows:
//         O^T [256 x 64] += V^T . P^T  over both tiles in one stream of 8 k16 steps (HGMMA
//         m64n64k16, V^T fragments from the fp8 tile by ldmatrix.trans and widening in registers)
// so a tile is read from L2 once for 64 rows and widened twice (once a warpgroup, each its dims).
// Tiles come by TMA (pages of a power of two rows; pages of 1-4 rows as one box a key row since
// session 24), issued by a producer warpgroup beside the two consumers (s19), or, for other pages
// (not a power of two), gathered a row at a time by cp.async into the same layout
// (v17): pair j + 1's rows go out after pair j's q.k, at the barrier that says both warpgroups
// finished pair j - 1, warpgroup u's 128 threads copying tile u. The step's partials only, as the
// 16-row kernel (its accuracy: attend_wgmma.cu); the flat plan and fixed splits alike. Shared
// memory: 2 stages x 2 tiles x 40 KB + the 36 KB query + 16 KB P^T (RowsSmem, attend_rows_layout.cuh, with the
// warpgroups' constants and the measured twins' stamp layout).
// CTAs of 48 or 32 rows (N = 48 / 32, a warpgroup's q.k N = 24 / 16) where a request needs no more
// of them than of 64-row ones (attend_rows_cta_rows; s15a, s15b: 12 heads x qlen 4 or 8 and 96
// heads 10-12% faster than padded 64-row CTAs, 17-32 rows ~1.25x faster than the 16-row kernel).
// Measured versions (H200): docs/attention.md, v13-v13i, v15 (reverted), s15a-s19 (s17b/c: a
// single-tile pipeline, 19-25% slower, removed; s18: fewer instructions a pair, the same time),
// s29 (48- and 32-row CTAs: q.k split by tile, kSplitQk below).
// (The kernel itself, included by attend_rows.cu, which launches its instances, and by
// attend_rows_q_split.cu, its bf16-query instance (kQSplit) in a translation unit of its own, as the
// 16-row kernel's (attend_wgmma_kernel.cuh): ptxas inlines shared device code differently with
// another caller beside the measured instances.)
#include <cuda_fp16.h>

#include <climits>
#include <type_traits>

#include "core/query_split.hpp"
#include "core/softmax_state.hpp"
#include "cuda/attend_keys.cuh"
#include "cuda/attend_rows_layout.cuh"
#include "cuda/attend_segments.cuh"
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/flat_plan.hpp"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/tma.cuh"
#include "cuda/wgmma.cuh"

namespace mla::cuda {
// (internal linkage, as attend_wgmma_kernel.cuh: each translation unit compiles the instances it launches)
namespace {

using namespace wgmma_attend;

// kTma: tiles as whole pages by TMA, issued by a third warpgroup, the producer (s19): it loads
// the page ids and issues every pair's boxes once the consumer warps have arrived on the stage's
// `empty` mbarrier (after their last read of it: p.v's V fragments), so the consumers only wait on
// `full`, and p.v's last MMAs of pair j - 1 drain under pair j's first q.k groups (s16a). The
// consumer warps issued the boxes before (s16-s18): in s18's profiles at F, 11.6% of the stall
// samples were three warps of a warpgroup waiting at tile 0's second q.k group for the one that
// waited on `empty` and issued them; with the producer, D 10%, F 12%, G 12%, 96 heads 13%, qlen 2
// 15%, page 16 12-19%, small batches 8-9% faster (s19a, one run). The producer gives its registers
// to the consumers (setmaxnreg: 24 + 2 x 240 a thread; the 64-row consumers spill a little at 240).
// At 32 and 48 rows each tile of a stage is released on its own (kTileRelease, s20a): tile 0 once
// the consumer warps have its last V fragments in registers, half a p.v before tile 1, and the
// consumers wait for tile 1 only after tile 0's first q.k group went out; F, G, 96 heads, 48 rows
// at B = 16 0.6-1.1% faster, 24 rows at B = 16 1.6%, u32768 at qlen 4 0.3% slower; at 64 rows
// (D) 1.7% slower, so 64-row CTAs release the pair at once (one run, GPU-0bdf7e1c).
// The consumers meet at one barrier a pair (s19c: 1.3-2.5% faster than a second one for the lazy
// rescale's vote): P^T is written before the vote and again only if some row grows (write_p).
// kSmallBoxes (pages of 1-4 rows, session 24): a box holds 1-4 rows of one page (TmaTiles: 16-64
// boxes of five slabs a tile), issued with warp-uniform operands at every height, a box after
// another; kAhead = 4: their rows come four at a time from shared memory (box_y) rather than by a
// shuffle each. Boxed, D at page 1 is 1.19x page 64 where the consumers' gathers took 1.59x;
// pages 2 and 4 within 5% of page 64 (docs/attention.md, session 24). The producer warpgroup
// gathering rows by cp.async instead was 6-27% slower than the consumers' own gathers.
// Else (pages not a power of two) the tiles are gathered a row at a time by cp.async from the
// consumer threads, in the same swizzled layout, completing on the same mbarriers: pair j + 1's rows
// are published and copied at pair j's barrier (the session-15 order).
// kMapUniform (page 1): TmaTiles::issue's tensor map address warp-uniform (its box loop then has no
// per-box ELECT and no R2UR of the map: 122 instructions for four boxes instead of 158 at 32 rows).
// kSplitQk (s29; the 48- and 32-row CTAs' TMA instances, MLA_ATTEND_SPLIT_QK=0: without): q.k
// split by tile instead of by rows: warpgroup w scores tile w of the pair for all the CTA's rows
// (QGMMA m64n48k32 / m64n32k32 where each took m64n24k32 / m64n16k32 of both tiles). A QGMMA from
// shared memory takes as long as reading its operands at 128 bytes a clock (H200,
// bench/wgmma_rate.cu: 16 + N / 4 clocks an m64nNk32 with two warpgroups issuing: A's 2 KB of keys,
// then N rows x 32 bytes), so reading each key block once for all the rows instead of once a
// warpgroup takes a pair's q.k from 1584 to 1008 clocks at 48 rows (F, G, 96 heads, qlen 2 7-10%
// faster, s29b). The softmax state then covers all the rows in each warpgroup (a thread's rows are
// its o columns: the lazy rescale's alpha stays in registers), the maxima meet only where a row
// grows (as before), and each warpgroup's row sums cover its tile (added at the end).
template <bool kTma, int kRowsN, bool kSmallBoxes = false, int kAhead = 1, bool kMulticast = false,
          bool kMapUniform = false, bool kSplitQk = false, int kRowCopySteps = 0, bool kQSplit = false,
          int kStamps = 0, bool kBulkO = false>
__global__ void __launch_bounds__(kRowsCtaThreads<kTma>, 1)
    attend_rows_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ CUtensorMap cache_map) {
  using Shape = RowShape<kRowsN>;
  constexpr bool kProducer = kTma;
  constexpr int kCtaThreads = kRowsCtaThreads<kTma>;
  constexpr bool kDrainLate = kTma;  // p.v drained under the next pair's q.k
  constexpr bool kTileRelease = kProducer && kRowsN < 64;  // an `empty` mbarrier a tile (else a pair)
  // 32-row CTAs with kAhead give the producer 56 registers (its 4-row batches spilled at 24), the
  // consumers 208 (they need ~190); with row copies (kRowCopySteps) 40 + 2 x 232 (no spills, where
  // 24 + 2 x 240 spilled 22/20 bytes: the producer's); else 24 + 2 x 240.
  constexpr int kProducerRegs = kRowsN == 32 && kAhead > 1 ? 56 : kRowsN == 32 && kRowCopySteps > 0 ? 40 : 24;
  constexpr int kConsumerRegs = kRowsN == 32 && kAhead > 1 ? 208 : kRowsN == 32 && kRowCopySteps > 0 ? 232 : 240;
  // kRowCopySteps > 0 (kRowCopies; page 1: by default the 48- and 32-row CTAs outside clusters and the
  // 48-row clusters, all under MLA_ROWS_ROW_COPIES=1 or 2; attend_rows.cu): the producer copies each key row with one
  // bulk copy (RowCopies, the 16-row kernel's v26) instead of five one-row TMA boxes, and q.k takes
  // its keys from registers (ldmatrix from rows kRowPitch bytes apart: wgmma cannot read such rows
  // from shared memory). At page 1 a pair is 640 boxes an SM (F: ~8200 clocks a pair against ~6000
  // at page 64, i.e. ~13 clocks a box) where the copy unit took ~35 clocks a 576-byte row in the
  // 16-row kernel (128 copies, ~4500 clocks a pair). The split q.k (48 and 32 rows) and the 64-row
  // CTAs' q.k by rows (both tiles' keys in each warpgroup's registers, 1-step groups: 9 local loads
  // in the pair loop where the page-1 box kernel has 13 and 3 stores); with kMulticast (64 and 48
  // rows) each CTA's producer copies one tile of a pair into both CTAs.
  constexpr bool kRowCopies = kRowCopySteps > 0;
  static_assert(!kRowCopies || (kTma && (kSplitQk || kRowsN == 64)), "row copies: TMA instances, q.k split or 64 rows");
  constexpr Tiles kTiles = kRowCopies ? Tiles::kRows : Tiles::kBoxes;  // the tiles' layout (p.v's V^T loads)
  // A segment's missing second tile (its phase completes with 0 bytes and no keys) waited on at the
  // end of the pair, off q.k's path (kEndWait: the page-1 and cp.async instances, where it won back
  // qlen 2 at page 1: 122.7 -> 113.3 us, s31), or before q.k like a landed one (8113f3f's form: the
  // whole-page TMA instances, where the end wait measured 1.2-1.5% slower on F, G, 96 heads and
  // qlen 2 at page 64; session 33 call 1, GPU-e6875044).
  constexpr bool kEndWait = !kTma || kSmallBoxes || kMapUniform || kRowCopies;
  // k32 steps an f32-summed q.k group takes, and the groups a tile. kRowCopies: kRowCopySteps, an A/B
  // of two costs at 48 and 32 rows: with 2 the fragments in flight take 16 registers and the 48-row
  // consumers spill in the pair loop (9 local loads and 9 stores, -Xptxas -v), with 1 they take 8 (3
  // and 3, as the box instances) but each step's f32 sums are issued for one MMA instead of two.
  constexpr int kGroupSteps = kRowCopies ? kRowCopySteps : kQkGroup, kNGroups = kQkSteps / kGroupSteps;
  static_assert(kQkSteps % kGroupSteps == 0);
  // kMulticast (64- and 48-row CTAs at page 1: rows_cluster): the CTA is one of a 2-CTA cluster, the two
  // row tiles of the same keys (adjacent in the grid, the same segments); each CTA's producer issues
  // one tile of every pair into both (cluster rank r: tile r), so each SM's producer issues half the
  // boxes, and a stage is free once the consumer warps of both CTAs have arrived on its `empty`
  // mbarrier (in each CTA).
  static_assert(!kMulticast || kTma, "clusters share TMA tiles");
#if defined(MLA_CLUSTER_COPY_SELF) && MLA_CLUSTER_COPY_SELF == 3
  // (a diagnostic build, `scripts/device-check cluster-race`: the row copies' CTAs copy their own
  // tiles, so their stages need no release from the peer: without remote arrivals, does racecheck
  // still report the copies?)
  constexpr bool kPeerRelease = kMulticast && !kRowCopies;
#else
  constexpr bool kPeerRelease = kMulticast;  // a stage is free once both CTAs' consumers are done
#endif
  constexpr int kLaneArrivals = kConsumerLaneArrivals<kRowCopies>;
  constexpr int kEmptyArrivals = kRowThreads / 32 * kLaneArrivals * (kPeerRelease ? 2 : 1);
  // The consumer warps' barriers (sync_consumers: named barrier 1 where the producer runs beside them).
  auto sync_rows = [] { sync_consumers<kProducer, kRowThreads>(); };
  constexpr int kWgRows = Shape::kWgRows, kPvAcc = Shape::kPvAcc;
  constexpr int kQkN = kSplitQk ? kRowsN : kWgRows;     // q.k's N: the rows a warpgroup scores
  constexpr int kQkAcc = kQkN / 2, kSlots = kQkN / 4;  // a thread's q.k accumulator; its rows (softmax state)
  constexpr int kQkTiles = kSplitQk ? 1 : kGroups;     // the tiles of a pair a warpgroup scores
  // (64 rows: two m64n64 q.k accumulators in flight spill 1.4 KB a thread, and with one the split
  // measured 4% slower at D: 238.9 vs 229.6-236.5 us, s29 call 3)
  static_assert(!kSplitQk || kRowsN < 64, "the split q.k: 48- and 32-row CTAs");
  static_assert(!kSplitQk || kTma, "the split q.k: TMA tiles (the cp.async gathers copy tile wg)");
  // kQSplit (s35, the default since session 37; MLA_ROWS_Q_SPLIT=0: off): a bf16 query over the fp8 cache,
  // each row split exactly into hi and lo e4m3 rows as in the 16-row kernel's kQSplit
  // (core/query_split.hpp, SplitQueryTile<32, 256, true>), here as K: q.k's 18 k32 steps over the hi
  // rows, then 18 over the lo rows against the same keys, each in its own f32-summed groups (the lo
  // groups added as acc / 16), then the scores times the row's 2^-e; the rest as the fp8 query's.
  // 32-row CTAs with the split q.k by tile only: the query tile twice (36 KB) passes 227 KB at 48 rows.
  static_assert(!kQSplit || (kRowsN == 32 && kSplitQk && !kRowCopies && !kMulticast),
                "the split query: 32-row CTAs on TMA boxes (q.k split by tile)");
  constexpr int kQkGroups = kQSplit ? 2 * kNGroups : kNGroups;  // q.k's groups a tile (kQSplit: hi, then lo)
  constexpr int kRowChunkStride = Shape::kRowChunkStride;
  // Aligned to 1024 bytes (the 128-byte swizzle) by an offset from smem_raw, so the compiler still
  // sees shared memory (a pointer through uintptr_t makes every access generic: 64-bit addresses).
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<RowsSmem<kRowsN, kQSplit>*>(smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));
  // (warp_uniform: q.k's query descriptor and P^T's in uniform registers, 136-264 fewer
  // instructions a kernel; D 3.1%, 96 heads 2.5%, F, G, qlen 2 1.3% faster, F at page 16 and 48
  // rows at B = 16 1-2% slower; s17d, the same run)
  const int tid = threadIdx.x, lane = tid % 32;
  const int wg = warp_uniform(tid / 128), warp = warp_uniform((tid / 32) % 4);
  const int cwarp = 4 * wg + warp;
  const int g = lane / 4, c = lane % 4;
  const CtaWork cta(p, kRowsN, tid);
  const int rows_total = cta.rows_total, m_base = cta.m_base;
  // (kStamps: the CTA's segment `segment` (counted by the consumers), its event k; `value` a count, else the clock)
  int segment = 0;
  auto stamp_word = [&](int word) -> uint64_t& { return p.timeline[int64_t(blockIdx.x) * kRowsStampWords + word]; };
  auto stamp = [&](int k, int64_t value = -1, int by = 0) {
    if constexpr (kStamps > 0) {
      if (tid == by && segment < kRowsStampSegments)
        stamp_word(2 + segment * kRowsSegmentWords + k) = value >= 0 ? uint64_t(value) : uint64_t(clock64());
    }
  };
  // (pair j's event by each consumer warpgroup's thread 0: RowsPairStamp)
  auto stamps_pair = [&](int j) { return kStamps > 0 && tid % 128 == 0 && segment == 0 && j < kRowsStampPairs; };
  auto pair_stamp = [&](int j, int event) {
    if constexpr (kStamps > 0) {
      if (stamps_pair(j))
        stamp_word(kRowsPairBase + (wg * kRowsStampPairs + j) * kRowsPairEvents + event) = uint64_t(clock64());
    }
  };
  if constexpr (kStamps > 0) {
    if (tid == 0) {
      uint32_t sm_id;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_id));
      stamp_word(0) = sm_id + 1;
      stamp_word(1) = uint64_t(clock64());
    }
  }
  if (tid == 0) {
    for (int s = 0; s < 2; ++s)
      for (int u = 0; u < kGroups; ++u) {
        // TMA: an arrival an issuing warp; cp.async: one a thread of the warpgroup (arrive.noinc)
        tma::mbarrier_init(ptx::smem_addr(&sm.full[s][u]),
                           !kTma ? 128 : kRowCopies ? RowCopies::kWarps : TmaTiles::slots(p));
        for (int k = 0; k < 4; ++k) sm.key_mask[s][u][k] = 0;  // slots past TmaTiles::slots(p) stay 0
      }
    if (kProducer)  // a consumer warp's arrival when it is done with a pair
      for (int s = 0; s < 2; ++s) tma::mbarrier_init(ptx::smem_addr(&sm.empty[s]), kEmptyArrivals);
    if (kTileRelease)
      for (int s = 0; s < 2; ++s) tma::mbarrier_init(ptx::smem_addr(&sm.empty1[s]), kEmptyArrivals);
    tma::fence_barrier_init();  // published by the first segment's CTA barrier (the producer: below)
  }
  int done = 0;  // pairs consumed by earlier segments (stage and parity run on)
  const uint32_t cta_rank = kMulticast ? tma::cluster_rank() : 0;
  // A consumer warp is done with a stage (or, kTileRelease, its tile 0): its lanes arrive on the
  // mbarrier (every lane on row copies, lane 0 on boxes: kConsumerLaneArrivals), and with kMulticast on
  // the other CTA's too.
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (kLaneArrivals == 32 || lane == 0) {
      tma::arrive(ptx::smem_addr(bar));
      if constexpr (kPeerRelease) tma::arrive_cluster(ptx::smem_addr(bar), cta_rank ^ 1);
    }
  };
  // The flat plan's tile scan, by every thread at one place (serve_segments<..., kScanned>: the
  // producer and the consumers walk the segments from two, and scan_tiles has CTA barriers).
  if (p.flat_ctas > 0) flat::scan_tiles<kCtaThreads>(sm.flat_start, p, kTileKeys, tid);
  if constexpr (kProducer) {
    // the mbarriers, for the producer (kMulticast: both CTAs', before any remote arrival or copy)
    if constexpr (kMulticast) tma::cluster_sync();
    else __syncthreads();
    if (tid >= kRowThreads) {  // the producer warpgroup: every pair of every segment, in order
      ptx::setmaxnreg_dec<kProducerRegs>();
      const int pwarp = warp_uniform((tid - kRowThreads) / 32);
      const TmaTiles tiles(p, &cache_map, lane, pwarp);  // warp w: slot w of both tiles of a pair
      const RowCopies rows(p, lane, pwarp);             // (kRowCopies) warp w: keys 4 l + w of each tile
      // A lane's page id (kRowCopies: its key's page) for tile `tile` of the segment.
      auto page_of = [&](const KeyStream& keys, int tile) {
        if constexpr (kRowCopies) return rows.page_of(keys, tile);
        else return tiles.page_of(keys, tile);
      };
      // (uniform operands at 48 rows, as when the consumers issued them, and for boxes of 1-4 rows
      // at every height, kSmallBoxes: TmaTiles::issue)
      auto produce = [&](const KeyStream& keys, int, int64_t, int64_t, bool, bool) {
        const int n_pairs = (keys.n_tiles() + 1) / 2;
        if (!kRowCopies && !tiles.issues()) return;
        // A lane's page ids a pair ahead; a tile past the segment issues no box (row) but arrives on
        // its mbarrier (0 bytes), so both tiles' mbarriers complete a phase every pair.
        using Page = decltype(page_of(keys, 0));
        Page page[kGroups] = {page_of(keys, 0), page_of(keys, 1)};
        for (int j = 0; j < n_pairs; ++j) {
          const int at = done + j, stage = at & 1;
          const Page next[kGroups] = {page_of(keys, 2 * j + 2), page_of(keys, 2 * j + 3)};
          // the consumers are done with the stage's previous pair (at - 2)
          if (at >= 2) tma::wait_parity_forever(ptx::smem_addr(&sm.empty[stage]), ((at - 2) >> 1) & 1);
#pragma unroll
          for (int u = 0; u < kGroups; ++u) {
            if (kTileRelease && u == 1 && at >= 2)  // (tile 0's boxes are out before tile 1 is free)
              tma::wait_parity_forever(ptx::smem_addr(&sm.empty1[stage]), ((at - 2) >> 1) & 1);
            if constexpr (kRowCopies)
              rows.issue<kMulticast>(keys, 2 * j + u, page[u], ptx::smem_addr(&sm.kv[stage][u][0]),
                                     ptx::smem_addr(&sm.full[stage][u]), &sm.key_mask[stage][u][pwarp],
                                     !kMulticast || u == int(cta_rank));
            else
              tiles.issue<kSlabs, kRowsN == 48 || kSmallBoxes, false, kAhead, kMulticast, kMapUniform>(
                  keys, 2 * j + u, page[u], ptx::smem_addr(&sm.kv[stage][u][0]), ptx::smem_addr(&sm.full[stage][u]),
                  &sm.key_mask[stage][u][pwarp], 0, sm.box_y[pwarp], !kMulticast || u == int(cta_rank));
          }
#pragma unroll
          for (int u = 0; u < kGroups; ++u) page[u] = next[u];
        }
        done += n_pairs;
      };
      serve_segments<kCtaThreads, kRowsN, false, 0, false, true>(p, cta, p.flat_ctas > 0, kTileKeys, tid, sm.flat_start,
                                                 nullptr, nullptr, produce);
      if constexpr (kMulticast) tma::cluster_sync();  // (the consumers' last arrivals on the other CTA)
      return;
    }
    ptx::setmaxnreg_inc<kConsumerRegs>();
  }

  // keys: the segment, in shared memory (read where needed: registers are short).
  auto serve = [&](const KeyStream& keys, int b, int64_t part, int64_t tok_base, bool has_next, bool) {
    const int n_tiles = keys.n_tiles(), n_pairs = (n_tiles + 1) / 2;
    stamp(kSegEntry);
    stamp(kSegTiles, n_tiles);
    // cp.async: the warpgroup's 128 threads copy tile 2 pair + wg from the published rows into
    // stage `at` & 1, a warp 32 consecutive 16-byte chunks (of one or two rows) an instruction, into
    // the swizzled slabs; a masked key's row is zero-filled. Each thread's copies arrive on the
    // mbarrier when done (a tile past the segment: none copied, the arrivals still come, so every
    // mbarrier completes one phase a pair and the parity is (at / 2) & 1 for both tiles).
    auto copy_pair = [&](int pair, int at) {
      const int stage = at & 1;
      const uint32_t dst = ptx::smem_addr(&sm.kv[stage][wg][0]);
      const uint8_t* const* rows = sm.rows[pair & 1][wg];
      const int t = tid % 128;
#pragma unroll 6
      for (int k = 0; k < kTileKeys * kChunks / 128; ++k) {
        const int i = t + 128 * k, key = i / kChunks, chunk = i % kChunks;
        const uint8_t* row = rows[key];
        ptx::cp_async_16(dst + tile_offset<Tiles::kBoxes>(key, chunk),
                         row ? row + 16 * chunk : static_cast<const uint8_t*>(p.cache), row != nullptr, p.l1_copies);
      }
      tma::cp_async_arrive_noinc(ptx::smem_addr(&sm.full[stage][wg]));
    };
    // cp.async: thread t < 64 of warpgroup u loads the page id of key t of tile 2 pair + u a pair
    // before it publishes the row (a whole pair hides the dependent load) and the tile's real keys
    // (key_mask[stage][u], slots 0 and 1), a pair before the copies read them.
    auto key_of = [&](int pair) {
      return !kTma && pair < n_pairs && tid % 128 < kTileKeys ? keys.page_of(p, 2 * pair + wg, tid % 128) : KeyRow{};
    };
    auto publish_pair = [&](const KeyRow& k, int pair, int at) {
      if (tid % 128 >= kTileKeys) return;
      const uint8_t* row;
      int32_t pos;
      keys.publish(p, k, row, pos);
      sm.rows[pair & 1][wg][tid % 128] = row;
      const uint32_t real = __ballot_sync(0xffffffffu, row != nullptr);
      if (lane == 0) sm.key_mask[at & 1][wg][warp] = uint64_t(real) << (32 * warp);
    };
    // The query's loads first, then the page ids (cp.async): the round trips overlap.
    // (tid made opaque: the loads' offsets would be hoisted out of the segment loop and held)
    int tid_q = tid;
    asm volatile("" : "+r"(tid_q));
    std::conditional_t<kQSplit, SplitQueryTile<kRowsN, kRowThreads, true>, QueryTile<kRowsN, kRowThreads>> query;
    query.load(p, b, m_base, rows_total, tid_q);
    KeyRow ahead{};  // cp.async: the page id of pair j + 2's key, published at pair j's barrier
    if constexpr (!kTma) {  // (nothing prefetched across segments)
      publish_pair(key_of(0), 0, done);
      publish_pair(key_of(1), 1, done + 1);
      ahead = key_of(2);
    }
    if constexpr (kQSplit) query.store(sm.q, sm.q_exp, tid_q);
    else query.store(sm.q, tid_q);
    if (tid < kRowsN) sm.limit[tid] = keys.limit(p, m_base + tid, rows_total);  // (published below)
    wgmma::fence_proxy_async();
    sync_rows();
    stamp(kSegPrologue);
    if (!kTma && n_pairs > 0) copy_pair(0, done);  // the rows published above
    // kQSplit: the thread's rows' 2^-e (q.k split by tile: its rows are slot_col of all the CTA's)
    float q_scale[kQSplit ? kSlots : 1];
    if constexpr (kQSplit) {
#pragma unroll
      for (int r = 0; r < kSlots; ++r) q_scale[r] = pow2_float(-sm.q_exp[slot_col(r, c)]);
    }

    // Causal limits: every row of the CTA sees keys up to min_limit (the first row's); a tile past
    // it takes the per-row rule (rows past the request's see nothing), from shared memory.
    const int32_t min_limit = keys.limit(p, m_base, rows_total);
    // 64 rows (s72a): the first pair whose warp's last key (of the pair's last tile) is past the causal edge, by
    // bisection once a segment (positions grow with the local index), kept in shared memory (in a register ptxas
    // spilled it: a local load in the pair loop), so that the pair's mask check below is one shared load and a
    // compare, where s70a recomputed that key's position from segment constants reloaded every pair. Session 68 (H100,
    // against e92476d, rounds in turns): D at page 1 1.7% faster in every round at equal clocks (medians 246.3 / 250.5
    // µs, 8 rounds), D and E within the clock noise (218.9 / 222.3, 1785.9 / 1786.8); D's masks stamp ~300 -> ~250 cycles.
    if constexpr (kTma && kRowsN == 64) {
      auto past_edge = [&](int pair) {
        const int64_t last = keys.k_begin + int64_t(2 * pair + kQkTiles - 1) * kTileKeys + 16 * warp + 15;
        return keys.position(p, last) > min_limit;
      };
      int edge = n_pairs;
      for (int lo = 0; lo < edge;) {
        const int mid = (lo + edge) / 2;
        if (past_edge(mid)) edge = mid;
        else lo = mid + 1;
      }
      __syncwarp();  // the warp's reads of the previous segment's value are done
      if (lane == 0) sm.edge_pair[wg][warp] = edge;
      __syncwarp();
    }
    float m_run[kSlots], d_run[kSlots];
#pragma unroll
    for (int r = 0; r < kSlots; ++r) m_run[r] = -INFINITY, d_run[r] = 0.0f;
    const float scale_log2 = p.score_scale * 1.4426950408889634f, inv_scale_log2 = 1.0f / scale_log2;
    float o[kGroupDimBlocks][kPvAcc];
#pragma unroll
    for (int blk = 0; blk < kGroupDimBlocks; ++blk)
#pragma unroll
      for (int i = 0; i < kPvAcc; ++i) o[blk][i] = 0.0f;
    // q.k's B operand: this warpgroup's kWgRows query rows (8-row core-matrix groups, 128 bytes apart).
    // (kSplitQk: all the CTA's rows)
    const int q_row0 = kSplitQk ? 0 : kWgRows * wg;
    const uint64_t q_desc = wgmma::descriptor(ptx::smem_addr(sm.q) + q_row0 / 8 * 128, kRowChunkStride, 128);

    float acc[2][kQkAcc];  // q.k's group accumulators (each group's first MMA overwrites them)
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < kQkAcc; ++i) acc[u][i] = 0.0f;
    for (int j = 0; j < n_pairs; ++j) {
      const int at = done + j, stage = at & 1;
      const uint32_t parity = (at >> 1) & 1;
      // q.k of both tiles for this warpgroup's rows (kWgRows wg ..): S^T [64 keys x kWgRows rows].
      const bool both = 2 * j + 1 < n_tiles;
      // Tile 1 waited on with the landed ones (below, in q.k's order): always but where kEndWait
      // leaves a missing one to the pair's end.
      const bool land1 = !kEndWait || both;
      float x[kQkTiles][kQkAcc];  // raw scores (q.k in the quantized units; the scale is folded in below)
      uint64_t key_mask[kGroups];
      uint64_t kd[kGroups];
      // Tile u landed: its real keys (the issuing warps' masks), read by lane 0 and broadcast, so the
      // read is ordered before the producer's next write of them (two pairs on) by lane 0's own
      // arrival on `empty` (release): with every lane reading, the order of the other lanes' reads
      // rested on __syncwarp, which compute-sanitizer racecheck does not count (hazards on long
      // segments, where stages are reused; s29).
      auto land = [&](int u) {
        tma::wait_parity_forever(ptx::smem_addr(&sm.full[stage][u]), parity);
        if (j == 0 && u == 0) stamp(kSegFirstLanded);
        uint64_t m = 0;
        if (lane == 0)
          m = (sm.key_mask[stage][u][0] | sm.key_mask[stage][u][1]) | (sm.key_mask[stage][u][2] | sm.key_mask[stage][u][3]);
        key_mask[u] = __shfl_sync(~0u, m, 0);
      };
      // (kStamps) after each pair stamp from kPairQkDone on: kPairNextLanded (RowsPairStamp)
      bool next_seen = false;
      auto stamp_next = [&] {
        if constexpr (kStamps > 0 && kTma) {
          if (stamps_pair(j) && !next_seen && j + 1 < n_pairs &&
              tma::test_parity(ptx::smem_addr(&sm.full[(at + 1) & 1][kSplitQk ? wg : 0]), ((at + 1) >> 1) & 1)) {
            next_seen = true;
            pair_stamp(j, kPairNextLanded);
          }
        }
      };
      // After this pair's first q.k groups went out: the previous pair's p.v (kDrainLate: drained
      // under them) is done, and so is its read of the other warpgroup's rows of P^T: named barrier
      // kPtBarrier + wg, which the other waits on before it writes its rows of P^T for pair j.
      auto pv_done = [&] {
        if constexpr (kDrainLate) {
          wgmma::wait<0>();
#pragma unroll
          for (int blk = 0; blk < kGroupDimBlocks; ++blk) wgmma::fence_operand(o[blk]);
        }
        ptx::named_arrive(kPtBarrier + wg, kRowThreads);
      };
#pragma unroll
      for (int u = 0; u < kGroups; ++u) {
        key_mask[u] = 0;
        kd[u] = wgmma::descriptor_sw128(ptx::smem_addr(&sm.kv[stage][u][0]));
        if (kSplitQk || (u == 1 && (!land1 || kTileRelease))) continue;  // (kTileRelease: tile 1 below)
        land(u);
      }
      if constexpr (kSplitQk) {
        // Tile wg for all the rows, in f32-summed groups of kGroupSteps k32 steps, two groups in flight
        // (acc[grp % 2]); the other tile's keys and mask before p.v (below). (key_mask: 0 from the
        // loop above until landed.)
        if (wg == 0) land(0);  // (constant indices: key_mask stays in registers)
        else if (land1) land(1);
        const uint64_t kd0 = wgmma::descriptor_sw128(ptx::smem_addr(&sm.kv[stage][wg][0]));
        // kRowCopies: K from registers (k_frag_load, as in the 16-row kernel's row copies), a group's
        // fragments a slot (an in-flight wgmma reads its A registers: a slot's are reloaded once its
        // group is done).
        uint32_t ka[2][kGroupSteps][4];
        const uint32_t k_row = k_frag_row(ptx::smem_addr(&sm.kv[stage][wg][0]), warp, lane);
        auto load_k = [&](int slot, int grp) {
          if constexpr (kRowCopies) k_frag_load(ka[slot], k_row, grp * kGroupSteps);
        };
        auto issue_split = [&](int slot, int grp) {
          wgmma::fence();
#pragma unroll
          for (int v = 0; v < kGroupSteps; ++v) {
            const int step = grp * kGroupSteps + v;  // (kQSplit: the lo rows' steps follow the hi rows')
            const uint64_t q_step = wgmma::advance(q_desc, step * 2 * kRowChunkStride);
            if constexpr (kRowCopies) wgmma::mma_qk_e4m3_rs<kQkN>(acc[slot], ka[slot][v], q_step, v > 0);
            else
              wgmma::mma_qk_e4m3<kQkN>(acc[slot], wgmma::advance(kd0, key_step_offset<Tiles::kBoxes>(step % kQkSteps)),
                                       q_step, v > 0);
          }
          wgmma::commit();
          wgmma::fence_operand(acc[slot]);
        };
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) load_k(grp, grp);
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) issue_split(grp, grp);
        pv_done();
        pair_stamp(j, kPairQkIssued);
#pragma unroll
        for (int grp = 0; grp < kQkGroups; ++grp) {
          const int slot = grp % 2;
          if (grp + 1 == kQkGroups) wgmma::wait<0>();
          else wgmma::wait<1>();  // group grp (grp + 1 may still run)
          wgmma::fence_operand(acc[slot]);
          if (grp + 2 < kQkGroups) load_k(slot, grp + 2);  // (under the sums below)
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i)
            x[0][i] = grp == 0 ? acc[slot][i] : grp < kNGroups ? x[0][i] + acc[slot][i] : fmaf(acc[slot][i], 0.0625f, x[0][i]);
          if (grp + 2 < kQkGroups) issue_split(slot, grp + 2);
        }
        if constexpr (kQSplit) {  // hi + lo / 16 times the row's 2^-e: the bf16 query's q.k
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i) x[0][i] *= q_scale[row_slot(i)];
        }
        if (wg == 1) land(0);  // p.v reads both tiles' V, masked by both tiles' keys
        else if (land1) land(1);
      } else {
      // Gathered rows are generic-proxy writes, seen complete through the mbarrier: ordered before
      // the tensor cores' reads (async proxy) by each reading thread (TMA writes are async already).
      if constexpr (!kTma) wgmma::fence_proxy_async();
      // q.k in f32-summed groups of kQkGroup k32 steps, pipelined across the pair's tiles: a tile's
      // group is summed while the other tile's is on the tensor cores, then its next group goes out
      // (wait<1>: the newest commit may still run), so the nine groups' latencies overlap instead of
      // adding up. The accumulator pair is the same 32 registers as one group of both tiles; the
      // first MMA of a group overwrites (scale-d = 0). The descriptors advance by constant offsets
      // in uniform registers (their bases are warp-uniform, warp_uniform): ptxas makes each MMA's
      // pair with one 64-bit uniform add. (Through opaque registers, as until s18c, every MMA took
      // two UMOV and one or two UIADD3 more: 78 more instructions a warp and pair at F, the same time.)
      // (kRowCopies, 64 rows: K from registers, each tile's group fragments reloaded once its group
      // is done, as the split q.k's above)
      uint64_t qd[kGroups] = {q_desc, q_desc};
      uint32_t kb[kGroups][kGroupSteps][4];
      auto load_kb = [&](int u, int grp) {
        if constexpr (kRowCopies)
          k_frag_load(kb[u], k_frag_row(ptx::smem_addr(&sm.kv[stage][u][0]), warp, lane), grp * kGroupSteps);
      };
      auto issue_group = [&](int u, int grp) {
        wgmma::fence();
#pragma unroll
        for (int v = 0; v < kGroupSteps; ++v) {
          const int step = grp * kGroupSteps + v;
          // (a missing second tile is scored too, from whatever its buffer holds, and masked below:
          // a branch around a wgmma makes ptxas fence the accumulators)
          if constexpr (kRowCopies) {
            wgmma::mma_qk_e4m3_rs<kWgRows>(acc[u], kb[u][v], qd[u], v > 0);
          } else {
            wgmma::mma_qk_e4m3<kWgRows>(acc[u], kd[u], qd[u], v > 0);
            kd[u] = wgmma::advance(kd[u],
                                   key_step_offset<Tiles::kBoxes>(step + 1) - key_step_offset<Tiles::kBoxes>(step));
          }
          qd[u] = wgmma::advance(qd[u], 2 * kRowChunkStride);
        }
        wgmma::commit();
        wgmma::fence_operand(acc[u]);
      };
#pragma unroll
      for (int u = 0; u < kGroups; ++u) {
        if (kTileRelease && u == 1 && land1) land(1);  // (released and issued after tile 0)
        load_kb(u, 0);
        issue_group(u, 0);
      }
      pv_done();
      pair_stamp(j, kPairQkIssued);
#pragma unroll
      for (int grp = 0; grp < kNGroups; ++grp) {
#pragma unroll
        for (int u = 0; u < kGroups; ++u) {
          if (grp + 1 == kNGroups && u + 1 == kGroups) wgmma::wait<0>();
          else wgmma::wait<1>();  // tile u's group grp (the other tile's may still run)
          wgmma::fence_operand(acc[u]);
          if (grp + 1 < kNGroups) load_kb(u, grp + 1);
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i) x[u][i] = grp == 0 ? acc[u][i] : x[u][i] + acc[u][i];
          if (grp + 1 < kNGroups) issue_group(u, grp + 1);
        }
      }
      }  // kSplitQk
      pair_stamp(j, kPairQkDone);
      stamp_next();
      // Scores masked by a select (a NaN of a masked key goes too). The thread's two keys of tile u:
      // 16 warp + g (+ 8); its rows: kWgRows wg + acc_col(i, c). Positions grow with the local index, so
      // the warp's last key decides whether every row sees all 16. The scale (> 0: its factors are
      // validated positive) stays out of the scores: a row grows where x > (m + 2^3) / scale, and
      // its weight is exp2(x scale - m), one FFMA.
      // A tile's masks: its missing keys, then the causal edge where some row does not see some key.
      auto mask_tile = [&](int t) {
        const int u = kSplitQk ? wg : t;  // the tile x[t] scores
        const int64_t key0 = keys.k_begin + int64_t(2 * j + u) * kTileKeys + 16 * warp + g;
        // A whole tile (its mask warp-uniform, all 64 bits set) skips the kQkAcc selects (s41a, as
        // the bf16 kernel's lean path, s39a; H100 session 41: G 1.5-2% faster, D, E, F within noise).
        const uint64_t tile_mask = kSplitQk ? (wg ? key_mask[1] : key_mask[0]) : key_mask[t];
        if (tile_mask != ~0ull) {
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i)
            if (!((tile_mask >> (16 * warp + g + 8 * acc_half(i))) & 1)) x[t][i] = -INFINITY;
        }
        if (keys.position(p, key0 - g + 15) > min_limit) {  // the causal edge: some row does not see some key
          const int32_t pos0 = int32_t(keys.position(p, key0)), pos1 = int32_t(keys.position(p, key0 + 8));
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i)
            if ((acc_half(i) ? pos1 : pos0) > sm.limit[q_row0 + acc_col(i, c)]) x[t][i] = -INFINITY;
        }
      };
      bool grows = false;
      if constexpr (kTma && kRowsN == 64) {
        // 64 rows on TMA tiles (s70a, session 66): the masks behind one unlikely branch a pair, where the per-tile
        // checks and their several branches cost the pair ~200 cycles at D (session 66's profile). Positions grow
        // with the local index, so the warp's last key of the pair's last tile decides the causal edge for the pair.
        // Then the lazy rescale's growth check on each row slot's largest score: kSlots chains of maxima side by side
        // and kSlots compares, where `grows |= x > grow_at` a score made ptxas chain all 32 compares through one
        // predicate (~175 cycles a pair at D in that profile). (fmaxf drops a NaN as the compare did; -inf scores
        // never grow a row.) Session 67 (H100, 3 rounds against 9a9c0c4, medians): D 2.0% and E 6.4% faster, D at
        // page 1 a tie; the split instances (48 and 32 rows, the bf16 query's) 1.3-2.6% slower with it: they keep the
        // per-tile form below, as do the untimed ones: 48 and 32 rows without the split (MLA_ATTEND_SPLIT_QK=0) and
        // the cp.async copies (s70a put a local load in the 64-row one's pair loop).
        uint64_t pair_mask = ~0ull;
#pragma unroll
        for (int t = 0; t < kQkTiles; ++t) pair_mask &= key_mask[t];
        if (__builtin_expect(pair_mask != ~0ull || j >= sm.edge_pair[wg][warp], 0)) {
#pragma unroll
          for (int t = 0; t < kQkTiles; ++t) mask_tile(t);
        }
        float top[kSlots];
#pragma unroll
        for (int t = 0; t < kQkTiles; ++t)
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i)  // (i & 2) == 0 in tile 0: a slot's first element
            top[row_slot(i)] = t == 0 && (i & 2) == 0 ? x[0][i] : fmaxf(top[row_slot(i)], x[t][i]);
#pragma unroll
        for (int r = 0; r < kSlots; ++r) grows |= top[r] > (m_run[r] + kLazyRescale) * inv_scale_log2;
      } else {  // 48 and 32 rows, and the cp.async copies: a compare a score
        float grow_at[kSlots];
#pragma unroll
        for (int r = 0; r < kSlots; ++r) grow_at[r] = (m_run[r] + kLazyRescale) * inv_scale_log2;
#pragma unroll
        for (int t = 0; t < kQkTiles; ++t) {
          mask_tile(t);
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i) grows |= x[t][i] > grow_at[row_slot(i)];
        }
      }
      if constexpr (!kTma) {  // both warpgroups finished pair j - 1: its stage takes pair j + 1
        sync_rows();
        if (j + 1 < n_pairs) {
          copy_pair(j + 1, at + 1);
          publish_pair(ahead, j + 2, at + 2);  // pair j's rows and key masks are read: pair j + 2's go there
          ahead = key_of(j + 3);
        }
      }
      // P^T of both tiles for this warpgroup's rows (a missing second tile: zeros, its keys masked),
      // by stmatrix from f16x2 pairs (store_p_t), with the running maxima as they are: one barrier
      // a pair (s19c; the lazy rescale's vote was a barrier of its own before P^T). If a row of the
      // CTA grows, the maxima move and P^T is written again; `sums` takes the weights' row sums.
      auto write_p = [&](float (&sums)[kSlots]) {
#pragma unroll
        for (int t = 0; t < kQkTiles; ++t) {
          float w[kQkAcc];
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i) {
            const float m = m_run[row_slot(i)];
            // (exp2_ftz: 1.3-3% faster than exp2f's subnormal fix-up at D, F, G, qlen 2; s15c. A quarter or half of
            // them by a polynomial on the FMA pipe, s56c, s56d: 0-3% slower at D, E, 96 heads, G; code at f5d02dc.)
            w[i] = exp2_ftz(fmaf(x[t][i], scale_log2, -(m == -INFINITY ? 0.0f : m)));
            sums[row_slot(i)] += w[i];
          }
          store_p_t<kRowsN>(ptx::smem_addr(sm.p[kSplitQk ? wg : t]), w, q_row0, warp, lane);
        }
        wgmma::fence_proxy_async();  // P (st.shared) before the tensor cores read it
      };
      float sums[kSlots];
#pragma unroll
      for (int r = 0; r < kSlots; ++r) sums[r] = 0.0f;
      ptx::named_sync(kPtBarrier + 1 - wg, kRowThreads);  // the other warpgroup's p.v of pair j - 1 is done
      pair_stamp(j, kPairPtFree);
      stamp_next();
      write_p(sums);
      pair_stamp(j, kPairPWritten);
      stamp_next();
      // Both tiles' P^T; both warpgroups are past pair j - 1's reads of red and alpha.
      const bool any_grows = sync_consumers_or<kProducer, kRowThreads>(grows);
      pair_stamp(j, kPairVoted);
      stamp_next();
      if (!any_grows) {
#pragma unroll
        for (int r = 0; r < kSlots; ++r) d_run[r] += sums[r];
      } else {
        // Row maxima over the keys this warpgroup scored (its rows, both tiles; kSplitQk: all rows,
        // its tile), a warp's into red.
        float mx[kSlots];
#pragma unroll
        for (int r = 0; r < kSlots; ++r) mx[r] = -INFINITY;
#pragma unroll
        for (int t = 0; t < kQkTiles; ++t)
#pragma unroll
          for (int i = 0; i < kQkAcc; ++i) mx[row_slot(i)] = fmaxf(mx[row_slot(i)], x[t][i]);
#pragma unroll
        for (int r = 0; r < kSlots; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 4));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 8));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 16));
          if (g == 0) sm.red[cwarp][slot_col(r, c)] = mx[r];
        }
        sync_rows();  // every warp's row maxima
        // Each row slot's new maximum over the warps that scored its keys (this warpgroup's 4; with
        // kSplitQk all 8, the same in both warpgroups) and its rescale factor.
        constexpr int kMaxWarps = kSplitQk ? 4 * kGroups : 4;
        const int w0 = kSplitQk ? 0 : 4 * wg;
        float alpha[kSlots];
#pragma unroll
        for (int r = 0; r < kSlots; ++r) {
          const int n = slot_col(r, c);
          float m_raw = sm.red[w0][n];
#pragma unroll
          for (int w = 1; w < kMaxWarps; ++w) m_raw = fmaxf(m_raw, sm.red[w0 + w][n]);
          const float m_new = fmaxf(m_run[r], m_raw * scale_log2);  // -inf stays -inf
          alpha[r] = exp2_ftz(m_run[r] - (m_new == -INFINITY ? 0.0f : m_new));
          m_run[r] = m_new;
          d_run[r] *= alpha[r];
          if (!kSplitQk && warp == 0 && g == 0) sm.alpha[kWgRows * wg + n] = alpha[r];
        }
        // o holds all the CTA's rows: kSplitQk, a thread's rows are its o columns (alpha from
        // registers); else every row's alpha through shared memory.
        if constexpr (!kSplitQk) sync_rows();  // every row's alpha
#pragma unroll
        for (int blk = 0; blk < kGroupDimBlocks; ++blk) {
#pragma unroll
          for (int i = 0; i < kPvAcc; ++i) o[blk][i] *= kSplitQk ? alpha[row_slot(i)] : sm.alpha[acc_col(i, c)];
          wgmma::fence_operand(o[blk]);
        }
        write_p(d_run);
        sync_rows();  // both tiles' P^T again; every warp has read red and alpha
      }

      // p.v over the pair's tiles for this warpgroup's dims: V^T fragments from the fp8 tile
      // (ldmatrix.trans, zeroed where masked, widened), P^T from shared memory.
      {
        // One stream of k16 steps over both tiles (no drain between them): step t is tile t / 4's
        // k16 step t % 4; fragments double-buffered (an in-flight wgmma reads its A registers).
        // Two copies (s63a): pairs of two whole tiles, the common case, run one without the V masks'
        // branches, whose taken jumps over the mask code left this loop's instruction fetch behind
        // (G's ncu profile, session 61: no_inst 6.4% of all stall samples in p.v, at the jumps' targets
        // and after).
        const uint64_t p_desc = wgmma::descriptor(ptx::smem_addr(sm.p[0]), kRowChunkStride, 128);
        // Step t's V of block pair jj: the lane's one address plus constants (s68a; v_lane_offset).
        const uint32_t v_base = ptx::smem_addr(&sm.kv[stage][0][0]) +
                                v_lane_offset<kTiles>(kGroupDimBlocks / 2 * wg, warp, lane);
        auto v_at = [&](int t, int jj) {
          return v_base + (t / kPvSteps) * int(sizeof(sm.kv[0][0])) + (t % kPvSteps) * kVStepBytes<kTiles> +
                 jj * kVPairBytes<kTiles>;
        };
        auto pv = [&](auto masked) {
          constexpr bool kMasked = decltype(masked)::value;
          const int steps = (kMasked && !both ? 1 : 2) * kPvSteps;
          uint32_t vraw[kGroupDimBlocks / 2][4], frag[2][kGroupDimBlocks][4];
#pragma unroll
          for (int jj = 0; jj < kGroupDimBlocks / 2; ++jj) ptx::ldmatrix_x4_trans(vraw[jj], v_at(0, jj));
#pragma unroll
          for (int t = 0; t < 2 * kPvSteps; ++t) {
            if (t < steps) {
              const int u = t / kPvSteps, ks = t % kPvSteps;
#pragma unroll
              for (int jj = 0; jj < kGroupDimBlocks / 2; ++jj) {
                if constexpr (kMasked)
                  if (key_mask[u] != ~0ull) v_mask(vraw[jj], key_mask[u], ks, c);  // 0 x NaN is NaN
                v_convert(vraw[jj], frag[t & 1][2 * jj], frag[t & 1][2 * jj + 1]);
                if (t + 1 < steps) ptx::ldmatrix_x4_trans(vraw[jj], v_at(t + 1, jj));
              }
              if constexpr (kTileRelease)
                if (t == kPvSteps - 1) release(&sm.empty[stage]);  // tile 0's last V fragments are in registers
              wgmma::fence();
              const uint64_t bp = wgmma::advance(p_desc, u * int(sizeof(sm.p[0])) + ks * 2 * kRowChunkStride);
#pragma unroll
              for (int blk = 0; blk < kGroupDimBlocks; ++blk) wgmma::mma_pv_f16_rs<kRowsN>(o[blk], frag[t & 1][blk], bp);
              wgmma::commit();
              if (t > 0) wgmma::wait<1>();
            }
          }
        };
        // (One copy at 64 rows, where two spilled 150-250 bytes more a thread, and on the row copies'
        // instances, whose q.k then had every wgmma serialized: ptxas C7513.)
        constexpr bool kWholeCopy = kRowsN < 64 && !kRowCopies;
        if constexpr (kWholeCopy) {
          if (both && (key_mask[0] & key_mask[1]) == ~0ull) pv(std::false_type{});
          else pv(std::true_type{});
        } else {
          pv(std::true_type{});
        }
        pair_stamp(j, kPairPvIssued);
        stamp_next();
        // kEndWait: a segment's missing second tile (its phase completed with 0 bytes and no keys:
        // the producer's arrival, or the cp.async copies' with nothing copied) is waited on here,
        // off q.k's path, before the stage goes back (else with the landed ones, above). Unwaited,
        // it could still be open when the consumers came back to the stage two pairs on (an issuing
        // warp delayed between its two tiles while the others ran ahead), and their wait on the
        // next phase would pass on it (synccheck "Missing wait" until s30).
        if (!land1) tma::wait_parity_forever(ptx::smem_addr(&sm.full[stage][1]), parity);
        if constexpr (kProducer)  // the warp's last read of the stage (q.k's MMAs are done, V is in registers)
          release(kTileRelease ? &sm.empty1[stage] : &sm.empty[stage]);
        if constexpr (!kDrainLate) wgmma::wait<0>();  // else the next pair's first q.k wait covers it
      }
    }
    wgmma::wait<0>();
#pragma unroll
    for (int blk = 0; blk < kGroupDimBlocks; ++blk) wgmma::fence_operand(o[blk]);
    stamp(kSegLastPv);
    stamp(kSegLastPv1, -1, 128);

    // Row sums of this warpgroup's rows: over the 8 lanes of a column, then its 4 warps; the rows'
    // final state goes through shared memory to both warpgroups (each writes its dims of all rows).
    float d[kSlots];
#pragma unroll
    for (int r = 0; r < kSlots; ++r) {
      d[r] = d_run[r];
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 4);
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 8);
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 16);
    }
    sync_rows();  // red is free
    if (g == 0)
#pragma unroll
      for (int r = 0; r < kSlots; ++r) sm.red[cwarp][slot_col(r, c)] = d[r];
    sync_rows();
    stamp(kSegSums);
    if (warp == 0 && g == 0 && (!kSplitQk || wg == 0))
#pragma unroll
      for (int r = 0; r < kSlots; ++r) {
        const int n = slot_col(r, c);
        if constexpr (kSplitQk)  // all rows: both warpgroups' tiles
          sm.final_d[n] = ((sm.red[0][n] + sm.red[1][n]) + (sm.red[2][n] + sm.red[3][n])) +
                          ((sm.red[4][n] + sm.red[5][n]) + (sm.red[6][n] + sm.red[7][n]));
        else
          sm.final_d[kWgRows * wg + n] = (sm.red[4 * wg][n] + sm.red[4 * wg + 1][n]) + (sm.red[4 * wg + 2][n] + sm.red[4 * wg + 3][n]);
        sm.final_m[q_row0 + n] = m_run[r];
      }
    sync_rows();
    stamp(kSegFinal);
    // Row n's final state, in natural logs for the shared rules: lse = ln 2 * (m + log2 d); empty rows o = 0,
    // lse = -inf.
    auto final_state = [&](int n) {
      SoftmaxState f;
      f.d = sm.final_d[n];
      f.m = f.empty() ? -INFINITY : sm.final_m[n] * 0.6931471805599453f;
      return f;
    };

    // kBulkO (s60a, session 56; attend_rows.cu picks it: by default the 64-row instance on fixed splits): the CTA's
    // last segment writes o through shared memory, a bulk copy a row (FlashMLA's split-KV epilogue, o_accum's rows at
    // a pitch of 520 floats), where the direct stores below put each warp's 16 dims of 4 rows (4 x 64 bytes an
    // instruction) on the memory system. Why: session 56's stamps put those stores at ~15k of F's 16.6k-cycle
    // epilogue and ~30k of D's 31k, the rest (row sums, final state) under 2k; bf16 o (half the bytes, as many
    // instructions) did not shorten them, and without them D ran 3% faster, F and G 1%, an uneven batch 6% (graph
    // timings). The stages are free then: the consumers' last p.v is done (the barriers above) and the producer
    // sends no next segment.
    if constexpr (kBulkO) {
      if (!has_next) {
        constexpr int kPitch = kLatent + 8;  // elements: rows 2 apart (a warp's 4 rows) 16 banks apart in f32
        uint8_t* const staged = &sm.kv[0][0][0];
        static_assert(kRowsN * kPitch * 4 <= int(sizeof(sm.kv)), "o's rows fit the stages");
#pragma unroll
        for (int r = 0; r < kRowsN / 4; ++r) {
          const int n = slot_col(r, c);
          if (m_base + n >= rows_total) continue;
          const float scale = final_state(n).inv_sum() * p.v_scale;
          const int i0 = 4 * (r >> 1) + (r & 1);
#pragma unroll
          for (int blk = 0; blk < kGroupDimBlocks; ++blk) {
            const int e = n * kPitch + 64 * (kGroupDimBlocks * wg + blk) + 16 * warp + 2 * g;
            const float x0 = o[blk][i0] * scale, x1 = o[blk][i0 + 2] * scale;
            if (p.o_bf16) *reinterpret_cast<uint32_t*>(staged + 2 * e) = ptx::pack_bf16x2(x0, x1);
            else *reinterpret_cast<float2*>(staged + 4 * e) = make_float2(x0, x1);
          }
        }
        wgmma::fence_proxy_async();  // this thread's st.shared before the bulk copies read them
        sync_rows();
        if (tid < kRowsN && m_base + tid < rows_total) {  // a row a thread
          const int esize = p.o_bf16 ? 2 : 4;
          const OutRow out(p, part, tok_base, m_base + tid);
          tma::store_bytes(static_cast<uint8_t*>(p.o) + out.o_base * esize,
                           ptx::smem_addr(staged + tid * kPitch * esize), kLatent * esize);
          tma::commit_store();
          p.lse[out.lse_index] = final_state(tid).lse();
          tma::wait_store_read();  // (the CTA ends next: its shared memory is read out first)
        }
        stamp(kSegEnd);
        ++segment;
        done += n_pairs;
        return;
      }
    }

#pragma unroll
    for (int r = 0; r < kRowsN / 4; ++r) {  // the p.v accumulator's columns of this thread
      const int n = slot_col(r, c), m = m_base + n;
      if (m >= rows_total) continue;
      const SoftmaxState f = final_state(n);
      const float scale = f.inv_sum() * p.v_scale;
      const OutRow out(p, part, tok_base, m);
      const int i0 = 4 * (r >> 1) + (r & 1);  // elements i0 (dim 2g) and i0 + 2 (dim 2g + 1)
      // (the probe: no stores, behind a load ptxas cannot see through, a length >= 0, so o and its MMAs stay)
      if constexpr (kStamps == kStampsNoStore)
        if (p.seq_lens[b] >= 0) continue;
#pragma unroll
      for (int blk = 0; blk < kGroupDimBlocks; ++blk)
        out.store_pair(p, 64 * (kGroupDimBlocks * wg + blk) + 16 * warp + 2 * g, o[blk][i0] * scale, o[blk][i0 + 2] * scale);
      if (cwarp == 0 && g == 0) p.lse[out.lse_index] = f.lse();
    }
    stamp(kSegEnd);
    ++segment;
    done += n_pairs;
  };  // serve

  serve_segments<kCtaThreads, kRowsN, true, kProducer ? kRowThreads : 0, false, true>(
      p, cta, p.flat_ctas > 0, kTileKeys, tid, sm.flat_start, nullptr, &sm.segment, serve);
  if constexpr (kMulticast) tma::cluster_sync();  // the other CTA's last arrivals on this one's mbarriers
}

}  // namespace
}  // namespace mla::cuda
