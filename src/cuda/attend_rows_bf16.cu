// attend for many query rows a key with a bf16 query and cache (issue 5: 128 heads, qlen 4-8).
//
// The fp8 many-rows kernel (attend_rows.cu) puts keys on wgmma's M side because fp8 operands must
// be K-major; bf16 ones may be MN-major, so here the query rows are M and V is read straight from
// the cache rows as TMA wrote them (FlashMLA's layout). A CTA takes 64 query rows with two
// warpgroups at one CTA an SM and streams 64-key tiles (nine 128-byte slabs a key row) through two
// buffers, FlashMLA's "seesaw" (v18; docs/attention.md):
//   ownership: tile j of a segment (in buffer (done + j) & 1) is owned by warpgroup j & 1, which
//            scores it alone: S [64 rows x 64 keys] = Q . K^T (HGMMA m64n64k16; the query's dims
//            0..511 from shared memory, its rope dims 512..575 from registers)
//   softmax: the running maxima pass from owner to owner in tile order: the owner of j takes
//            m(j - 1) from the other warpgroup, moves it lazily (only past 2^8) to m(j), writes P(j)
//            as bf16 into the tile's rope slab (free once its q.k is done) and m(j) to shared
//            memory, and signals on a named barrier (one a direction); each warpgroup keeps its
//            share of the row sums
//   p.v:     warpgroup w owns o's dims 256 w .. 256 w + 255 for all 64 rows and adds P(j) V(j) for
//            every tile in order (HGMMA m64n256k16, V MN-major from the tile's slabs 4w .. 4w + 3):
//            P from registers for its own tiles, from the rope slab for the other's
//   loads:   warpgroup w loads its dims' slabs of every tile and the rope slab of the other's
//            tiles (an mbarrier a part and buffer), each right after its own last p.v of the tile
//            that held them, so nothing waits for the other warpgroup to release a buffer; tile
//            j + 2's parts go out once tile j is done, while tile j + 1 is scored. A warpgroup
//            issues q.k of its next tile before it waits for the other's P, so one warpgroup's
//            softmax runs under the other's q.k. No CTA barrier in the loop.
// V rows of masked keys are zeroed in the tile before p.v (NaN x 0 is NaN) by the warpgroup whose
// dims they are. P rounded once to bf16 gives o a relative error of ~2e-3: only the step's partials
// (bf16 out) and a caller's bf16 o take this kernel. Tiles come by TMA only (pages of a power of
// two rows). Shared memory: 2 buffers x 72 KB + the 64 KB query (Bf16RowsSmem, attend_rows_bf16_layout.cuh, with
// the shapes, barriers, stamps and the query's loads). Measured: docs/attention.md.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/softmax_state.hpp"
#include "cuda/attend_keys.cuh"
#include "cuda/attend_rows_bf16_layout.cuh"
#include "cuda/attend_segments.cuh"
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/stamp_buffer.hpp"
#include "cuda/tma.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_bf16.cuh"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

