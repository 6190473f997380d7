#pragma once
// attend on Hopper's wgmma (issue 5, v8-v12): fp8 query x fp8 cache, one warpgroup a CTA.
// (The 16-row kernel itself; attend_wgmma.cu launches its fp8 instances, attend_wgmma_q_split.cu
// its bf16-query one, in a translation unit of its own: beside the fp8 instances it changed their
// SASS, ptxas inlining the shared device code otherwise, and the H200 figures hold for that SASS.)
//
// The mma.sync kernel (attend.cu) spends its time widening keys to f16 for q.k and in lock-step
// phases of 8 warps (docs/attention.md, v1-v7). Here the products run as asynchronous warpgroup
// MMAs with the KEYS on the M side ("swap AB"), so 12-16 query rows are wgmma's N = 16 instead of
// rows padded to M = 64:
//   q.k:  S^T [64 keys x 16 rows] = K [64 x 576] . Q^T     QGMMA m64n16k32 e4m3, both from smem
//   p.v:  O^T [512 dims x 16 rows] += V^T [512 x 64] . P^T  HGMMA m64n16k16 f16, 8 dim blocks,
//         V^T from registers (the fp8 rows widened with ldmatrix.trans + prmt + cvt), P^T from smem
// q.k reads the fp8 cache rows as they are (no widening). Hopper's fp8 MMA accumulates in fewer
// bits than f32 (tests/gpu/test_wgmma.cpp): q.k's k32 steps go into accumulators of kGroupSteps
// steps summed in f32, which keeps the scores near f32 accuracy (SPEC.md: LSE within 1e-3).
//
// One CTA = one warpgroup (128 threads; with row copies two), 2 CTAs an SM, 2 tile stages. Key
// tiles (64 keys) come
//  - by TMA (v10; pages of a power of two rows, 8+ for an fp8 cache): the warps load whole pages as
//    128-byte-swizzled slabs on a per-stage mbarrier (attend_wgmma_tiles.cuh: the layout; masked
//    keys are selected away and their V bytes zeroed in registers), and the step's partials at
//    W = 1, B > 1 follow the flat plan (flat_plan.hpp: one wave of key-CTAs shares all requests'
//    tiles evenly, a CTA serving a segment of each request it overlaps);
//  - by bulk copies of one key row each (v24; fp8 pages TMA does not box: 1-4 rows, not a power of
//    two, not contiguous), on the same mbarriers and plan, q.k's K through ldmatrix into registers,
//    issued by a producer warpgroup beside the consumer (v26: 2 x 128 threads a CTA, setmaxnreg);
//  - else by cp.async through L1 (a caller's partials, rows not 16-byte aligned, MLA_ATTEND_TMA=0),
//    one CTA per (request, split, 16 query rows) as in attend.cu (attend_keys.cuh), or the flat
//    plan's segments for an uneven batch (v22: the copies need no page alignment, only the plan's
//    whole tiles, which a segment's keys are).
// The softmax rescales lazily (maxima move only by more than 2^8). P is rounded once to f16
// (o ~3e-4) and q.k carries the fp8 MMA's ~1e-4 relative error: this kernel serves only the step's
// own partials (AttendParams.step_partials), which feed post's bf16 out; attend() results handed to
// a caller come from attend.cu (exact fp8 products, f32 sums). Measured versions: docs/attention.md.
#include <cuda_fp16.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/softmax_state.hpp"
#include "cuda/attend_keys.cuh"
#include "cuda/attend_segments.cuh"
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/flat_plan.hpp"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/tma.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_bf16.cuh"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

constexpr int kTimelineWords = 16;  // MLA_ATTEND_TIMELINE: stamps a CTA (below)

