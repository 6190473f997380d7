// The many-rows attend kernel's instances and launches (issue 5, v13): the kernel, its design and its
// measured versions are in attend_rows_kernel.cuh; which height, tiles and instance a step takes, here.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/attend_rows_kernel.cuh"
#include "cuda/check.hpp"
#include "cuda/stages.hpp"
#include "cuda/stamp_buffer.hpp"
#include "cuda/tma.hpp"

namespace mla::cuda {
namespace {

// The integer an environment variable holds, or `fallback` where it is unset (the measurement
// switches below, each read once per process).
int env_int(const char* name, int fallback) {
  const char* env = std::getenv(name);
  return env ? std::atoi(env) : fallback;
}
int rows_min_env() {
  static const int rows = std::max(0, env_int("MLA_ATTEND_ROWS_MIN", 0));
  return rows;
}

}  // namespace

int attend_rows_min() {
  // MLA_ATTEND_ROWS_MIN=N: the many-rows kernel from N query rows a request (heads x qlen) up, for
  // any batch (forced: the tests run it on every case with N = 1; 100000 turns it off); unset or 0:
  // the default below, with the batch rule of attend_rows_wanted.
  return rows_min_env() > 0 ? rows_min_env() : kAttendRowsMinDefault;
}

bool attend_rows_wanted(int batch, int rows, int sms) {
  if (rows < attend_rows_min()) return false;
  // Unforced, only where the batch alone gives a quarter wave of 64-row CTAs: at B = 1 the kernel
  // needs many splits, each writing 64 rows x 2 KB of partials for a pair of key tiles (128
  // heads, ctx 8192: 38.1 us vs 19.5 for the 16-row kernel; H200, bd392bb). Up to 48 rows (one
  // 32- or 48-row CTA a request) from B = 2: 24 rows at B = 4 / 16 / 32 19.5 / 41.6 / 68.9 us vs
  // 20.7 / 46.9 / 83.1, 48 rows at B = 16 50.1 vs 67.8 (s15's full run); B = 3 24 / 48 rows 18.5 /
  // 22.2 vs 22.7 / 26.2, B = 2 48 rows 20.0 vs 22.2, 24 rows 16.3 vs 16.9, 32 rows 16.8 vs 16.4
  // (s16f, ctx 8192); B = 1 was a tie at 32 rows (20.1 vs 20.0, ctx 32768). H200.
  if (rows_min_env() > 0) return true;
  if (rows <= kAttendRowsSmallBatchMax && batch >= kAttendRowsSmallBatch) return true;
  return int64_t(batch) * ((rows + kAttendRowsPerCta - 1) / kAttendRowsPerCta) * 4 >= sms;
}

namespace {
// MLA_ROWS_MULTICAST=0: no 2-CTA clusters.
bool rows_multicast_env() {
  static const bool on = env_int("MLA_ROWS_MULTICAST", 1) != 0;
  return on;
}
// The 48- and 32-row CTAs' TMA instances split q.k by tile (kSplitQk, s29); MLA_ATTEND_SPLIT_QK=0
// takes the split by rows there too.
bool split_qk_env() {
  static const bool on = env_int("MLA_ATTEND_SPLIT_QK", 1) != 0;
  return on;
}
template <int kRowsN, bool kSplit>
constexpr bool kSplitQk = kSplit && kRowsN < 64;
// Page 1's instances: one box a key row, their rows four at a time (kAhead) at 64 and 32 rows, the
// tensor map's address warp-uniform (kMapUniform), as a 2-CTA cluster (kCluster: rows_cluster) or not.
template <int kRowsN, bool kCluster, bool kSplit = true>
constexpr auto kPage1Kernel =
    attend_rows_kernel<true, kRowsN, kRowsN != 48, kRowsN != 48 ? 4 : 1, kCluster, true, kSplitQk<kRowsN, kSplit>>;
// pages of 8+ rows (and 2, 4 at 48 rows) / pages of 2 and 4 at 64 and 32 rows
template <int kRowsN, bool kSplit = true, bool kBulkO = false>
constexpr auto kTmaKernel =
    attend_rows_kernel<true, kRowsN, false, 1, false, false, kSplitQk<kRowsN, kSplit>, 0, false, 0, kBulkO>;
// s60a (session 56; attend_rows_kernel.cuh's kBulkO): the last segment writes o by a bulk copy a row from shared
// memory, where o's rows are 16-byte aligned (o_bulk_aligned). By default the 64-row instance on fixed splits (D,
// E, 128 heads); MLA_ROWS_O_BULK=0 nowhere, =1 also the q.k-split 48- and 32-row ones and under the flat plan (the
// stamped twin alike). H100, session 56 (attend µs, means of 3 rounds, bulk / direct): call 5 (the default against
// =0) D at page 16 231.0 / 234.1, 64 heads x qlen 2 229.9 / 233.5, F (unchanged) 117.2 / 117.6; call 4 (=1 against
// the direct stores) D 228.4 / 231.4, F, G, 96 heads within 0.2%, and the uneven qlen-4 batch (flat plan) 231.6 /
// 216.7, 7% slower, not understood (its stamped eager launch ran its CTAs in fewer cycles): hence 64 rows, fixed.
int rows_o_bulk_env() {  // -1: the default
  static const int mode = env_choice("MLA_ROWS_O_BULK", {{"0", 0}, {"1", 1}}, -1);
  return mode;
}
bool o_bulk_aligned(const AttendParams& p) {
  const int64_t esize = p.o_bf16 ? 2 : 4;
  return reinterpret_cast<uintptr_t>(p.o) % 16 == 0 && (p.o_split_stride * esize) % 16 == 0 &&
         (p.o_s_stride * esize) % 16 == 0 && (p.o_h_stride * esize) % 16 == 0;
}
template <int kRowsN, bool kSplit>
constexpr bool kBulkInstance = kSplit;  // (not the 48- and 32-row instances without the split q.k)
// Whether this height's instance sends o by bulk copies under MLA_ROWS_O_BULK (what launch_rows_tma adds at a launch:
// o's rows aligned, and by default fixed splits); its kernels are prepared only then.
template <int kRowsN, bool kSplit>
bool rows_o_bulk_height() {
  const int mode = rows_o_bulk_env();
  return kBulkInstance<kRowsN, kSplit> && (mode == 1 || (mode < 0 && kRowsN == 64));
}
// MLA_ROWS_TIMELINE=FILE (session 55; a measurement, bench/rows_cta_timeline.py reads FILE): kTmaKernel's stamped twin
// (kStamps: each segment's phases, attend_rows_kernel.cuh), where kTmaKernel would run. Why: the flat plan's segment
// switch cost the bf16 kernel 11-28 µs (its tile stamps, session 55) and this kernel as much (F 121 -> 143 µs under
// MLA_ROWS_FILL=full), though its producer sends the next segment's tiles ahead. A launch outside a graph capture
// waits for the kernel and rewrites FILE as CSV (a line a segment); inside a capture FILE is left alone.
// MLA_ROWS_TIMELINE_PROBE=nostore beside it (a probe; results wrong): the 64-row and 48-row split-q.k twins (D, F, G,
// 96 heads) without o's and lse's stores (kStampsNoStore), elsewhere the stamped twin.
template <int kRowsN, bool kSplit = true, int kStamps = 1, bool kBulkO = false>
constexpr auto kTmaStampedKernel =
    attend_rows_kernel<true, kRowsN, false, 1, false, false, kSplitQk<kRowsN, kSplit>, 0, false, kStamps, kBulkO>;
const char* rows_timeline_path() {
  static const char* path = std::getenv("MLA_ROWS_TIMELINE");
  return path && *path ? path : nullptr;
}
bool rows_timeline_nostore() {
  static const bool on = env_choice("MLA_ROWS_TIMELINE_PROBE", {{"0", 0}, {"nostore", 1}}, 0) == 1;
  return on;
}
template <int kRowsN, bool kSplit>
constexpr bool kNoStoreProbe = kRowsN == 64 || (kRowsN == 48 && kSplit);
template <int kRowsN, bool kSplit>
auto rows_stamped_kernel(bool bulk) {
  if constexpr (kNoStoreProbe<kRowsN, kSplit>)
    if (rows_timeline_nostore()) return kTmaStampedKernel<kRowsN, kSplit, kStampsNoStore>;
  if constexpr (kBulkInstance<kRowsN, kSplit>)
    if (bulk) return kTmaStampedKernel<kRowsN, kSplit, 1, true>;
  return kTmaStampedKernel<kRowsN, kSplit>;
}
template <int kRowsN, bool kSplit>
void launch_rows_stamps(const AttendParams& in, const CUtensorMap& map, dim3 grid, int smem, bool bulk,
                        cudaStream_t stream) {
  static StampBuffer buffer;
  const size_t words = size_t(grid.x) * kRowsStampWords;
  const std::vector<uint64_t> host = buffer.launch(words, stream, "MLA_ROWS_TIMELINE", [&](uint64_t* stamps) {
    AttendParams p = in;
    p.timeline = stamps;
    rows_stamped_kernel<kRowsN, kSplit>(bulk)<<<grid, kRowsCtaThreads<true>, smem, stream>>>(p, map);
  });
  if (host.empty()) return;  // (a graph capture)
  // FILE: a line a segment; FILE.pairs.csv: a line a consumer warpgroup and pair of the first segment (RowsPairStamp,
  // s67a). Times in cycles from the CTA's start (-1: not stamped).
  std::FILE* f = open_stamp_csv(rows_timeline_path(), "MLA_ROWS_TIMELINE");
  const std::string pairs_path = std::string(rows_timeline_path()) + ".pairs.csv";
  std::FILE* g = open_stamp_csv(pairs_path.c_str(), "MLA_ROWS_TIMELINE");
  std::fprintf(f, "rows,cta,smid,segment,tiles,entry,prologue,first_landed,last_pv,end,last_pv1,sums,final\n");
  std::fprintf(g, "rows,cta,smid,wg,pair,qk_issued,qk_done,pt_free,p_written,voted,pv_issued,next_landed\n");
  for (size_t cta = 0; cta < grid.x; ++cta) {
    const uint64_t* r = &host[cta * kRowsStampWords];
    if (r[0] == 0) continue;  // (not stamped)
    const auto cycles = [&](uint64_t t) { return t ? (long long)(t - r[1]) : -1ll; };
    for (int seg = 0; seg < kRowsStampSegments; ++seg) {
      const uint64_t* e = &r[2 + seg * kRowsSegmentWords];
      if (e[kSegEntry] == 0) break;
      std::fprintf(f, "%d,%zu,%llu,%d,%llu", kRowsN, cta, (unsigned long long)(r[0] - 1), seg,
                   (unsigned long long)e[kSegTiles]);
      for (const int k :
           {kSegEntry, kSegPrologue, kSegFirstLanded, kSegLastPv, kSegEnd, kSegLastPv1, kSegSums, kSegFinal})
        std::fprintf(f, ",%lld", cycles(e[k]));
      std::fprintf(f, "\n");
    }
    for (int wg = 0; wg < kGroups; ++wg)
      for (int pair = 0; pair < kRowsStampPairs; ++pair) {
        const uint64_t* e = &r[kRowsPairBase + (wg * kRowsStampPairs + pair) * kRowsPairEvents];
        if (e[kPairQkIssued] == 0) break;  // (the segment had fewer pairs)
        std::fprintf(g, "%d,%zu,%llu,%d,%d", kRowsN, cta, (unsigned long long)(r[0] - 1), wg, pair);
        for (int k = 0; k < kRowsPairEvents; ++k) std::fprintf(g, ",%lld", cycles(e[k]));
        std::fprintf(g, "\n");
      }
  }
  std::fclose(f);
  std::fclose(g);
}
template <int kRowsN, bool kSplit = true>
constexpr auto kSmallPageKernel = attend_rows_kernel<true, kRowsN, true, 1, false, false, kSplitQk<kRowsN, kSplit>>;
// Page 1's bulk row copies (s31a): the CTA copies each key row with one bulk copy and takes q.k's
// keys from registers in groups of kRowCopySteps k32 steps (64-row CTAs 1); 64- and 48-row ones as
// 2-CTA clusters where the boxes would be (rows_cluster), each producer copying one tile of a pair
// into both CTAs. Since session 33 the 48- and 32-row CTAs outside clusters, in 2-step groups: H200
// (GPU-e6875044, each twice, boxes / 2-step copies) F 143.8-159.8 / 116.6-121.9 us, qlen 2 113.2-113.3
// / 101.1-101.3, 16 heads x qlen 2 114.4-114.5 / 102.2-102.5, uneven F 247.1 / 209.4-210.7. Since
// session 43 (s41c) the 48-row clusters (G and 96 heads at page 1) too, in 2-step groups: H200 session
// 43 (GPU-4f77e6e7, three processes each, means) 96 heads 206.4 -> 200.3 us, G 112.9 -> 108.0. Held
// back until then by racecheck's report on their copies (ManyRows.SmallPagesStepMatchesCpu, 2 lines),
// which went with every consumer lane arriving on a stage's empty mbarrier (kConsumerLaneArrivals).
// The 64-row clusters (D) stay on boxes (D 256.4-257.2 / 283.3-283.5 with copies).
// MLA_ROWS_ROW_COPIES=0: boxes everywhere; =1 or =2: copies in every
// page-1 CTA, clusters and 64 rows included, in groups of that many steps; =3: the clusters on boxes
// (the default before session 43).
int rows_row_copies_env() {  // -1: the default
  static const int mode = env_choice("MLA_ROWS_ROW_COPIES", {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}}, -1);
  return mode;
}
// Whether a page-1 CTA of kRowsN rows (in a 2-CTA cluster or not) takes the row copies.
template <int kRowsN>
bool rows_row_copies(bool cluster) {
  const int mode = rows_row_copies_env();
  if (mode < 0) return cluster ? kRowsN == 48 : kRowsN < 64;
  return mode == 1 || mode == 2 || (mode == 3 && !cluster && kRowsN < 64);
}
template <int kRowsN, int kSteps, bool kCluster = false>
constexpr auto kRowCopyKernel =
    attend_rows_kernel<true, kRowsN, false, 1, kCluster, false, kSplitQk<kRowsN, true>, kSteps>;
template <int kRowsN, bool kSplit>
void prepare_rows_split() {
  prepare_rows_kernel<kTmaKernel<kRowsN, kSplit>, kRowsN>();
  if (rows_timeline_path()) prepare_rows_kernel<kTmaStampedKernel<kRowsN, kSplit>, kRowsN>();
  if constexpr (kBulkInstance<kRowsN, kSplit>)
    if (rows_o_bulk_height<kRowsN, kSplit>()) {
      prepare_rows_kernel<kTmaKernel<kRowsN, kSplit, true>, kRowsN>();
      if (rows_timeline_path()) prepare_rows_kernel<kTmaStampedKernel<kRowsN, kSplit, 1, true>, kRowsN>();
    }
  if constexpr (kNoStoreProbe<kRowsN, kSplit>)
    if (rows_timeline_path()) prepare_rows_kernel<kTmaStampedKernel<kRowsN, kSplit, kStampsNoStore>, kRowsN>();
  // The row-copy instances unless MLA_ROWS_ROW_COPIES=0 (by default the 48- and 32-row ones outside
  // clusters and the 48-row clusters run); 64 rows: one group step.
  if constexpr (kSplit) {
    if (rows_row_copies_env() != 0) {
      prepare_rows_kernel<kRowCopyKernel<kRowsN, 1>, kRowsN>();
      if constexpr (kRowsN < 64) prepare_rows_kernel<kRowCopyKernel<kRowsN, 2>, kRowsN>();
      if constexpr (kRowsN != 32) prepare_rows_kernel<kRowCopyKernel<kRowsN, 1, true>, kRowsN>();
      if constexpr (kRowsN == 48) prepare_rows_kernel<kRowCopyKernel<kRowsN, 2, true>, kRowsN>();
    }
  }
  if constexpr (kRowsN != 48) prepare_rows_kernel<kSmallPageKernel<kRowsN, kSplit>, kRowsN>();  // pages 2 and 4
  prepare_rows_kernel<kPage1Kernel<kRowsN, false, kSplit>, kRowsN>();
  if constexpr (kRowsN != 32) prepare_rows_kernel<kPage1Kernel<kRowsN, true, kSplit>, kRowsN>();  // (rows_cluster)
}
template <int kRowsN>
void prepare_rows_height() {
  prepare_rows_split<kRowsN, true>();
  if constexpr (kRowsN < 64) prepare_rows_split<kRowsN, false>();
  prepare_rows_kernel<attend_rows_kernel<false, kRowsN>, kRowsN>();
}
// A launch of the many-rows kernel with TMA tiles as clusters of 2 CTAs along x (attr: its storage).
cudaLaunchConfig_t pair_config(dim3 grid, int smem, cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kRowsCtaThreads<true>);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 2, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}
// Its clusters of 2 that fit at once on the device (one CTA an SM). (The occupancy query counts
// the kernel's dynamic shared memory against its attribute: set first, else it answers 0.)
template <int kRowsN>
int max_pairs() {
  static const int pairs = [] {
    prepare_rows_kernel<kPage1Kernel<kRowsN, true>, kRowsN>();
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = pair_config(dim3(2), rows_smem_bytes<kRowsN>(), nullptr, attr);
    int n = 0;
    MLA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kPage1Kernel<kRowsN, true>, &cfg));
    return n;
  }();
  return pairs;
}
// Page 1 (one box a key row, five TMA loads): the two row tiles of the same keys as a 2-CTA cluster
// where the request has an even number of 64- or 48-row tiles and all the launch's pairs fit at
// once, each CTA's producer issuing one tile of every pair into both (TMA multicast, kMulticast).
// H200, session 25, call 2 (GPU-d3102432, each twice, against MLA_ROWS_MULTICAST=0): 48-row CTAs
// (whose producer issues a box at a time: no registers for kAhead) 96 heads 215.0-216.6 vs
// 287.7-288.8 us, G (32 x 12 heads x qlen 8) 117.5-117.6 vs 154.0-154.7; 64-row CTAs (kAhead) D
// 264.4-264.6 vs 276.2-277.2, u32768 x 128 heads 553.8-554.7 vs 572.8-572.9. Not at other pages,
// where the CTAs' lock step (a stage is refilled when both are done with it) costs more than the
// halved issue brings: page 64 D 239.9-240.0 vs 230.8-231.2, 96 heads 205.3-205.7 vs 203.7-204.3,
// G 111.5-111.6 vs 110.0-110.3, u32768 484.3-484.4 vs 470.4-473.9; page 4 D 237.2-238.0 vs
// 235.3-235.6. (Call 1: with `.release.cluster` on the consumers' remote arrival, a MEMBAR.ALL.GPU
// a pair and warp, the clusters were up to 23% slower at page 64.)
template <int kRowsN>
bool rows_cluster(const AttendParams& p, dim3 grid) {
  const int m_tiles = attend_row_tiles(p, kRowsN);
  return kRowsN != 32 && p.page_size == 1 && rows_multicast_env() && m_tiles % 2 == 0 &&
         int(grid.x / 2) <= max_pairs<kRowsN>();
}
template <auto kKernel>
void launch_rows_cluster(const AttendParams& p, const CUtensorMap& map, dim3 grid, int smem, cudaStream_t stream) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pair_config(grid, smem, stream, attr);
  MLA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kKernel, p, map));
}
// The row-copy instance of a height for MLA_ROWS_ROW_COPIES's group steps (1, or 2 as by default and
// under =2 and =3).
// (64 rows: 1-step groups whatever the switch says: 2-step groups of both tiles spill 38 local loads
// and 19 stores in its pair loop.)
template <int kRowsN, bool kCluster>
void launch_row_copies(const AttendParams& p, const CUtensorMap& map, dim3 grid, int smem, cudaStream_t stream) {
  if constexpr (kRowsN < 64) {
    if (rows_row_copies_env() != 1) {  // (2, 3, or the default)
      if constexpr (kCluster) launch_rows_cluster<kRowCopyKernel<kRowsN, 2, true>>(p, map, grid, smem, stream);
      else kRowCopyKernel<kRowsN, 2><<<grid, kRowsCtaThreads<true>, smem, stream>>>(p, map);
      return;
    }
  }
  if constexpr (kCluster) {
    launch_rows_cluster<kRowCopyKernel<kRowsN, 1, true>>(p, map, grid, smem, stream);
  } else {
    kRowCopyKernel<kRowsN, 1><<<grid, kRowsCtaThreads<true>, smem, stream>>>(p, map);
  }
}
// The TMA instances (kSplit: q.k split by tile where the height has it, kSplitQk).
// Boxes of 1-4 rows go out with uniform operands (kSmallBoxes; the 48-row kernel's own form).
// At page 1 (kPage1Kernel) the 64- and 32-row CTAs take their rows four at a time through shared
// memory (kAhead; H200, session 24: D 276-280 vs 297-298 us, u32768 x 128 heads 569-571 vs
// 593-595, 32-row CTAs 3.5-4.4% faster; at pages 2 and 4 and in the 48-row CTAs 4-7% slower,
// where their producer spills at 24 registers), and every height issues with the tensor map's
// address warp-uniform (kMapUniform; H200, session 25 call 6, GPU-e16ab075, each twice: qlen 2
// 116.3-116.4 vs 139.7-140.1 us, 16 heads x qlen 2 117.2 vs 140.3-140.5, D 255.1-257.0 vs
// 266.8-268.1, F 150.0-150.1 vs 154.3-154.7, u32768 x 128 heads 538.2-539.0 vs 554.4-556.3; 96
// heads and G within 0.5%).
template <int kRowsN, bool kSplit>
void launch_rows_tma(const AttendParams& p, const CUtensorMap& map, dim3 grid, int smem, cudaStream_t stream) {
  if (p.page_size == 1) {
    if constexpr (kRowsN != 32)
      if (rows_cluster<kRowsN>(p, grid)) {
        if constexpr (kSplit)
          if (rows_row_copies<kRowsN>(true)) return launch_row_copies<kRowsN, true>(p, map, grid, smem, stream);
        return launch_rows_cluster<kPage1Kernel<kRowsN, true, kSplit>>(p, map, grid, smem, stream);
      }
    if constexpr (kSplit)
      if (rows_row_copies<kRowsN>(false)) return launch_row_copies<kRowsN, false>(p, map, grid, smem, stream);
    kPage1Kernel<kRowsN, false, kSplit><<<grid, kRowsCtaThreads<true>, smem, stream>>>(p, map);
    return;
  }
  if constexpr (kRowsN != 48) {
    if (p.page_size < kFp8SmallPage) {
      kSmallPageKernel<kRowsN, kSplit><<<grid, kRowsCtaThreads<true>, smem, stream>>>(p, map);
      return;
    }
  }
  const bool bulk = rows_o_bulk_height<kRowsN, kSplit>() && o_bulk_aligned(p) &&
                    (rows_o_bulk_env() == 1 || p.flat_ctas == 0);
  if (rows_timeline_path()) return launch_rows_stamps<kRowsN, kSplit>(p, map, grid, smem, bulk, stream);
  if constexpr (kBulkInstance<kRowsN, kSplit>)
    if (bulk) return kTmaKernel<kRowsN, kSplit, true><<<grid, kRowsCtaThreads<true>, smem, stream>>>(p, map);
  kTmaKernel<kRowsN, kSplit><<<grid, kRowsCtaThreads<true>, smem, stream>>>(p, map);
}
template <int kRowsN>
void launch_rows_height(const AttendParams& p, const CUtensorMap& map, bool tma, cudaStream_t stream) {
  const dim3 grid = attend_launch_grid(p, kRowsN);
  const int smem = rows_smem_bytes<kRowsN>();
  if (!tma) {
    attend_rows_kernel<false, kRowsN><<<grid, kRowsCtaThreads<false>, smem, stream>>>(p, map);
    return;
  }
  if constexpr (kRowsN < 64)
    if (!split_qk_env()) return launch_rows_tma<kRowsN, false>(p, map, grid, smem, stream);
  launch_rows_tma<kRowsN, true>(p, map, grid, smem, stream);
}
}  // namespace