// The instances below are the round's adopted forms and its probes. The forms tried and removed, each with its
// prediction, outcome and the commit that holds its code, are in docs/attention.md's versions table: FlashMLA's round
// (s35b, s38b; 0a07c5a; s51b, on the lean issue and slab barriers; 66807d1), the lean issue at pages of 8-32 keys from
// warp 0 (s40b; a5a6497), the publication a bar.arrive and pv_other between q.k's halves (s45a-c; 284f332), pv_other
// before q.k (s46b; a9c0da4), p.v in chains a slab (s47a; 40cedd5), a request's CTAs as one cluster (s47c; 74f0c5e),
// where a round waits for the other's p.v (s48a-e; b386917, 98b28cc, 2f30dba), multicast pairs and L2 hints (s50a-b;
// 2f30dba), tiles sent to L2 ahead (s50c; 204d5d4), the other's p.v and the reload before q.k (s52b; 97b9d5b), the
// other's p.v before all of q.k (s53a; 1ab0112), s53b's publication a bar.arrive (s54a; c6a2420).
// kLean (s39a, the default since session 40; MLA_ROWS_BF16_LEAN=0: v18c as before): at pages of 64+ keys
// (one box a tile) one elected lane of warp 0 arms and issues a tile's parts, without TmaTiles::issue's box
// arithmetic, warp reductions, lane loop and slots(p) division (~195 and ~160 SASS instructions in warp 0 for
// load(t + 1) and load(t + 2), on the softmax's and the next q.k's path: session 39's reading,
// docs/attention.md); and a tile whose keys are all real skips mask_scores' selects. Session 40,
// each twice against v18c: H200 D 337.0 -> 290.5 us, F 204.6 -> 176.8, G 185.4 -> 162.6, 96 heads
// 327.6 -> 284.2, uneven 704 -> 634, E 2599 -> 2301, page 16 (TmaTiles::issue either way) equal;
// H100 8.7-11.7% at D, G, 96 heads, uneven, E, F 1.3%. (The one-box issue stays a lambda here
// beside TmaTiles::issue: its rope part shares the tile's page row and one elected lane with the
// dims' part, which TmaTiles' one-part-a-call interface does not express.)
// kLeanWarps (s41d, the default since session 42; MLA_ROWS_BF16_LEAN=1: kLean alone; kLean's instance): at
// pages of 16 and 32 keys (2-4 boxes a tile, one an issuing warp, as TmaTiles gives them) each warp
// issues its own box as load_whole_tile does its tile: warp-uniform operands, one elected lane arming
// and issuing, no box index, warp reductions or lane loop; the mbarriers expect slots(p) arrivals as
// before. s40b put all boxes in warp 0 (serial: page 8 lost 18%); this keeps the four warps' issue in
// parallel and cuts each one's chain. H200 session 42 (GPU-f172db40, each twice, kLean / kLeanWarps):
// D page 16 338.1, 339.5 / 309.9, 321.7 us; page 32 323.6, 323.3 / 292.6, 292.7; F page 16 201.5,
// 202.4 / 182.6, 182.2; G page 16 188.7, 187.8 / 169.0, 169.7; the near-controls (the default's paths in
// this instance's register allocation) D page 8 354.7, 354.5 / 360.9, 361.3, page 64 287.1, 287.5 /
// 287.0, 286.5: so it is launched at pages of 16 and 32 keys only (bf16_rows_kernel below).
// Where kLeanWarps' per-warp issue runs: 2-4 boxes a 64-key tile (pages of 16 and 32 keys), one a
// warp; the kernel's test and the host's choice of the instance (bf16_rows_kernel) alike.
__host__ __device__ constexpr bool lean_warps_boxes(int boxes) { return boxes > 1 && boxes <= 4; }
// kSlabBars (s44b, the default since session 44; MLA_ROWS_BF16_SLABS=0: kLean's part barriers; launched at
// pages of 64+ keys only, where kLean's one-box issue runs): an mbarrier a 128-byte slab of a tile (nine a
// buffer, FlashMLA's one a box) instead of one a part (a warpgroup's four dims slabs, the rope slab), so
// q.k(t) starts on a part's first slab while the other three land, and waits slab by slab. Why: at D the
// owner reloads its part of tile t + 2 right after its p.v(t) and issues q.k(t + 2) at once, so the part's
// whole latency shows: ncu
// (session 44, H100 GPU-a0534203, bf16 D under kLean) put 20.6% of the stall samples on q.k's first part
// wait (long scoreboard on the try-wait loop), 3.4% on its second, 37% on barriers. With a slab's
// barrier, the wait is the first 8 KB's latency and the rest streams under q.k's MMAs (FlashMLA's q.k
// waits box by box). Measured (session 44, two H100s, each twice, kLean / kSlabBars µs): D 300.8 / 279.7 and
// 305.5 / 283.8, G 170.4 / 159.1 and 169.3 / 160.0, 96 heads 297.5 / 276.9, F 223.4 / 218.3, uneven 646.1 /
// 608.9, D at page 128 299.1 / 281.5; the tests, racecheck and memcheck passed under it (synccheck's report
// on the long step test is every instance's: docs/attention-log.md's earlier queue, item 3). H200 (session 47's README table,
// under s44b and s44c): D 271.8 µs against session 42's 287.2.
// s44c (the default since session 46; MLA_ROWS_BF16_SLABS=1: kLeanWarps' part barriers at pages of 16 and 32
// keys, as sessions 44-45): kLeanWarps' twin at pages of 16 and 32 keys, each issuing warp arming every slab
// with its box's rows (slots(p) arrivals a slab barrier). H100 session 46 (GPU-e259d0e5, 5 runs over two calls,
// part / slab barriers, mean µs): D at page 16 312.1 / 301.1, at page 32 308.5 / 293.8, G at page 16 175.7 /
// 169.5; 3 runs: uneven at page 16 693.2 / 665.7, F at page 16 235.3 / 233.6; its tests, racecheck and memcheck
// passed.
// kProbe (s47b, a timing probe: WRONG RESULTS BY DESIGN, MLA_ROWS_BF16_PROBE, the bench only; kSlabBars' instances at
// pages of 64+ keys): = 1 no tile loads after a segment's first two (the boxes' mbarriers armed with no bytes, the
// buffers keep stale tiles: every wait, barrier and MMA as by default, the memory system out); = 2 no q.k or p.v
// MMAs (the scores zero: every load, wait and barrier as by default, the tensor pipe out). Session 16's probes
// (s16c) split the fp8 kernel's time so; these ask whether bf16 D's tile waits are the loads' pace or the lock step's
// (docs/attention-log.md's earlier queue, item 3 (g)). = 3 and 4 (s48f, prepared in session 48): = 2 with half the slabs loaded,
// the other half's mbarriers armed with no bytes: = 3 the request's two 64-row CTAs complementary halves (even slabs
// in the first row tile, odd in the second: each byte still read once from DRAM, the L2 -> SM stream halved, as a
// multicast pair would have it), = 4 both CTAs the even slabs (DRAM halved too). Against = 2: whether the load half's
// pace (s47b: 231 µs at D on the H200, 84% of the kernel's time) is the L2 -> SM stream (= 3 faster: multicast is the
// lever) or DRAM (= 3 as = 2, = 4 faster) (docs/attention-log.md's earlier queue, item 3 (i)). = 5 (s51a, session 51): neither
// (= 1's stale tiles and = 2's missing MMAs): the skeleton's time alone (waits, barriers, softmax, the loads' issue),
// the floor that neither half's overlap can go under (session 50: loads alone 231.8 µs at D, MMAs alone 245).
// kStamps (s52a, session 52; MLA_ROWS_BF16_TIMELINE=FILE, a measurement: the host's launch_stamps below): kSlabBars'
// instance (the default's round, or v18c's) with each tile's events stamped from the SM clock (clock64) by the first
// thread of the warpgroup that sees them, into p.timeline[(CTA x kStampTiles + tile) x kStampWords + event] (the first
// kStampTiles tiles of a CTA, its segments one after another since session 55; RowsStamp names the events). Why:
// sessions 46-51 inferred the round's timing from stall samples and probes (a tile's load latency paid once a tile,
// the publication barrier's wait); the stamps measure it tile by tile: when each part of a tile was issued, when its
// owner's q.k found it landed, and each step after.
// kEarlyReload (s53b, the default since session 53; MLA_ROWS_BF16_ORDER=0: v18c's round; kSlabBars' instance at
// pages of 64+ keys): q.k(t) over this warpgroup's slabs first, then the other's tile t - 1, then the rest of q.k(t),
// and this warpgroup's part of t + 1 out after `wait<1>` (the first two groups retired) while that rest still runs
// (why: at the loop below).
template <bool kLean = false, bool kLeanWarps = false, bool kSlabBars = false, int kProbe = 0, bool kStamps = false,
          bool kEarlyReload = false>