// kGroupSteps: k32 steps a q.k accumulator takes before the f32 sum (1: the most accurate, two waves
// of 9 accumulators; 2: one wave, 1.6e-4 vs 1.1e-4 rel L2 in tests/gpu/test_wgmma.cpp; kRows takes
// 3 in two waves of 3 accumulators, 1.9e-4, its K fragments needing the registers).
// kTiles (attend_wgmma_tiles.cuh): the key tiles come by the TMA unit on the stage's mbarrier, as
// whole pages (kBoxes) or a bulk copy a key row (kRows: fp8 pages TMA does not box, v24), issued by
// one lane a box of up to 4 warps; or by cp.async from every thread (kCopies: a caller's partials
// whose chunks are not page-aligned, rows not 16-byte aligned, MLA_ATTEND_TMA=0).
// kTimeline (MLA_ATTEND_TIMELINE, measurement only): thread 0 of each CTA stamps the global timer
// at its phases into p.timeline[kTimelineWords * CTA + k] (k: 0 start, 1 prologue done, 2 first
// tile landed, 3 last tile done, 4 end, 5 SM id, 6 tiles, 7 segments; the prologue's steps: 8
// mbarriers initialized, 9 plan and key range known (the first serve begins), 10 the first tile's
// boxes issued (thread 0 issues box 0: after its page id load), 11 thread 0's query rows loaded;
// the CTA's first segment switch (8.2-8.6 us on average in session 21, docs/attention.md): 15 the
// first segment's last tile done, 12 the second segment's serve begins, 13 its prologue barrier,
// 14 its first tile landed).
// kFastDivs (s23a; TMA boxes, 2-step groups: the default where the launch's multiply-shifts are
// exact, with_fast_divs): the rest of the divisions on warp 0's path to its first boxes by the
// host's multiply-shifts (CtaWork's blockIdx / m_tiles and / splits, the flat plan's T / CTAs,
// KeyStream's last row / heads once a CTA: FastDivs) and the box counts by shifts (TMA pages are a
// power of two rows): 8 32-bit divisions left in the SASS instead of 16, 0-2% faster (B1, page 16).
// kQSplit (MLA_ATTEND_Q_SPLIT, the default since session 34: B64 89 us against mma.sync's 143-148;
// TMA boxes with 2-step groups, or bulk row copies with 3-step ones in waves of 2): a bf16 query over
// the fp8 cache, each row scaled by a power of two and split exactly into hi and lo e4m3 rows
// (core/query_split.hpp, SplitQueryTile): q.k as QGMMA m64n32k32 (the 16 hi rows, then the 16 lo
// rows), the scores hi + lo / 16 times the row's 2^-e, so the bf16 query's scores on the fp8 tensor
// cores (where the mma.sync kernel widened every key to f16). Its 16 accumulator registers a group
// take 3 in flight (3 waves of 3 groups) where the fp8 query's take 9.
// kBf16 (MLA_ATTEND_BF16_16ROW, the default since session 34: B64 162 us against mma.sync's 232;
// TMA boxes): a bf16 query and cache, where the mma.sync kernel took the 12-16 head shapes of a bf16 cache (59% of copy at B64): key tiles of
// nine 128-byte slabs (72 KB, one CTA an SM), q.k as HGMMA m64n16k16 bf16 in one f32 chain of 36 k16
// steps (bf16 products accumulate in f32 proper), p.v as HGMMA m64n16k16 with V^T read MN-major
// from the slabs as TMA wrote them (no ldmatrix, no widening) and a bf16 P^T; the rows of keys not
// loaded (NaN in unused pages) zeroed in shared memory before p.v, on tiles with such keys.
// kSkew (with kFastDivs; s33a, the default from B = 2 since session 33): fixed splits in pairs of one
// request, the even split (the grid's first half, placed first on its SM) taking 27/52 of the pair's
// keys, the odd one the rest (skew_plan.hpp: an SM's first CTA streams 8-9% faster, session 21).
// kFixedOnly (s73a, attend_wgmma_fixed.cu: the FastDivs instances and the row copies' 3-step one): launched with
// fixed splits only, so serve_segments' `flat` is a constant false and the flat plan's code folds away: the
// prologue runs on to the first boxes without a jump over it (a cold jump of 13-16 KB cost a CTA ~0.22-0.32 µs at
// its start in bench/ifetch_probe.cu's hops, session 70).
template <int kStages, int kGroupSteps, Tiles kTiles, bool kTimeline = false, bool kFastDivs = false,
          bool kQSplit = false, bool kBf16 = false, bool kSkew = false, bool kFixedOnly = false>