void prepare_attend_rows_kernel() {
  prepare_rows_height<64>();
  prepare_rows_height<48>();
  prepare_rows_height<32>();
}

int attend_rows_max_pairs(int rows_per_cta) {
  return rows_per_cta == 64 ? max_pairs<64>() : rows_per_cta == 48 ? max_pairs<48>() : 0;
}

int attend_rows_cta_rows(int rows) {
  // The shortest CTAs of 32, 48 or 64 rows that need no more CTAs a request than 64-row ones (the
  // plan's count, kAttendRowsPerCta): 32 for 1-32 rows, 48 for 33-48 and 65-96, 64 for 49-64 and
  // 97-128, ... MLA_ATTEND_ROWS_CTA=64 (or 48) caps the choice at that height (comparisons).
  static const int cap = env_int("MLA_ATTEND_ROWS_CTA", 32);
  const int tiles = (rows + kAttendRowsPerCta - 1) / kAttendRowsPerCta;
  for (int height : {32, 48})
    if (height >= cap && (rows + height - 1) / height == tiles) return height;
  return kAttendRowsPerCta;
}

void launch_attend_rows(const AttendParams& p, const CUtensorMap& map, bool tma, cudaStream_t stream) {
  switch (attend_rows_cta_rows(p.heads * p.qlen)) {
    case 32: launch_rows_height<32>(p, map, tma, stream); break;
    case 48: launch_rows_height<48>(p, map, tma, stream); break;
    default: launch_rows_height<64>(p, map, tma, stream);
  }
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