__global__ void __launch_bounds__(kThreadsB, 1)
    attend_rows_bf16_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ CUtensorMap cache_map) {
  static_assert(!kLeanWarps || kLean, "kLeanWarps is kLean's");
  static_assert(!kStamps || (kSlabBars && !kLeanWarps && !kProbe), "kStamps (s52a) is kSlabBars' at pages of 64+ keys");
  static_assert(!kEarlyReload || (kSlabBars && !kLeanWarps && !kProbe), "kEarlyReload (s53b) is kSlabBars' at 64+");
  static_assert(!kSlabBars || kLean, "kSlabBars is an instance of kLean's (or kLeanWarps') lean issue");
  static_assert(!kProbe || (kSlabBars && !kLeanWarps), "kProbe (s47b) is kSlabBars' at pages of 64+ keys");
  constexpr bool kNoMma = kProbe >= 2;  // (s47b's = 2, s48f's = 3, 4 and s51a's = 5)
  // Aligned to 1024 bytes (the 128-byte swizzle) by an offset from smem_raw (attend_rows_kernel.cuh: why).
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<Bf16RowsSmem*>(smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));
  const int tid = threadIdx.x, lane = tid % 32;
  // (warp_uniform: the branches on the warpgroup around wgmma; the warp's: D 1.8%, G 2.4% faster,
  // F 0.6% slower, s17e)
  const int warp = warp_uniform((tid / 32) % 4);
  const int wg = warp_uniform(tid / 128);
  const int g = lane / 4, c = lane % 4;
  const int row0 = 16 * warp + g;  // this thread's rows: row0 (h = 0) and row0 + 8 (h = 1)
  const CtaWork cta(p, kRowsM, tid);
  const int rows_total = cta.rows_total, m_base = cta.m_base;
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      for (int part = 0; part < 3; ++part) tma::mbarrier_init(ptx::smem_addr(&sm.full[b][part]), TmaTiles::slots(p));
      if constexpr (kSlabBars)  // (an arrival a tile from each issuing warp's elected lane: one at pages of 64+ keys)
        for (int slab = 0; slab < kRowSlabs; ++slab)
          tma::mbarrier_init(ptx::smem_addr(&sm.slab_full[b][slab]), kLeanWarps ? TmaTiles::slots(p) : 1);
      for (int w = 0; w < kGroups; ++w)
        for (int k = 0; k < 4; ++k) sm.key_mask[b][w][k] = 0;  // slots past TmaTiles::slots(p) stay 0
    }
    tma::fence_barrier_init();  // published by the first segment's CTA barrier
  }
  int done = 0;  // tiles consumed by earlier segments (buffer and parity run on)
  // (kStamps: event k of the segment's tile j, by this warpgroup's first thread, as the CTA's tile done + j: the
  // flat plan's segments one after another, so a segment switch shows; session 55)
  auto stamp = [&](int j, int k) {
    if constexpr (kStamps) {
      if (tid % 128 == 0 && done + j < kStampTiles)
        p.timeline[(int64_t(blockIdx.x) * kStampTiles + done + j) * kStampWords + k] = uint64_t(clock64());
    }
  };
  if constexpr (kStamps) {
    if (tid == 0) {
      uint32_t sm_id;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_id));
      p.timeline[int64_t(blockIdx.x) * kStampTiles * kStampWords + kStampSmid] = sm_id + 1;
    }
  }
  const TmaTiles tiles(p, &cache_map, lane, warp);  // each warpgroup's warps issue its own parts

  // (always_inline: ptxas may outline it, and wgmma across a call is serialized, C7510)
  auto serve = [&](const KeyStream& keys, int b, int64_t part, int64_t tok_base, bool,
                   bool) __attribute__((always_inline)) {
    const int n_tiles = keys.n_tiles();
    if (wg == 0 && n_tiles > 0) stamp(0, kStampSegmentStart);
    auto buffer = [&](int j) { return (done + j) & 1; };
    auto parity = [&](int j) { return uint32_t((done + j) >> 1) & 1; };
    auto kv_of = [&](int j) { return ptx::smem_addr(sm.kv[buffer(j)]); };
    auto bar_of = [&](int j, int part_) { return ptx::smem_addr(&sm.full[buffer(j)][part_]); };
    auto slab_bar = [&](int j, int slab) { return ptx::smem_addr(&sm.slab_full[buffer(j)][slab]); };
    // Tile j's part landed, warpgroup w's dims slabs or the rope slab: its mbarrier, or (kSlabBars) each
    // of its slabs'.
    auto wait_dims = [&](int j, int w) {
      if constexpr (kSlabBars) {
#pragma unroll
        for (int slab = 0; slab < kDimSlabs; ++slab)
          tma::wait_parity_forever(slab_bar(j, kDimSlabs * w + slab), parity(j));
      } else {
        tma::wait_parity_forever(bar_of(j, w), parity(j));
      }
    };
    auto wait_rope = [&](int j) {
      tma::wait_parity_forever(kSlabBars ? slab_bar(j, kRopeSlab) : bar_of(j, 2), parity(j));
    };
    // This warpgroup's loads of tile j, in tile order (load_page: j's page id, loaded a tile ahead):
    // its dims' slabs, and the rope slab of a tile the other warpgroup owns.
    int32_t load_page = -1;
    // The elected lane's part of a lean issue (load_whole_tile, load_warp_box): arm tile j's dims part
    // with `rows` key rows' bytes where ok (0 where not: the arrival still counts) and issue them into
    // shared address `at` from cache row y; the same for the rope part of a tile the other warpgroup owns.
    // (kSlabBars: each slab armed on its own mbarrier, slab_bar, and `bar` unused)
    auto issue_rows = [&](int j, uint32_t at, uint32_t bar, int y, bool ok_, int rows) {
      const bool ok = ok_ && !((kProbe == 1 || kProbe == 5) && j >= 2);  // (kProbe = 1, 5: stale tiles past the first two)
      // (kProbe = 3, 4: this CTA's half of the slabs, by its row tile's parity or the even ones)
      auto loads = [&](int slab) {
        return ok && !(kProbe == 3 && ((slab + cta.m_tile) & 1)) && !(kProbe == 4 && (slab & 1));
      };
      if constexpr (!kSlabBars) tma::arrive_expect_tx(bar, ok ? uint32_t(rows * 128 * kDimSlabs) : 0u);
#pragma unroll
      for (int s = 0; s < kDimSlabs; ++s) {
        const int slab = kDimSlabs * wg + s;
        const uint32_t slab_on = kSlabBars ? slab_bar(j, slab) : bar;
        if constexpr (kSlabBars) tma::arrive_expect_tx(slab_on, loads(slab) ? uint32_t(rows * 128) : 0u);
        if (loads(slab)) tma::load_2d(at + slab * kSlabBytes, &cache_map, 128 * slab, y, slab_on);
      }
      if ((j & 1) != wg) {
        const uint32_t rope_bar =  // bar_of(j, 2): full[.][2]
            kSlabBars ? slab_bar(j, kRopeSlab) : bar + uint32_t(sizeof(uint64_t)) * (2 - wg);
        tma::arrive_expect_tx(rope_bar, loads(kRopeSlab) ? uint32_t(rows * 128) : 0u);
        if (loads(kRopeSlab)) tma::load_2d(at + kRopeSlab * kSlabBytes, &cache_map, 128 * kRopeSlab, y, rope_bar);
      }
    };
    // kLean at pages of 64+ keys (slots(p) = 1: warp 0 issues): every lane of warp 0 computes the
    // same values (made warp-uniform by a shuffle, so the boxes' operands sit in uniform registers
    // without a loop over the lanes) and one elected lane arms and issues: the same bytes, key mask,
    // bad-page report and next page id as TmaTiles::issue and page_of with one box a tile.
    auto load_whole_tile = [&](int j) {
      const int64_t j0 = keys.k_begin + int64_t(j) * kTileKeys;
      const bool have = j0 < keys.k_end && (j0 >> keys.page_shift) < keys.pages_avail;
      const int32_t page = load_page;
      const bool ok = warp_uniform(have && page >= 0 && page < p.num_pages);
      const int y = warp_uniform(int(int64_t(page) * p.page_size + (j0 & (p.page_size - 1))));
      const uint32_t kv = uint32_t(warp_uniform(int(kv_of(j)))), bar = uint32_t(warp_uniform(int(bar_of(j, wg))));
      const int64_t left = keys.k_end - j0;
      if (ptx::elect_one()) {
        if (have && !ok) atomicOr(p.error, kBadPage);
        sm.key_mask[buffer(j)][wg][0] = ok ? (left >= kTileKeys ? ~0ull : (1ull << left) - 1) : 0ull;
        issue_rows(j, kv, bar, y, ok, kTileKeys);
      }
      __syncwarp();
      const int64_t j1 = j0 + kTileKeys;
      load_page = j + 1 < n_tiles && j1 < keys.k_end && (j1 >> keys.page_shift) < keys.pages_avail
                      ? p.kv_indices[keys.page_begin + (j1 >> keys.page_shift)]
                      : -1;
    };
    // kLeanWarps at pages of 16 and 32 keys (lean_warps): warp w < boxes issues box w of tile j (every
    // lane alike, load_page warp-uniform: box w's page id, loaded a tile ahead by warp_box_page), the
    // same bytes, key mask slot, arrivals and bad-page report as TmaTiles::issue with one box a warp.
    // (warp_box_page repeats load_whole_tile's next-page test with the warp's box offset: one lambda
    // for both changed the measured lean instance's SASS, session 41's review, so they stay apart.)
    const bool lean_warps = kLeanWarps && lean_warps_boxes(tiles.boxes);
    auto warp_box_page = [&](int j) -> int32_t {
      const int64_t j0 = keys.k_begin + int64_t(j) * kTileKeys + int64_t(warp) * tiles.box_rows;
      return j < n_tiles && j0 < keys.k_end && (j0 >> keys.page_shift) < keys.pages_avail
                 ? p.kv_indices[keys.page_begin + (j0 >> keys.page_shift)]
                 : -1;
    };
    auto load_warp_box = [&](int j) {
      const int rows = tiles.box_rows;
      const int64_t jt = keys.k_begin + int64_t(j) * kTileKeys, j0 = jt + int64_t(warp) * rows;
      const bool have = j0 < keys.k_end && (j0 >> keys.page_shift) < keys.pages_avail;
      const int32_t page = load_page;
      const bool ok = warp_uniform(have && page >= 0 && page < p.num_pages);
      const int y = warp_uniform(int(int64_t(page) * p.page_size + (j0 & (p.page_size - 1))));
      const uint32_t at = uint32_t(warp_uniform(int(kv_of(j)))) + uint32_t(warp * rows * 128);
      const uint32_t bar = uint32_t(warp_uniform(int(bar_of(j, wg))));
      const int64_t left = keys.k_end - jt;
      if (ptx::elect_one()) {
        if (have && !ok) atomicOr(p.error, kBadPage);
        const uint64_t mine = ok ? ((1ull << rows) - 1) << (warp * rows) : 0ull;  // (rows <= 32)
        sm.key_mask[buffer(j)][wg][warp] = mine & (left >= kTileKeys ? ~0ull : (1ull << left) - 1);
        issue_rows(j, at, bar, y, ok, rows);
      }
      __syncwarp();
      load_page = warp_box_page(j + 1);
    };
    auto load = [&](int j) {
      if constexpr (kLean) {
        if (tiles.box_rows == kTileKeys) {
          if (warp == 0) load_whole_tile(j);
          return;
        }
      }
      if constexpr (kLeanWarps) {
        if (lean_warps) {
          if (warp < tiles.boxes) load_warp_box(j);
          return;
        }
      }
      // (never: the host launches kSlabBars where a lean issue runs: pages of 64+ keys, and 16-32 with kLeanWarps)
      if constexpr (kSlabBars) __trap();
      if (!tiles.issues()) return;
      tiles.issue<kDimSlabs, false>(keys, j, load_page, kv_of(j), bar_of(j, wg), &sm.key_mask[buffer(j)][wg][warp], kDimSlabs * wg);
      if ((j & 1) != wg) tiles.issue<1, false>(keys, j, load_page, kv_of(j), bar_of(j, 2), nullptr, kRopeSlab);
      load_page = j + 1 < n_tiles ? tiles.page_of(keys, j + 1) : -1;
    };
    // The query's loads first, then the page ids and first boxes: the round trips overlap.
    int tid_q = tid;
    asm volatile("" : "+r"(tid_q));  // (the loads' offsets would be hoisted out of the segment loop and held)
    QueryRowsBf16 query;
    query.load(p, b, m_base, rows_total, tid_q);
    if (n_tiles > 0 && tiles.issues()) {
      load_page = kLeanWarps && lean_warps ? warp_box_page(0) : tiles.page_of(keys, 0);
      stamp(0, wg == 0 ? kStampIssueOwner : kStampIssueOther);
      load(0);
      if (n_tiles > 1) {
        stamp(1, wg == 1 ? kStampIssueOwner : kStampIssueOther);
        load(1);
      }
    }
    query.store(sm.q, tid_q);
    uint32_t q_rope[kRopeSteps][4];
    load_rope(p, b, m_base, rows_total, warp, g, c, q_rope);
    if (tid < kRowsM) sm.limit[tid] = keys.limit(p, m_base + tid, rows_total);
    wgmma::fence_proxy_async();
    __syncthreads();

    // Causal limits: every row of the CTA sees keys up to min_limit (the first row's); a tile past
    // it takes the per-row rule (rows past the request's see nothing).
    const int32_t min_limit = keys.limit(p, m_base, rows_total);
    const int32_t row_limit[2] = {sm.limit[row0], sm.limit[row0 + 8]};
    float m_run[2] = {-INFINITY, -INFINITY}, d_run[2] = {0.0f, 0.0f};  // log2 units (scaled scores)
    const float scale_log2 = p.score_scale * 1.4426950408889634f;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    const uint64_t q_desc = wgmma::descriptor(ptx::smem_addr(sm.q), kChunkStrideM, 128);
    auto v_desc = [&](uint32_t kv, int ks) {  // keys 16 ks .. of the tile, this warpgroup's 4 slabs of dims
      return wgmma::descriptor_sw128_mn(kv + kDimSlabs * wg * kSlabBytes + 16 * ks * 128, kSlabBytes);
    };
    auto key_mask = [&](int j) {  // tile j's real keys (after a wait on this warpgroup's part of it)
      const uint64_t* m = sm.key_mask[buffer(j)][wg];
      return (m[0] | m[1]) | (m[2] | m[3]);
    };
    // V rows of tile j's masked keys (past the segment, on a bad page: whatever the buffer held, NaN
    // included) to zero in this warpgroup's slabs, before its p.v reads them and after the owner's
    // q.k is done with them; then this warpgroup's threads meet (the tensor cores read them next).
    auto zero_masked = [&](int j, uint64_t mask) {
      if (mask == ~0ull) return;
      uint8_t* slabs = sm.kv[buffer(j)] + kDimSlabs * wg * kSlabBytes;
#pragma unroll 4
      for (int k = 0; k < kTileKeys * kDimSlabs * 8 / 128; ++k) {  // 16 16-byte chunks a thread
        const int unit = tid % 128 + 128 * k, key = unit / 32, slab = (unit / 8) % kDimSlabs, chunk = unit % 8;
        if (!((mask >> key) & 1))
          *reinterpret_cast<uint4*>(&slabs[slab * kSlabBytes + key * 128 + 16 * chunk]) = make_uint4(0, 0, 0, 0);
      }
      wgmma::fence_proxy_async();
      ptx::named_sync(kBarGroup + wg, 128);
    };
    auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    };

    // q.k(t)'s MMAs over warpgroup w's dims' slabs once they landed (the first overwrites s
    // unless `accumulate`), and over the rope slab (the query's rope dims from registers).
    auto qk_slabs = [&](int t, float (&s)[32], int w, bool accumulate) {
      if constexpr (!kSlabBars) {  // (kSlabBars: slab by slab below)
        wait_dims(t, w);
        wgmma::fence();  // (after each wait: ptxas fences the accumulator itself otherwise, C7519)
      }
      uint64_t qd = wgmma::advance(q_desc, w * (kQkSmemSteps / 2) * 2 * kChunkStrideM);
      uint64_t kd = wgmma::descriptor_sw128(kv_of(t) + kDimSlabs * w * kSlabBytes);
#pragma unroll
      for (int k = 0; k < kQkSmemSteps / 2; ++k) {
        if constexpr (kSlabBars) {
          if (k % 4 == 0) {  // (a slab's four k16 steps once it landed)
            tma::wait_parity_forever(slab_bar(t, kDimSlabs * w + k / 4), parity(t));
            wgmma::fence();
            if (k == 0 && !accumulate) stamp(t, kStampFirstSlab);
          }
        }
        if constexpr (!kNoMma) wgmma::mma_m64n64k16_bf16(s, qd, kd, accumulate || k > 0);
        // next step: two 16-byte chunks on in the query; 32 bytes on in the slab, or the next slab
        qd = wgmma::advance(qd, 2 * kChunkStrideM);
        kd = wgmma::advance(kd, (k & 3) == 3 ? kSlabBytes - 3 * 32 : 32);
        asm volatile("" : "+l"(qd), "+l"(kd));  // (unrolled, ptxas would hold every descriptor at once)
      }
    };
    auto qk_rope = [&](int t, float (&s)[32]) {
      wait_rope(t);
      wgmma::fence();
      uint64_t kd = wgmma::descriptor_sw128(kv_of(t) + kRopeSlab * kSlabBytes);
#pragma unroll
      for (int k = 0; k < kRopeSteps; ++k) {
        if constexpr (!kNoMma) wgmma::mma_m64n64k16_bf16_rs(s, q_rope[k], kd);
        kd = wgmma::advance(kd, 32);
      }
    };
    // q.k(t), the owner's: this warpgroup's slabs first, then the other's, then the rope slab.
    // (qk_mine and qk_rest below are its two halves for s53b's round, which commits the first half apart and issues
    // the other's p.v between them; qk keeps its own loop: written through them, ptxas scheduled the kernels without
    // kSlabBars differently, pages under 64 keys included, which no GPU has measured.)
    auto qk = [&](int t, float (&s)[32]) {
      if constexpr (kNoMma)  // (no MMAs: zero scores)
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.0f;
      stamp(t, kStampQkStart);
#pragma unroll
      for (int half = 0; half < kGroups; ++half) qk_slabs(t, s, half ^ wg, half > 0);
      qk_rope(t, s);
      wgmma::commit();
      stamp(t, kStampQkIssued);
    };
    auto qk_mine = [&](int t, float (&s)[32]) {
      stamp(t, kStampQkStart);
      qk_slabs(t, s, wg, false);
      wgmma::commit();
    };
    auto qk_rest = [&](int t, float (&s)[32]) {
      qk_slabs(t, s, wg ^ 1, true);
      qk_rope(t, s);
      wgmma::commit();
      stamp(t, kStampQkIssued);
    };
    // Tile t's scores masked by a select (a NaN of a masked key goes too): keys not loaded, and
    // the causal rule. Element i: row row0 + 8 h (h = (i >> 1) & 1), key 8 (i / 4) + 2c + (i & 1).
    // Positions grow with the local index, so the tile's last key decides whether every row sees
    // all of it. Returns the tile's real keys.
    // (mask: tile t's real keys, key_mask(t))
    // (kLean: a tile of real keys only skips the selects; the mask is the warpgroup's: a uniform branch)
    auto mask_scores = [&](int t, float (&s)[32], uint64_t mask) {
      const int64_t key0 = keys.k_begin + int64_t(t) * kTileKeys;
      if (!kLean || mask != ~0ull) {
#pragma unroll
        for (int i = 0; i < 32; ++i)
          if (!((mask >> (8 * (i >> 2) + 2 * c + (i & 1))) & 1)) s[i] = -INFINITY;
      }
      if (keys.position(p, key0 + kTileKeys - 1) > min_limit) {
#pragma unroll
        for (int i = 0; i < 32; ++i)
          if (keys.position(p, key0 + 8 * (i >> 2) + 2 * c + (i & 1)) > row_limit[(i >> 1) & 1]) s[i] = -INFINITY;
      }
      return mask;
    };
    // Row h's (row0 + 8 h) maximum score of the tile in log2 units (over the quad).
    auto row_tile_max = [&](const float (&s)[32], int h) {
      float mx = -INFINITY;
#pragma unroll
      for (int i = 2 * h; i < 32; i += 4) mx = fmaxf(mx, fmaxf(s[i], s[i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      return mx * scale_log2;
    };
    // p.v of the other warpgroup's tile j (its P in j's rope slab): this warpgroup's dims' V rows of
    // masked keys zeroed first.
    auto pv_smem = [&](int j) {
      wait_dims(j, wg);
      zero_masked(j, key_mask(j));
      const uint32_t kv = kv_of(j);
      const uint64_t pd = wgmma::descriptor(kv + kRopeSlab * kSlabBytes, kChunkStrideM, 128);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kPvSteps; ++ks)
        if constexpr (!kNoMma) wgmma::mma_m64n256k16_bf16_ss(o, wgmma::advance(pd, 2 * ks * kChunkStrideM), v_desc(kv, ks));
      wgmma::commit();
    };
    // p.v of the other warpgroup's tile j, once it has published the tile's maxima and P (in the
    // rope slab): o moves to the new maxima first (only q.k is in flight: nothing adds to o).
    auto pv_other = [&](int j) {
      ptx::named_sync(kBarPublished + (wg ^ 1), kThreadsB);
      stamp(j, kStampOtherPublished);
      float alpha[2];
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_new = sm.m_pub[j & 1][row0 + 8 * h];
        alpha[h] = 1.0f;
        if (m_new != m_run[h]) {  // the owner's rule, the same operands: the same alpha
          alpha[h] = exp2_ftz(m_run[h] - m_new);
          m_run[h] = m_new;
          d_run[h] *= alpha[h];
          moved = true;
        }
      }
      if (__any_sync(0xffffffffu, moved)) rescale(alpha);
      pv_smem(j);
    };
    // The owner's softmax of tile t (q.k done, nothing in flight), its maxima and P published, then
    // its p.v with P from registers.
    auto own = [&](int t, float (&s)[32]) {
      wgmma::fence_operand(s);
      const uint64_t mask = mask_scores(t, s, key_mask(t));
      // The rows' maxima over the tile and the lazy rescale: a row's maximum moves only past
      // m_run + 2^3 (weights stay <= 2^8), to the tile's maximum; -inf stays -inf while a row sees nothing.
      float alpha[2];
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float tile_max = row_tile_max(s, h);
        alpha[h] = 1.0f;
        if (tile_max > m_run[h] + kLazyRescale) {
          alpha[h] = exp2_ftz(m_run[h] - tile_max);  // 0 from -inf (the same function as the owner's rule above)
          m_run[h] = tile_max;
          d_run[h] *= alpha[h];
          moved = true;
        }
        if (c == 0) sm.m_pub[t & 1][row0 + 8 * h] = m_run[h];
      }
      // P = exp2(s scale - m) in bf16 as p.v's A fragments (k16 step ks: a[0] row0 keys 16 ks + 2c,
      // +1; a[1] row0 + 8; a[2], a[3] the keys + 8: accumulator elements 8 ks + 2e, + 1), and into
      // the tile's rope slab for the other warpgroup (K-major core matrices, a thread's 4 bytes a
      // chunk row): this q.k was its last reader.
      uint32_t pa[kPvSteps][4];
      const float neg_m[2] = {m_run[0] == -INFINITY ? 0.0f : -m_run[0], m_run[1] == -INFINITY ? 0.0f : -m_run[1]};
      const uint32_t kv = kv_of(t);
      const uint32_t p_mine = kv + kRopeSlab * kSlabBytes + 2 * warp * 128 + 16 * g + 4 * c;
#pragma unroll
      for (int ks = 0; ks < kPvSteps; ++ks)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 8 * ks + 2 * e, h = e & 1;
          // (exp2_ftz rather than exp2f's subnormal fix-up: D with 128 heads 2.6% faster, s16e)
          // (s56a, s56b, session 55: 8 or 16 of a thread's 32 by a polynomial on the FMA pipe, FlashAttention-4's
          // trick, within 1% of this or slower on an H100; removed, code at f5d02dc)
          const float w0 = exp2_ftz(fmaf(s[i], scale_log2, neg_m[h]));
          const float w1 = exp2_ftz(fmaf(s[i + 1], scale_log2, neg_m[h]));
          d_run[h] += w0 + w1;
          pa[ks][e] = ptx::pack_bf16x2(w0, w1);
          // row0 + 8 h, keys 16 ks + 8 (e / 2) + 2c: chunk 2 ks + e / 2
          ptx::st_shared_b32(p_mine + (2 * ks + (e >> 1)) * kChunkStrideM + 128 * h, pa[ks][e]);
        }
      wgmma::fence_proxy_async();  // P (st.shared) before the other warpgroup's tensor cores read it
      // The publisher waits at its barrier too (bar.sync, not bar.arrive; session 42): the other
      // warpgroup's reads of m_pub in pv_other(t - 1) are then ordered before this tile's write of
      // m_pub[t & 1] by barriers racecheck sees. With bar.arrive the order held too (the reader's own
      // publication of t - 1 came after its read, and this warpgroup waited for it in pv_other(t - 1)),
      // but racecheck reported 28 hazard lines on ManyRows.Bf16StepMatchesCpu (m_pub's and red[]'s); with
      // bar.sync none (H200 session 42). A lock step, no deadlock: each warpgroup's pv_other follows one
      // q.k of its own. Cost within noise (H200 GPU-f172db40: D 289.9, 296.6 / 291.7, 294.4 us; G 163.6,
      // 163.3 / 162.9, 164.3, arrive / sync).
      // (s45a, session 46: a bar.arrive here again, under s44b's slab waits, was 2-3% slower at D and 96 heads,
      // and synccheck reported on it as on bar.sync, so its "divergent thread(s) in block" reports do not come
      // from this barrier id's two bar.sync sites.)
      // (s54a, session 53: a bar.arrive under s53b's round, within noise on an H100 and racecheck's 8 reports again.)
      ptx::named_sync(kBarPublished + wg, kThreadsB);
      stamp(t, kStampPublished);
      // (s57a, session 55: this p.v held back by a named barrier until the other warpgroup had issued its p.v of t
      // and the rest of its q.k(t + 1), so the tensor pipe would run the chain to the next publication first: 1.5x
      // slower at D, the period 3735 -> 5719 cycles, as own's p.v then ran alone after the other's chain; code at
      // f5d02dc.)
      if (__any_sync(0xffffffffu, moved)) {
        wgmma::fence_operand(o);
        rescale(alpha);
      }
      zero_masked(t, mask);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kPvSteps; ++ks)
        if constexpr (!kNoMma) wgmma::mma_m64n256k16_bf16_rs(o, pa[ks], v_desc(kv, ks));
      wgmma::commit();
    };

    // Warpgroup wg owns tiles t = wg, wg + 2, ...; a round issues q.k(t) first (it runs while the
    // other warpgroup finishes tile t - 1's softmax), then adds the other's tile t - 1 to o once it
    // is published (p.v with its P), reloads t - 1's buffer with tile t + 1 (the other's) as soon
    // as both are done, runs t's softmax and p.v and reloads t's buffer with tile t + 2 (v18c).
    // v18a waited only for q.k(t) and reloaded after the softmax: the loads went out one tile
    // ahead and their latency showed in every tile; v18b issued q.k(t) after the other's p.v:
    // the two warpgroups' q.k and softmax then ran one after the other (ncu at D: 41% of the stall
    // samples at the named barrier, the tensor pipe 41% busy). Warpgroup 0's first round has no
    // t - 1; a last round may hold only the other's tile. (No branches around the wgmma waits:
    // ptxas serializes every wgmma where it cannot count the groups in flight, C7514.)
    // A reload of a buffer whose readers are done (the wgmma waits before each). The warpgroup
    // meets first (s41b, a named barrier of its 128 threads), so warps 1-3's reads of the buffer's key
    // mask come before warp 0's issue (which writes the next mask) by a barrier, not only by the
    // warpgroup's MMAs: compute-sanitizer racecheck's key-mask reports on ManyRows.Bf16StepMatchesCpu
    // went (session 41, H100: 40 lines -> 28, the rest m_pub's and red[]'s, docs/attention.md "The
    // racecheck reports"); H100 session 41: bf16 G 1.2% slower, D and F within noise.
    auto reload = [&](int j) {
      ptx::named_sync(kBarGroup + wg, 128);
      stamp(j, (j & 1) == wg ? kStampIssueOwner : kStampIssueOther);
      load(j);
    };
    int t = wg;
    if (wg == 0 && n_tiles > 0) {
      float s[32];
      qk(0, s);
      wgmma::wait<0>();
      stamp(0, kStampQkDone);
      own(0, s);
      wgmma::wait<0>();
      stamp(0, kStampPvDone);
      if (2 < n_tiles) reload(2);
      t = 2;
    }
    for (; t < n_tiles; t += 2) {
      float s[32];
      if constexpr (kEarlyReload) {
        // s53b: this warpgroup's part of t + 1 leaves once the other's tile t - 1 is added (its p.v retired,
        // `wait<1>`), while the rest of q.k(t) still runs. Why (session 52's stamps, s52a, H100 GPU-fb4909a4 at D):
        // in v18c's round q.k(t) goes first and the other's p.v after it, so the wait before the reload is q.k(t)'s
        // too; with q.k's issue waiting for every slab of t, the part of t + 1 leaves ~1350 cycles after t landed,
        // and the tiles' loads go one after another (one load and q.k's execution in every ~3980-cycle period).
        // Here q.k over this warpgroup's own slabs (sent a round earlier) still goes before the other's publication,
        // as v18c's whole q.k does; the rest (the other's slabs, the rope slab) waits behind the other's p.v.
        // Session 53 (H100s, 3 rounds): s52b (the other's p.v, `wait<0>`, the reload, then all of q.k(t)) 3.7-7.3%
        // slower (D 7.3%): the loads left early, but q.k(t) then waited for the other's publication and this p.v, one
        // chain of ~4370 cycles a tile; s53a (the other's p.v, then all of q.k(t), the reload after `wait<1>`)
        // within noise or slower; s53b 1.5-3.5% faster (D, G, 96 heads, page 128; qlen 4 0.9%), its period ~3730
        // cycles, now bound by the publication chain (the other's p.v and the rest of q.k, then the softmax).
        // Session 54 (H100s; s55a-g, code at c438886): the other's five q.k units (its slabs, the rope slab) split
        // kPre before its p.v, kMid between that p.v and the reload, the rest after, so the reload leaves once the
        // p.v retired: (0, 2), (0, 3) 1-3% slower (the reload left ~500 cycles earlier, but the issue waited for the
        // p.v and the period grew 3735 -> 3852 cycles: the loads had ~1700 cycles of slack); (1, 2), (2, 2), (2, 3),
        // (3, 2), (4, 1) within 1% or slower: the more q.k before the p.v, the later the other warpgroup reaches
        // this publication's barrier (softmax + publication 1111 -> 1670 cycles at (4, 1)).
        qk_mine(t, s);
        pv_other(t - 1);
        qk_rest(t, s);
        wgmma::wait<1>();
        if (t + 1 < n_tiles) reload(t + 1);
        wgmma::wait<0>();
        stamp(t, kStampQkDone);
      } else {
        qk(t, s);
        pv_other(t - 1);
        wgmma::wait<0>();
        stamp(t, kStampQkDone);
        if (t + 1 < n_tiles) reload(t + 1);
      }
      own(t, s);
      wgmma::wait<0>();
      stamp(t, kStampPvDone);
      if (t + 2 < n_tiles) reload(t + 2);
    }
    if (t == n_tiles && t >= 1) pv_other(t - 1);
    wgmma::wait<0>();
    wgmma::fence_operand(o);

    // Row sums: over the quad, then both warpgroups' shares through shared memory.
    float d[2] = {d_run[0], d_run[1]};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
      d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
    }
    if (c == 0) sm.red[wg][row0] = d[0], sm.red[wg][row0 + 8] = d[1];
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = row0 + 8 * h, m = m_base + n;
      if (m >= rows_total) continue;
      // Natural-log state for the shared rules: lse = ln 2 * (m + log2 d); empty rows o = 0, lse = -inf.
      SoftmaxState f;
      f.d = sm.red[0][n] + sm.red[1][n];
      f.m = f.empty() ? -INFINITY : m_run[h] * 0.6931471805599453f;
      const float scale = f.inv_sum() * p.v_scale;
      const OutRow out(p, part, tok_base, m);