__global__ void __launch_bounds__(kTiles == Tiles::kRows ? 2 * kThreads : kThreads, kStages == 2 && !kBf16 ? 2 : 1)
    attend_wgmma_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ CUtensorMap cache_map) {
  constexpr bool kTma = kTiles != Tiles::kCopies;  // tiles by the TMA unit, on an mbarrier
  constexpr bool kRows = kTiles == Tiles::kRows;
  constexpr bool kBoxes = kTiles == Tiles::kBoxes;  // the consumer warps issue the TMA boxes
  // kRows (v26): a second warpgroup, the producer, issues the row copies. A bulk copy takes its
  // operands in uniform registers, so a warp issues its rows one lane at a time, each waiting until
  // the copy unit has read the last (~35 cycles): 16 a warp a tile, which the consumer warps spent
  // before every tile's q.k (v24: ~21% of their stall samples). The producer gives its registers to
  // the consumer (setmaxnreg: 2 CTAs of 256 threads an SM, 32 + 224 registers a thread; 24 + 232
  // with 1-step q.k groups, whose consumer spills in its tile loop even at 232) and runs ahead of it
  // by the stages, on `empty` mbarriers the consumer warps arrive on. (32 / 224 vs 24 / 232 at 2-step
  // groups: the consumer's tile loop spill-free either way, the producer's spills 222 -> 174 bytes,
  // 0.2-1% faster on every page-1 shape of session 13's run, H200.)
  constexpr bool kProducer = kRows;
  constexpr int kProducerRegs = kGroupSteps == 1 ? 24 : 32;
  constexpr int kCtaThreads = kProducer ? 2 * kThreads : kThreads;
  // Accumulators a wave: one wave of up to kQkWave; kRows holds its A operands in registers as well,
  // so 9 or 6 k32 steps a wave (ptxas spills in the loop else).
  // (kBf16: 36 k16 steps in one chain)
  constexpr int kQkStepsK = kBf16 ? 2 * kQkSteps : kQkSteps, kGroupStepsK = kBf16 ? kQkStepsK : kGroupSteps;
  constexpr int kSlabsK = kBf16 ? kBf16Slabs : kSlabs;  // 128-byte slabs a key row
  constexpr int kAccs = kQkStepsK / kGroupStepsK;
  // (kQSplit: 3, its accumulators twice as wide; 2 beside kRows's K fragments)
  constexpr int kWave = kBf16                      ? 1
                        : kQSplit                  ? (kRows ? 2 : 3)
                        : kTiles == Tiles::kRows ? (kGroupSteps == 1 ? 6 : kAccs / 2)
                        : kAccs < kQkWave        ? kAccs
                                                 : kQkWave;
  static_assert(kQkStepsK % kGroupStepsK == 0 && kAccs % kWave == 0);
  static_assert(!kBf16 || (kTiles == Tiles::kBoxes && !kQSplit && !kTimeline && !kFastDivs));
  static_assert(!kQSplit || (kTiles == Tiles::kBoxes && kGroupSteps == 2 && !kTimeline) ||
                (kRows && kGroupSteps == 3));
  constexpr int kQRows = kQSplit ? 2 * kN : kN;          // the query tile's rows (B's N in q.k)
  constexpr int kQChunkStride = kQRows / 8 * 128;        // its K-major chunk stride (kBChunkStride at kN)
  constexpr int kQkAccs = kQRows / 2;                    // a q.k accumulator's registers
  // The dynamic window is not guaranteed 1024-byte aligned (the 128-byte swizzle needs it): by hand.
  extern __shared__ uint8_t smem_raw[];
  // (An offset from smem_raw, not an integer-aligned address: the struct's reads stay in the shared
  // window, LDS / STS, where a generic pointer made the plan's 231 accesses generic LD / ST, s22e.)
  auto& sm = *reinterpret_cast<WgSmem<kStages, kTiles, kQRows, kBf16>*>(
      smem_raw + ((1024u - (uint32_t(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u));
  constexpr int kSlots = kStages + 1;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  auto stamp = [&](int k, uint64_t value) {
    if constexpr (kTimeline) {
      if (tid == 0) p.timeline[kTimelineWords * int64_t(blockIdx.x) + k] = value;
    }
  };
  auto now = [] {
    uint64_t t = 0;
    if constexpr (kTimeline) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  if constexpr (kTimeline) {
    const uint64_t start_time = now();
    for (int k = 0; k < 4; ++k) stamp(k, start_time);  // a CTA with nothing to serve: all phases 0
    for (int k = 8; k < 16; ++k) stamp(k, start_time);
  }
  int segments = 0;
  static_assert(!kFastDivs || kTiles == Tiles::kBoxes);
  static_assert(!kSkew || kFastDivs);
  const CtaWork cta = [&] {
    if constexpr (kSkew) return CtaWork(p, kN, tid, SkewedFastDivs{});
    else if constexpr (kFastDivs) return CtaWork(p, kN, tid, FastDivs{});
    else return CtaWork(p, kN, tid);
  }();
  const int rows_total = cta.rows_total, m_base = cta.m_base;
  // s74b: the first boxes wait on two dependent round trips (the request's length and page range, then
  // its page ids) and on the tensor map: start the map's fetch and the request's head toward L2 now,
  // under the mbarriers' setup and its barrier (the flat plan's CTAs find their requests later).
  // (The flat test is spelled out here and at both serve_segments calls: one `const bool flat` for all three
  // changed every flat-capable instance's SASS, session 72's sass-compare, so it waits for a timed change.)
  if (tid == kThreads - 1 && (kFixedOnly || p.flat_ctas <= 0)) {
    if constexpr (kBoxes) tma::prefetch_map(&cache_map);
    tma::prefetch_l2(p.seq_lens + cta.b);
    tma::prefetch_l2(p.kv_indptr + cta.b);
  }
  if constexpr (kTma) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        const int arrivals = kRows ? RowCopies::kWarps : kFastDivs ? TmaTiles::slots_pow2(p) : TmaTiles::slots(p);
        tma::mbarrier_init(ptx::smem_addr(&sm.full[s]), arrivals);
        if (kProducer) tma::mbarrier_init(ptx::smem_addr(&sm.empty[s]), kThreads / 32 * kConsumerLaneArrivals<kRows>);
        for (int k = 0; k < 4; ++k) sm.key_mask[s][k] = 0;
      }
      tma::fence_barrier_init();
    }
    __syncthreads();  // the mbarriers, for every warp that issues boxes (from the first prologue on)
    stamp(8, now());
  }
  int done = 0;  // TMA: tiles consumed by earlier segments (stage and mbarrier parity run on)

  if constexpr (kProducer) {
    if (tid >= kThreads) {  // the producer warpgroup: every tile of every segment, in order
      ptx::setmaxnreg_dec<kProducerRegs>();
      const int pwarp = warp - kThreads / 32;
      const RowCopies rows(p, lane, pwarp);
      auto produce = [&](const KeyStream& keys, int, int64_t, int64_t, bool, bool) {
        const int n_tiles = keys.n_tiles();
        RowCopies::Row ahead[2] = {rows.page_of(keys, 0), rows.page_of(keys, 1)};  // page ids two tiles ahead
        for (int t = 0; t < n_tiles; ++t) {
          const int at = done + t, stage = at % kStages;
          const RowCopies::Row row = ahead[0];
          ahead[0] = ahead[1];
          ahead[1] = rows.page_of(keys, t + 2);
          // The consumer is done with the stage's previous tile (at - kStages).
          if (at >= kStages) tma::wait_parity_forever(ptx::smem_addr(&sm.empty[stage]), ((at / kStages) + 1) & 1);
          rows.issue(keys, t, row, ptx::smem_addr(&sm.kv[stage][0]), ptx::smem_addr(&sm.full[stage]),
                     &sm.key_mask[stage][pwarp]);
        }
        done += n_tiles;
      };
      serve_segments<kCtaThreads, kN, false>(p, cta, !kFixedOnly && p.flat_ctas > 0, kTileKeys, tid, sm.flat_start,
                                             &sm.next_segment, nullptr, produce);
      return;
    }
    ptx::setmaxnreg_inc<256 - kProducerRegs>();
  }

  // One segment: request b's local keys as `keys` says, into partial `part` at token rows
  // tok_base + i (the query's i-th token).
  // has_next (flat plan): the CTA has a following segment (sm.next_segment), whose first tile is
  // issued during this one's last, so a segment boundary does not drain the pipeline; `prefetched`:
  // this one's first tile was issued so.
  auto serve = [&](const KeyStream& keys, int b, int64_t part, int64_t tok_base, bool has_next, bool prefetched) {
    const KeyStream& next = sm.next_segment;  // in shared memory: read only at the ends of the segment
    int32_t limit[4];  // the causal limits of the thread's 4 rows: after the first boxes go out

    const int n_tiles = keys.n_tiles();
    if (done == 0) stamp(9, now());
    if (segments == 1) stamp(12, now());

    // --- TMA (attend_wgmma_tiles.cuh): page ids a tile ahead, boxes issued when the stage is free.
    // (ks: the segment the tile belongs to; `at`: the CTA's running tile index, which picks the stage.)
    const TmaTiles tiles = [&] {
      if constexpr (kFastDivs) return TmaTiles(p, &cache_map, lane, warp, FastDivs{});
      else return TmaTiles(p, &cache_map, lane, warp);
    }();
    auto issuer = [&] {
      if constexpr (kFastDivs) return tiles.issues_pow2();
      else return tiles.issues();
    };
    auto box_page_of = [&](const KeyStream& ks, int tile) { return tiles.page_of(ks, tile); };
    auto box_page = [&](int tile) { return box_page_of(keys, tile); };
    auto issue_tma_of = [&](const KeyStream& ks, int tile, int at, int32_t page) {
      const int stage = at % kStages;
      tiles.template issue<kSlabsK, true, kFastDivs>(ks, tile, page, ptx::smem_addr(&sm.kv[stage][0]),
                                               ptx::smem_addr(&sm.full[stage]), &sm.key_mask[stage][warp]);
    };
    auto issue_tma = [&](int tile, int32_t page) { issue_tma_of(keys, tile, done + tile, page); };
    int32_t next_segment_page = -1;  // issuing warps: the lane's page id for the next segment's first tile
    int32_t next_page = -1;  // issuing warps, TMA: the lane's page id for the next tile to issue
    // The first tile's boxes go out before the query's loads (the issuing warps wait on their page
    // ids first).
    // The other order (v14, query first) moved 0.5 us from the prologue into the first tile's wait
    // and was no faster (H200, 949867f: B64 kernel 90.0 vs 88.9 us; timeline in bench/results).
    if constexpr (kBoxes) {
      // (the issuing warps: TmaTiles; the mbarriers were published by the CTA barrier at the start)
      if (issuer() && n_tiles > 0) {
        __syncwarp();
        if (!prefetched) issue_tma(0, box_page(0));
        if (done == 0) stamp(10, now());
        next_page = n_tiles > 1 ? box_page(1) : -1;
      }
    }

    // The rows' query t = m / G by AttendParams.heads_magic (fast_div.hpp): a division's ~20
    // dependent instructions each in the chain before the first tile (s22e, below).
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int m = m_base + slot_col(r, c);
      limit[r] = keys.limit_of_query(p, m, rows_total, fast_div(m, p.heads_magic));
    }
    // (kQSplit: a bf16 query split into hi and lo rows; the same two calls)
    std::conditional_t<kQSplit, SplitQueryTile<>, QueryTile<kN, kThreads, kBf16 ? 2 : 1>> query;
    query.template load<true>(p, b, m_base, rows_total, tid);
    if constexpr (kQSplit) query.store(sm.q, sm.q_exp, tid);
    else query.store(sm.q, tid);
    if (done == 0) stamp(11, now());

    // --- cp.async: thread `key` of a tile turns its page id into a row address and position
    // (publish), and every thread copies (issue_tile).
    auto publish = [&](const KeyRow& k, int slot) {
      if (tid < kTileKeys) keys.publish(p, k, sm.rows[slot][tid], sm.pos[slot][tid]);
    };
    // Warp w copies keys 16w .. 16w+15, 8 rows x 4 chunks an instruction: 64 contiguous bytes of 8
    // rows into four 128-byte core matrices (no bank conflict). Through L1 (cp.async.ca, the
    // default here): through L2 only (.cg) every sector was requested twice (ncu: 21 M L2 requests
    // for 301 MB, 57% L2 hits, whichever lanes share a row) and B64 took 171 µs instead of 134.
    auto issue_tile = [&](int slot, int buf) {
      const uint32_t dst = ptx::smem_addr(&sm.kv[buf][0]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = 16 * warp + 8 * h + lane % 8;
        const uint8_t* row = sm.rows[slot][key];
        const uint8_t* src = row ? row : static_cast<const uint8_t*>(p.cache);
#pragma unroll
        for (int j = 0; j < kChunks / 4; ++j) {
          const int chunk = 4 * j + lane / 8;
          ptx::cp_async_16(dst + tile_offset<Tiles::kCopies>(key, chunk), src + (row ? chunk * 16 : 0), row != nullptr,
                           p.l1_copies);
        }
      }
      ptx::cp_async_commit();
    };

    KeyRow ahead{};
    if constexpr (!kTma) {
      for (int t = 0; t < kStages && t < n_tiles; ++t) publish(keys.page_of(p, t, tid), t);
      // The page ids of tile t+kStages are loaded during tile t-1 and published in tile t: a whole
      // tile hides the dependent DRAM load (q.k alone is too short for it).
      ahead = kStages < n_tiles ? keys.page_of(p, kStages, tid) : KeyRow{};
    }
    wgmma::fence_proxy_async();  // the query tile (st.shared) before the tensor cores read it
    sync_consumers<kProducer, kThreads>();  // the query tile, the first tiles' rows, the initialized mbarriers
    if (done == 0) stamp(1, now());
    if (segments == 1) stamp(13, now());
    // The next segment's first page ids (thread 0 wrote its keys before this segment's barrier
    // above; the issuing warps other than 0 read them only after it).
    if (kBoxes && issuer() && n_tiles > 0 && has_next) next_segment_page = box_page_of(next, 0);
    if constexpr (!kTma) {
      for (int t = 0; t < kStages - 1; ++t) {
        if (t < n_tiles) issue_tile(t, t);
        else ptx::cp_async_commit();
      }
    }

    // Online softmax of the thread's 4 rows in log2 units: running max (all threads agree) and this
    // thread's share of the sum.
    float m_run[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, d_run[4] = {};
    const float scale_log2 = p.score_scale * 1.4426950408889634f;
    float row_scale[4];  // kQSplit: scale_log2 times the thread's rows' 2^-e (SplitQueryTile)
    if constexpr (kQSplit) {
#pragma unroll
      for (int r = 0; r < 4; ++r) row_scale[r] = scale_log2 * pow2_float(-sm.q_exp[slot_col(r, c)]);
    }
    float o[kDimBlocks][8];
#pragma unroll
    for (int blk = 0; blk < kDimBlocks; ++blk)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[blk][i] = 0.0f;
    // Descriptors advance from a base by their byte offsets (one add, not a rebuild per MMA).
    const uint64_t q_desc = wgmma::descriptor(ptx::smem_addr(sm.q), kQChunkStride, 128);
    const uint64_t p_desc = wgmma::descriptor(ptx::smem_addr(sm.p), kBChunkStride, 128);

    for (int t = 0; t < n_tiles; ++t) {
      const int buf = (kTma ? done + t : t) % kStages, slot = t % kSlots;
      uint64_t key_mask = ~0ull;
      if constexpr (kTma) {
        // Tile t-1's products are complete (this warp waited for them, and a warpgroup MMA completes
        // for all four warps at once), so its stage takes tile t+1 now.
        // (kRows: the producer warpgroup issues every tile)
        if (kBoxes && issuer() && t + 1 < n_tiles) {
          issue_tma(t + 1, next_page);
          next_page = t + 2 < n_tiles ? box_page(t + 2) : -1;
        } else if (kBoxes && issuer() && has_next) {
          issue_tma_of(next, 0, done + n_tiles, next_segment_page);  // the next segment's first tile
        }
        tma::wait_parity_forever(ptx::smem_addr(&sm.full[buf]), ((done + t) / kStages) & 1);
        if (done + t == 0) stamp(2, now());
        if (segments == 1 && t == 0) stamp(14, now());
        key_mask = (sm.key_mask[buf][0] | sm.key_mask[buf][1]) | (sm.key_mask[buf][2] | sm.key_mask[buf][3]);
      } else {
        ptx::cp_async_wait_group<kStages - 2>();
        wgmma::fence_proxy_async();  // this thread's cp.async writes, before the tensor cores read them
        // Tile t has landed for every thread, tile t+kStages-1's rows are published, and tile t-1's
        // products are complete (its buffer is refilled next).
        sync_consumers<kProducer, kThreads>();
        const int next = t + kStages - 1;
        if (next < n_tiles) issue_tile(next % kSlots, next % kStages);
        else ptx::cp_async_commit();
      }

      // q.k: kGroupSteps k32 steps an accumulator (the first with scale-d = 0), summed in f32. K from
      // shared memory by descriptor, or (kRows) from registers: ldmatrix gives warp w its keys 16 w ..
      // 16 w + 15 (lane l: key row l % 8 + 8 ((l / 8) % 2), bytes 16 (l / 16) of the step's 32).
      const uint32_t kv_addr = ptx::smem_addr(&sm.kv[buf][0]);
      uint64_t k_desc = 0;
      uint32_t k_row = 0;
      if constexpr (kRows) k_row = k_frag_row(kv_addr, warp, lane);
      else k_desc = kTma ? wgmma::descriptor_sw128(kv_addr) : wgmma::descriptor(kv_addr, wgmma::kChunkStride, 128);
      float x[8] = {};
      // kRows: a wave's K fragments; the next wave's are loaded while this one's MMAs run.
      constexpr int kWaveSteps = kWave * kGroupSteps;
      uint32_t ka[2][kRows ? kWaveSteps : 1][4];
      auto load_k = [&](int wave) { k_frag_load(ka[wave & 1], k_row, wave * kWaveSteps); };
      if constexpr (kRows) load_k(0);
#pragma unroll
      for (int wave = 0; wave < kAccs / kWave; ++wave) {
        float sg[kWave][kQkAccs];
#pragma unroll
        for (int k = 0; k < kWave; ++k) {  // defined before the fence, else ptxas serializes (C7515)
#pragma unroll
          for (int i = 0; i < kQkAccs; ++i) sg[k][i] = 0.0f;
          wgmma::fence_operand(sg[k]);
        }
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < kWave; ++k)
#pragma unroll
          for (int u = 0; u < kGroupStepsK; ++u) {
            const int step = (wave * kWave + k) * kGroupStepsK + u;  // (kBf16: k16 steps, 32 bytes each)
            const uint64_t q_step = wgmma::advance(q_desc, step * 2 * kQChunkStride);
            if constexpr (kRows && kQSplit)
              wgmma::mma_m64n32k32_e4m3_rs(sg[k], ka[wave & 1][k * kGroupSteps + u], q_step, u > 0);
            else if constexpr (kRows) wgmma::mma_m64n16k32_e4m3_rs(sg[k], ka[wave & 1][k * kGroupSteps + u], q_step, u > 0);
            else if constexpr (kQSplit)
              wgmma::mma_m64n32k32_e4m3(sg[k], wgmma::advance(k_desc, key_step_offset<kTiles>(step)), q_step, u > 0);
            else if constexpr (kBf16)
              wgmma::mma_m64n16k16_bf16(sg[k], wgmma::advance(k_desc, key_step_offset<kTiles>(step)), q_step, u > 0);
            else wgmma::mma_m64n16k32_e4m3(sg[k], wgmma::advance(k_desc, key_step_offset<kTiles>(step)), q_step, u > 0);
          }
        wgmma::commit();
        if constexpr (kRows) {
          if (wave + 1 < kAccs / kWave) load_k(wave + 1);
        }
        if constexpr (!kTma) {
          if (wave == 0 && t + kStages < n_tiles) {
            publish(ahead, (t + kStages) % kSlots);
            ahead = t + kStages + 1 < n_tiles ? keys.page_of(p, t + kStages + 1, tid) : KeyRow{};
          }
        }
        wgmma::wait<0>();
#pragma unroll
        for (int k = 0; k < kWave; ++k) {
          wgmma::fence_operand(sg[k]);
#pragma unroll
          for (int i = 0; i < 8; ++i) x[i] += sg[k][i];
          if constexpr (kQSplit) {  // element i + 8: element i's lo row (N column + 16)
#pragma unroll
            for (int i = 0; i < 8; ++i) x[i] += 0.0625f * sg[k][i + 8];
          }
        }
      }

      // The first k16 step of V^T, loaded now: its shared-memory latency hides behind the softmax.
      uint32_t vraw[kDimBlocks / 2][4];
#pragma unroll
      for (int j = 0; j < kDimBlocks / 2; ++j) {
        if constexpr (!kBf16) v_load<kTiles>(kv_addr, 0, j, warp, lane, vraw[j]);  // (kBf16: V from the slabs)
      }

      // The thread's two keys (accumulator rows g and g + 8 of its warp): global positions, INT_MAX
      // where masked (past the chunk, causal limit of every row of the CTA, bad page).
      int32_t key_pos[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = 16 * warp + g + 8 * h;
        if constexpr (kTma) {
          const int64_t j = keys.k_begin + int64_t(t) * kTileKeys + key;
          key_pos[h] = (key_mask >> key) & 1 ? int32_t(keys.position(p, j)) : INT_MAX;
        } else {
          key_pos[h] = sm.pos[slot][key];
        }
      }
      // Scores in log2 units (scaled by log2 e: exp2 is one MUFU), masked (chunk, causal, bad page)
      // by a select, so a NaN score of a masked key goes too.
      float s[8];
      bool grows = false;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if constexpr (kQSplit) s[i] = key_pos[acc_half(i)] <= limit[row_slot(i)] ? x[i] * row_scale[row_slot(i)] : -INFINITY;
        else s[i] = key_pos[acc_half(i)] <= limit[row_slot(i)] ? x[i] * scale_log2 : -INFINITY;
        grows |= s[i] > m_run[row_slot(i)] + kLazyRescale;
      }
      // The running maxima move only when a score passes them by more than kLazyRescale (log2 units;
      // always on a row's first visible tile): the weights stay <= 2^kLazyRescale (f16 holds them
      // with the same relative precision) and most tiles skip the cross-warp maxima exchange, the
      // rescale of o and its barrier. All threads move every row at once, so they keep agreeing.
      if (sync_consumers_or<kProducer, kThreads>(grows)) {
        float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 8; ++i) mx[row_slot(i)] = fmaxf(mx[row_slot(i)], s[i]);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 4));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 8));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 16));
          if (g == 0) sm.red[warp][slot_col(r, c)] = mx[r];
        }
        sync_consumers<kProducer, kThreads>();  // every warp's row maxima
        // Branch-free -inf handling (the rules of core/softmax_state.hpp): a row that has seen
        // nothing keeps m = -inf and gets weights 0 (exp2(-inf - 0)); its first visible tile gets
        // alpha = exp2(-inf) = 0 for the (zero) past.
        float alpha[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int n = slot_col(r, c);
          const float m_new =
              fmaxf(m_run[r], fmaxf(fmaxf(sm.red[0][n], sm.red[1][n]), fmaxf(sm.red[2][n], sm.red[3][n])));
          alpha[r] = exp2_ftz(m_run[r] - (m_new == -INFINITY ? 0.0f : m_new));
          m_run[r] = m_new;
          d_run[r] *= alpha[r];
        }