#pragma unroll
      for (int jj = 0; jj < kHalfDims / 8; ++jj)
        out.store_pair(p, kHalfDims * wg + 8 * jj + 2 * c, o[4 * jj + 2 * h] * scale, o[4 * jj + 2 * h + 1] * scale);
      if (wg == 0 && c == 0) p.lse[out.lse_index] = f.lse();
    }
    if (wg == 0 && n_tiles > 0) stamp(n_tiles - 1, kStampSegmentEnd);
    done += n_tiles;
  };  // serve

  serve_segments<kThreadsB, kRowsM, true>(p, cta, p.flat_ctas > 0, kTileKeys, tid, sm.flat_start, nullptr,
                                          &sm.segment, serve);
}

}  // namespace

bool attend_rows_bf16_applies(const AttendParams& p) {
  return attend_kernel_mode() > 0 && (p.step_partials || attend_kernel_mode() == 2) && !p.q_fp8 && !p.cache_fp8 &&
         !p.exact_p && attend_o_pairs_aligned(p) && p.many_rows && attend_wgmma_uses_tma(p);
}

namespace {
// v18c's kLean instance (s39a), and at pages of 16
// and 32 keys its kLeanWarps twin (s41d), unless MLA_ROWS_BF16_LEAN=0 (v18c's TmaTiles::issue at every
// page size) or =1 (kLean at every page size). kLeanWarps only where its per-warp issue runs: at other
// pages it takes kLean's paths in its own register allocation, and page 8 ran 1.8% slower so (H200
// session 42: D 360.9, 361.3 against 354.7, 354.5 us; page 64 equal).
int bf16_lean_env() {
  static const int lean = env_choice("MLA_ROWS_BF16_LEAN", {{"0", 0}, {"1", 1}, {"3", 3}}, 3);
  return lean;
}
// Whether a launch at this page size runs kLeanWarps' per-warp issue (TmaTiles' box count).
bool bf16_lean_warps_page(int page_size) { return lean_warps_boxes(kTileKeys / std::min(page_size, kTileKeys)); }
// kLean's kSlabBars twin at pages of 64+ keys (s44b, the default since session 44; MLA_ROWS_BF16_SLABS=0: kLean);
// 2 (s44c, the default since session 46): kLeanWarps' kSlabBars twin at pages of 16 and 32 keys too; 1: there
// kLeanWarps' part barriers, as sessions 44-45.
int bf16_slabs_env() {
  static const int slabs = env_choice("MLA_ROWS_BF16_SLABS", {{"0", 0}, {"1", 1}, {"2", 2}}, 2);
  return slabs;
}
// s47b's timing probes (MLA_ROWS_BF16_PROBE=noload or nomma; s48f's nomma_half, nomma_even; s51a's skeleton; wrong
// results by design, for the bench only): kSlabBars' instance at pages of 64+ keys without its loads past a segment's
// first two tiles, or without its MMAs (and half its slabs' loads), or without both.
int bf16_probe_env() {
  static const int probe = [] {
    const int v = env_choice("MLA_ROWS_BF16_PROBE",
                             {{"0", 0}, {"noload", 1}, {"nomma", 2}, {"nomma_half", 3}, {"nomma_even", 4}, {"skeleton", 5}},
                             0);
    if (v != 0)  // (said once a process: a caller who set it by mistake sees why its bf16 results are wrong)
      std::fprintf(stderr, "mla-decode: MLA_ROWS_BF16_PROBE is set: the bf16 many-rows attend's results are wrong by "
                           "design at pages of 64+ keys (a timing probe)\n");
    return v;
  }();
  return probe;
}
// (MLA_ROWS_BF16_CLUSTER, _SOFT_EARLY, _MULTICAST, _L2_HINT, _L2_PREFETCH: removed, sessions 48-51; the index above
// the instances.)
// MLA_ROWS_BF16_ORDER=0 (session 53): v18c's round at pages of 64+ keys, not s53b's (kEarlyReload, the default).
int bf16_order_env() {
  static const int v = env_choice("MLA_ROWS_BF16_ORDER", {{"0", 0}, {"s53b", 1}}, 1);
  return v;
}
// (MLA_ROWS_BF16_EXP, MLA_ROWS_BF16_DEFER_PV: session 54's s56a-b and s57a, removed in session 55; code at f5d02dc.)
using Bf16RowsKernel = decltype(&attend_rows_bf16_kernel<>);
// kSlabBars' instance at pages of 64+ keys for the round MLA_ROWS_BF16_ORDER chooses, and with kStamps its stamped
// twin (MLA_ROWS_BF16_TIMELINE): one choice for both, so every round has its twin.
template <bool kStamps>
Bf16RowsKernel bf16_round_kernel() {
  return bf16_order_env() == 0 ? attend_rows_bf16_kernel<true, false, true, 0, kStamps>
                               : attend_rows_bf16_kernel<true, false, true, 0, kStamps, true>;
}
// The instance the switches choose at this page size.
Bf16RowsKernel bf16_rows_kernel(int page_size) {
  const bool slabs = bf16_slabs_env() > 0 && page_size >= kTileKeys;  // (kLean's one-box issue: TmaTiles' box_rows)
  const bool warps = bf16_lean_env() == 3 && bf16_lean_warps_page(page_size);
  return bf16_lean_env() != 0 && slabs
             ? (bf16_probe_env() == 1   ? attend_rows_bf16_kernel<true, false, true, 1>
                : bf16_probe_env() == 2 ? attend_rows_bf16_kernel<true, false, true, 2>
                : bf16_probe_env() == 3 ? attend_rows_bf16_kernel<true, false, true, 3>
                : bf16_probe_env() == 4 ? attend_rows_bf16_kernel<true, false, true, 4>
                : bf16_probe_env() == 5 ? attend_rows_bf16_kernel<true, false, true, 5>
                                        : bf16_round_kernel<false>())
         : warps && bf16_slabs_env() == 2 ? attend_rows_bf16_kernel<true, true, true>
         : warps                          ? attend_rows_bf16_kernel<true, true>
         : bf16_lean_env() != 0           ? attend_rows_bf16_kernel<true>
                                          : attend_rows_bf16_kernel<false>;
}
// MLA_ROWS_BF16_TIMELINE=FILE (s52a, session 52; a measurement, bench/rows_timeline.py reads FILE): at pages of 64+
// keys under any of the round's switches (bf16_round_kernel), its kStamps twin (each tile's events stamped).
// A launch outside a graph capture waits for the kernel and rewrites FILE as CSV, a line a stamped tile: cta, smid,
// tile, then the RowsStamp events in SM cycles from the CTA's first stamp (-1: not stamped), so the last eager launch
// of a run is what FILE holds; inside a capture the graph stamps into the same buffer and FILE is left alone.
const char* bf16_timeline_path() {
  static const char* path = std::getenv("MLA_ROWS_BF16_TIMELINE");
  return path && *path ? path : nullptr;
}

// The stamped twin of the instance the switches chose (nullptr: none; the probes and pages under 64 keys have none).
Bf16RowsKernel stamped_twin(Bf16RowsKernel kernel) {
  return kernel == bf16_round_kernel<false>() ? bf16_round_kernel<true>() : nullptr;
}

void launch_stamps(const AttendParams& in, dim3 grid, const CUtensorMap& map, cudaStream_t stream,
                   Bf16RowsKernel kernel) {
  static StampBuffer buffer;
  const size_t words = size_t(grid.x) * kStampTiles * kStampWords;
  const std::vector<uint64_t> host = buffer.launch(words, stream, "MLA_ROWS_BF16_TIMELINE", [&](uint64_t* stamps) {
    AttendParams p = in;
    p.timeline = stamps;
    kernel<<<grid, kThreadsB, bf16_rows_smem_bytes(), stream>>>(p, map);
  });
  if (host.empty()) return;  // (a graph capture)
  std::FILE* f = open_stamp_csv(bf16_timeline_path(), "MLA_ROWS_BF16_TIMELINE");
  std::fprintf(f, "cta,smid,tile,issue_owner,issue_other,qk_start,first_slab,qk_issued,qk_done,published,pv_done,"
                  "other_published,segment_start,segment_end\n");
  for (size_t cta = 0; cta < grid.x; ++cta) {
    const uint64_t* r = &host[cta * kStampTiles * kStampWords];
    uint64_t t0 = UINT64_MAX;
    for (int i = 0; i < kStampTiles * kStampWords; ++i)
      if (i % kStampWords != kStampSmid && r[i] != 0) t0 = std::min(t0, r[i]);
    if (t0 == UINT64_MAX) continue;  // (a CTA with no tiles)
    for (int j = 0; j < kStampTiles; ++j) {
      const uint64_t* e = &r[j * kStampWords];
      bool any = false;
      for (int k = 0; k < kStampSmid; ++k) any = any || e[k] != 0;
      if (!any) continue;
      std::fprintf(f, "%zu,%llu,%d", cta, (unsigned long long)(r[kStampSmid] - 1), j);
      for (int k = 0; k < kStampSmid; ++k) std::fprintf(f, ",%lld", e[k] ? (long long)(e[k] - t0) : -1ll);
      std::fprintf(f, "\n");
    }
  }
  std::fclose(f);
}
}  // namespace

void prepare_attend_rows_bf16_kernel() {  // (the instances launch_attend_rows_bf16 launches: pages under 16, 16-32, 64+)
  for (const int page_size : {8, 16, 64}) {
    const Bf16RowsKernel kernel = bf16_rows_kernel(page_size);
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bf16_rows_smem_bytes()));
    // (MLA_ROWS_BF16_TIMELINE launches the stamped twin)
    const Bf16RowsKernel stamped = bf16_timeline_path() ? stamped_twin(kernel) : nullptr;
    if (stamped)
      MLA_CUDA_CHECK(
          cudaFuncSetAttribute(stamped, cudaFuncAttributeMaxDynamicSharedMemorySize, bf16_rows_smem_bytes()));
  }
}

void launch_attend_rows_bf16(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream) {
  const dim3 grid = attend_launch_grid(p, kRowsM);
  const Bf16RowsKernel kernel = bf16_rows_kernel(p.page_size);
  if (bf16_timeline_path()) {
    if (const Bf16RowsKernel stamped = stamped_twin(kernel)) {
      launch_stamps(p, grid, map, stream, stamped);
      return;
    }
  }
  kernel<<<grid, kThreadsB, bf16_rows_smem_bytes(), stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