#pragma unroll
        for (int blk = 0; blk < kDimBlocks; ++blk) {
#pragma unroll
          for (int i = 0; i < 8; ++i) o[blk][i] *= alpha[row_slot(i)];
          wgmma::fence_operand(o[blk]);  // the rescale stays before the MMAs (else they serialize)
        }
      }
      float w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float m = m_run[row_slot(i)];
        // (exp2_ftz rather than exp2f's subnormal fix-up: no change measured here, s16e)
        w[i] = exp2_ftz(s[i] - (m == -INFINITY ? 0.0f : m));
        d_run[row_slot(i)] += w[i];
      }
      if constexpr (kBf16) {
        // Keys the tile did not load (past the segment, bad pages) may hold anything, NaN included,
        // and p.v reads V from the slabs (0 x NaN is NaN): their rows' dims zeroed first (q.k, their
        // last other reader, is complete for the warpgroup), published by the P barrier below.
        if (key_mask != ~0ull) {
#pragma unroll 4
          for (int i = tid; i < kTileKeys * kDimBlocks * 8; i += kThreads) {
            const int key = i / (kDimBlocks * 8), slab = (i / 8) % kDimBlocks, chunk = i % 8;
            if (!((key_mask >> key) & 1))
              *reinterpret_cast<uint4*>(&sm.kv[buf][slab * kSlabBytes + key * 128 + chunk * 16]) = make_uint4(0, 0, 0, 0);
          }
        }
      }
      store_p_t<kN, 8, kBf16>(ptx::smem_addr(sm.p), w, 0, warp, lane);
      wgmma::fence_proxy_async();  // P (st.shared) before the tensor cores read it
      sync_consumers<kProducer, kThreads>();  // the whole P tile; every warp has read red

      // p.v: per k16 step, 8 dim blocks; fragments double-buffered across steps (an in-flight
      // wgmma reads its A registers until wait). The last step drains: MMAs left in flight into
      // the next tile's q.k make ptxas serialize every wgmma (C7515).
      // The masked variant (zeroed V bytes) only for a TMA tile with masked keys (a split's last):
      // predicated, the masking cost every tile 64 instructions a thread.
      auto pv = [&](auto masked) {
        uint32_t frag[2][kDimBlocks][4];
#pragma unroll
        for (int ks = 0; ks < kPvSteps; ++ks) {
#pragma unroll
          for (int j = 0; j < kDimBlocks / 2; ++j) {
            if constexpr (decltype(masked)::value) v_mask(vraw[j], key_mask, ks, c);
            v_convert(vraw[j], frag[ks & 1][2 * j], frag[ks & 1][2 * j + 1]);
            if (ks + 1 < kPvSteps) v_load<kTiles>(kv_addr, ks + 1, j, warp, lane, vraw[j]);  // the next step's, early
          }
          if constexpr (kProducer) {  // this warp's last read of the stage (K, V by ldmatrix; its key mask)
            if (ks == kPvSteps - 1) {
              __syncwarp();  // (kept from lane 0's form: its timings, session 43, were measured with it)
              tma::arrive(ptx::smem_addr(&sm.empty[buf]));  // every lane: kConsumerLaneArrivals
            }
          }
          wgmma::fence();
          const uint64_t bp = wgmma::advance(p_desc, ks * 2 * kBChunkStride);
#pragma unroll
          for (int blk = 0; blk < kDimBlocks; ++blk) wgmma::mma_m64n16k16_f16_rs(o[blk], frag[ks & 1][blk], bp);
          wgmma::commit();
          if (ks == kPvSteps - 1) wgmma::wait<0>();
          else if (ks > 0) wgmma::wait<1>();
        }
      };
      if constexpr (kBf16) {
        // p.v on the slabs: dim block blk is slab blk, read MN-major (a key's 64 dims contiguous),
        // k16 step ks its keys 16 ks .. (two 1024-byte 8-key atoms).
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < kPvSteps; ++ks) {
          const uint64_t bp = wgmma::advance(p_desc, ks * 2 * kBChunkStride);
#pragma unroll
          for (int blk = 0; blk < kDimBlocks; ++blk)
            wgmma::mma_m64n16k16_bf16_ta(
                o[blk], wgmma::descriptor_sw128_mn(kv_addr + blk * kSlabBytes + ks * 16 * 128, kSlabBytes), bp);
        }
        wgmma::commit();
        wgmma::wait<0>();
        // The tensor cores read V^T from the stage here (the fp8 path reads V by ldmatrix before
        // its MMAs), and a warp's wait_group covers its own share of an MMA: every warp's share
        // done before the issuing warp refills this stage at the top of tile t + 1 (review, s33).
        sync_consumers<kProducer, kThreads>();
      } else if (kTma && key_mask != ~0ull) {
        pv(std::true_type{});
      } else {
        pv(std::false_type{});
      }
    }
    wgmma::wait<0>();
#pragma unroll
    for (int blk = 0; blk < kDimBlocks; ++blk) wgmma::fence_operand(o[blk]);

    stamp(3, now());
    if (segments == 0) stamp(15, now());
    ++segments;
    // Row sums: over the 8 lanes of a column, then over the warps.
    float d[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      d[r] = d_run[r];
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 4);
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 8);
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 16);
    }
    sync_consumers<kProducer, kThreads>();  // red is free (every warp has read the last tile's maxima)
    if (g == 0)
#pragma unroll
      for (int r = 0; r < 4; ++r) sm.red[warp][slot_col(r, c)] = d[r];
    sync_consumers<kProducer, kThreads>();

#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int n = slot_col(r, c), m = m_base + n;
      if constexpr (kBf16) {
        // V^T read MN-major leaves dims in order (accumulator M row g: dim 16 warp + g, row g + 8:
        // + 8), where the fp8 path's permuted fragments give dims 2g and 2g + 1: lanes g and g ^ 1
        // swap one value so each holds two adjacent dims (even g: g, g + 1; odd g: g + 7, g + 8),
        // every lane before the row test.
        const int i0 = 4 * (r >> 1) + (r & 1);
#pragma unroll
        for (int blk = 0; blk < kDimBlocks; ++blk) {
          const float got = __shfl_xor_sync(0xffffffffu, (g & 1) ? o[blk][i0] : o[blk][i0 + 2], 4);
          if (g & 1) o[blk][i0] = got;
          else o[blk][i0 + 2] = got;
        }
      }
      if (m >= rows_total) continue;
      // Natural-log state for the shared rules: lse = ln 2 * (m + log2 d); empty rows o = 0, lse = -inf.
      SoftmaxState f;
      f.d = (sm.red[0][n] + sm.red[1][n]) + (sm.red[2][n] + sm.red[3][n]);
      f.m = f.empty() ? -INFINITY : m_run[r] * 0.6931471805599453f;
      const float scale = f.inv_sum() * p.v_scale;
      const int t = fast_div(m, p.heads_magic);
      const OutRow out(p, part, tok_base, t, m - t * p.heads);
      const int i0 = 4 * (r >> 1) + (r & 1);  // accumulator elements i0 (dim 2g) and i0 + 2 (dim 2g + 1)
#pragma unroll
      for (int blk = 0; blk < kDimBlocks; ++blk) {
        if constexpr (kBf16)
          out.store_pair(p, 64 * blk + 16 * warp + (g & ~1) + 8 * (g & 1), o[blk][i0] * scale, o[blk][i0 + 2] * scale);
        else out.store_pair(p, 64 * blk + 16 * warp + 2 * g, o[blk][i0] * scale, o[blk][i0 + 2] * scale);
      }
      if (warp == 0 && g == 0) p.lse[out.lse_index] = f.lse();
    }
    done += n_tiles;
  };  // serve

  serve_segments<kCtaThreads, kN, false, 0, kFastDivs, false, kSkew>(p, cta, !kFixedOnly && p.flat_ctas > 0,
                                                                     kTma ? kTileKeys : 1, tid, sm.flat_start,
                                                                     &sm.next_segment, nullptr, serve);
  if constexpr (kTimeline) {
    uint32_t sm_id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_id));
    stamp(4, now());
    stamp(5, sm_id);
    stamp(6, uint64_t(done));
    stamp(7, uint64_t(segments));
  }
}

}  // namespace
}  // namespace mla::cuda
