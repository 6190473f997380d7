// The 16-row wgmma attend kernel's fp8 instances and launch (the kernel, its design and measured
// versions: attend_wgmma_kernel.cuh, docs/attention.md).
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "cuda/attend_wgmma_kernel.cuh"
#include "cuda/check.hpp"
#include "cuda/stages.hpp"
#include "cuda/stamp_buffer.hpp"
#include "cuda/tma.hpp"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

template <int kStages, int kGroupSteps, Tiles kTiles, bool kTimeline = false, bool kFastDivs = false>
void set_smem_limit() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(attend_wgmma_kernel<kStages, kGroupSteps, kTiles, kTimeline, kFastDivs>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<kStages, kTiles>()));
}

// The params with heads_magic set: the 16-row kernel divides its query rows m by G with it
// (m < G Q + kN <= 2^16, and G <= 2^16: m G < 2^32, fast_div.hpp's bound; CudaBackend's
// constructor limits G).
AttendParams with_heads_magic(const AttendParams& in) {
  MLA_REQUIRE(in.heads >= 1 && int64_t(in.heads) * in.qlen + kN <= 65536,
              "attend: heads x qlen + 16 must be at most 65536 (fast_div.hpp), got heads ", in.heads, ", qlen ",
              in.qlen);
  AttendParams p = in;
  p.heads_magic = div_magic(uint32_t(in.heads));
  return p;
}

// The params of a kFastDivs launch (grid: the launch's): CtaWork's and the flat plan's magics, or
// false where a multiply-shift would not be exact (fast_div.hpp: x d < 2^32; grids of ~10^6 CTAs
// and more take the instance with divisions).
bool with_fast_divs(AttendParams& p, dim3 grid) {
  const uint32_t m_tiles = uint32_t((p.heads * p.qlen + kN - 1) / kN);
  const uint32_t works = (grid.x + m_tiles - 1) / m_tiles;
  if (uint64_t(grid.x) * m_tiles >= (uint64_t(1) << 32) || uint64_t(works) * uint32_t(p.splits) >= (uint64_t(1) << 32))
    return false;
  p.m_tiles_magic = div_magic(m_tiles);
  p.splits_magic = div_magic(uint32_t(p.splits));
  p.flat_ctas_magic = p.flat_ctas > 0 ? div_magic(uint32_t(p.flat_ctas)) : 0;
  return true;
}

// q.k accumulators of 2 k32 steps (one wave of 9) by default: rel L2 of q.k 1.6e-4 vs 1.1e-4 with
// one a step, and 94.4 vs 96.2 µs at B64, 566 vs 601 µs with 128 heads, 286 vs 301 at qlen 4 (H200,
// f27c94a); the step's bf16 output does not see the difference. MLA_ATTEND_QK_GROUP=1: one a step.
int qk_group_steps() {
  static const int steps = [] {
    const char* env = std::getenv("MLA_ATTEND_QK_GROUP");
    return env && std::atoi(env) == 1 ? 1 : 2;
  }();
  return steps;
}

// The cache's tensor map for TMA boxes of box_rows rows, encoded once per (cache, shape) and reused
// (a host call of a few µs; a graph captures the map by value with the launch).
const CUtensorMap& cache_map(const AttendParams& p, int box_rows) {
  struct Key {
    const void* base;
    int64_t rows, width, stride;  // width: a row's bytes (an fp8 and a bf16 view may share the rest)
    int box_rows;
    bool operator==(const Key&) const = default;
  };
  thread_local Key key{};
  thread_local CUtensorMap map{};
  const int64_t elem = p.cache_fp8 ? 1 : 2;  // the map is over bytes: a bf16 row is 1152 of them
  const Key want{p.cache, p.num_pages * p.page_size, kRow * elem, p.row_stride * elem, box_rows};
  if (!(key == want)) {
    map = make_tensor_map_bytes_sw128(p.cache, want.rows, want.width, want.stride, box_rows);
    key = want;
  }
  return map;
}

// MLA_ATTEND_TIMELINE=FILE (measurement: scripts/device-check timeline): the TMA kernel (2-step
// q.k groups) with per-CTA phase stamps; a launch outside a graph capture waits for the kernel and
// rewrites FILE as CSV (cta, smid, start, prologue, first_tile, last_tile, end in ns, tiles,
// segments, then the prologue's steps: init, plan, issued, query in ns, then the first segment
// switch: the first segment's last tile, the second's start, prologue, first tile in ns; a CTA of
// one segment repeats its start there), so the last eager launch
// of a run is what FILE holds. A launch of fixed splits stamps s73a's instance without the flat plan's
// code (MLA_ATTEND_FIXED_ONLY=0: the flat-capable one).
const char* timeline_path() {
  static const char* path = std::getenv("MLA_ATTEND_TIMELINE");
  return path && *path ? path : nullptr;
}

void launch_timeline(const AttendParams& in, dim3 grid, const CUtensorMap& map, bool fixed_only, cudaStream_t stream) {
  static StampBuffer buffer;
  const size_t words = size_t(grid.x) * kTimelineWords;
  const std::vector<uint64_t> host = buffer.launch(words, stream, "MLA_ATTEND_TIMELINE", [&](uint64_t* stamps) {
    AttendParams p = in;
    p.timeline = stamps;
    MLA_REQUIRE(with_fast_divs(p, grid), "MLA_ATTEND_TIMELINE: a grid of ", grid.x,
                " CTAs is past the multiply-shifts' bound");
    if (fixed_only)  // (s73a's stamped twin: attend_wgmma_fixed.cu)
      launch_attend_wgmma_fixed_timeline(p, map, grid, stream);
    else
      attend_wgmma_kernel<2, 2, Tiles::kBoxes, true, true>
          <<<grid, kThreads, smem_bytes<2, Tiles::kBoxes>(), stream>>>(p, map);
  });
  if (host.empty()) return;  // (a graph capture)
  std::FILE* f = open_stamp_csv(timeline_path(), "MLA_ATTEND_TIMELINE");
  std::fprintf(f,
               "cta,smid,start_ns,prologue_ns,first_tile_ns,last_tile_ns,end_ns,tiles,segments,init_ns,plan_ns,"
               "issued_ns,query_ns,seg0_last_tile_ns,seg1_start_ns,seg1_prologue_ns,seg1_first_tile_ns\n");
  for (size_t c = 0; c < grid.x; ++c) {
    const uint64_t* r = &host[kTimelineWords * c];
    auto u = [&](int k) { return (unsigned long long)r[k]; };
    std::fprintf(f, "%zu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n", c, u(5),
                 u(0), u(1), u(2), u(3), u(4), u(6), u(7), u(8), u(9), u(10), u(11), u(15), u(12), u(13), u(14));
  }
  std::fclose(f);
}

}  // namespace

void prepare_attend_wgmma_kernels() {
  set_smem_limit<2, 1, Tiles::kCopies>();
  set_smem_limit<2, 2, Tiles::kCopies>();
  set_smem_limit<2, 1, Tiles::kBoxes>();
  set_smem_limit<2, 2, Tiles::kBoxes>();
  set_smem_limit<2, 1, Tiles::kRows>();
  set_smem_limit<2, 3, Tiles::kRows>();
  set_smem_limit<2, 2, Tiles::kBoxes, false, true>();
  set_smem_limit<2, 2, Tiles::kBoxes, true, true>();
  if (attend_q_split_enabled()) prepare_attend_wgmma_q_split();  // (only where their switches allow)
  if (attend_rows_q_split_enabled()) prepare_attend_rows_q_split();
  if (attend_bf16_16row_enabled()) prepare_attend_wgmma_bf16();
  if (attend_skew_enabled()) prepare_attend_wgmma_skew();
  if (attend_fixed_only_enabled()) prepare_attend_wgmma_fixed();
  prepare_attend_rows_kernel();
  prepare_attend_rows_bf16_kernel();
}

AttendKernel launch_attend_wgmma(const AttendParams& in, cudaStream_t stream) {
  const AttendParams p = with_heads_magic(in);
  const bool tma = attend_wgmma_uses_tma(p);
  MLA_REQUIRE(p.flat_ctas == 0 || ((tma || !p.many_rows || attend_rows_gathers(p)) && p.dcp_size == 1 &&
                                    p.batch <= kMaxFlatBatch),
              "attend: the flat plan needs W = 1, B <= ", kMaxFlatBatch, " and TMA or gathered tiles for many rows");
  // The flat plan: flat_ctas key-CTAs x the row tiles; else one CTA per (request, split, row tile).
  // s73a (the default; MLA_ATTEND_FIXED_ONLY=0: off): fixed splits take attend_wgmma_fixed.cu's instances without the
  // flat code.
  const bool fixed_only = p.flat_ctas == 0 && attend_fixed_only_enabled();
  const dim3 grid = attend_launch_grid(p, kN);
  const CUtensorMap map = tma ? cache_map(p, std::min(p.page_size, kTileKeys)) : CUtensorMap{};
  // A plain launch: as a programmatic dependent (pdl.cuh) its CTAs took SM slots the query kernel
  // still needed (B1 step 52.3 -> 54.8 µs in a graph, 54.7 -> 63.3 eager; H200, 7a1c283). Nor does any attend
  // kernel trigger its dependents early: post launched at attend's start (griddepcontrol.launch_dependents first)
  // made the step slower (s62a, H100 GPU-6f7c99e0: B1 58.5 -> 64.7 µs in a graph, 128K 82.1 -> 88.3; attention.md).
  auto go = [&](auto kernel, int smem, int threads = kThreads) { kernel<<<grid, threads, smem, stream>>>(p, map); };
  // Many rows a key: 64-row CTAs. attend_rows_bf16.cu takes TMA tiles only (attend_rows_bf16_applies);
  // attend_rows.cu TMA tiles or, for other pages, rows gathered by cp.async (16-byte aligned rows,
  // chunks rounded to whole tiles as with TMA: the step's partials or one split).
  if (p.many_rows && !p.q_fp8 && p.cache_fp8) {  // (attend_rows_q_split: TMA boxes)
    MLA_REQUIRE(tma, "attend: a bf16 query over an fp8 cache takes the many-rows kernel over TMA boxes only");
    launch_attend_rows_q_split(p, map, stream);
    return AttendKernel::kRowsQSplit;
  }
  if (p.many_rows && !p.q_fp8) {
    launch_attend_rows_bf16(p, map, stream);
    return AttendKernel::kRowsBf16;
  }
  if (p.many_rows && (tma || attend_rows_gathers(p))) {
    launch_attend_rows(p, map, tma, stream);
    return AttendKernel::kRows;
  }
  if (!p.cache_fp8) {  // a bf16 query and cache at 16 rows or fewer (attend_wgmma_bf16_cache)
    MLA_REQUIRE(tma && !p.q_fp8, "attend: a bf16 cache takes the 16-row kernel with a bf16 query over TMA boxes only");
    launch_attend_wgmma_bf16(p, map, stream);
    return AttendKernel::kWgmmaBf16;
  }
  if (!p.q_fp8) {  // a bf16 query over an fp8 cache, split into two e4m3 rows (attend_wgmma_q_split)
    MLA_REQUIRE(p.cache_fp8 && (tma || attend_wgmma_row_copies(p)),
                "attend: a bf16 query takes the 16-row kernel over TMA boxes or row copies of an fp8 cache only");
    launch_attend_wgmma_q_split(p, map, tma, stream);
    return AttendKernel::kWgmmaQSplit;
  }
  MLA_REQUIRE(p.q_fp8 && p.cache_fp8, "attend: the 16-row wgmma kernel takes an fp8 query and cache");
  if (tma && timeline_path()) {  // measurement: the default TMA kernel (2-step groups) with phase stamps
    launch_timeline(p, grid, map, fixed_only, stream);
  } else if (tma) {
    AttendParams q = p;
    const bool fast_divs = qk_group_steps() == 2 && with_fast_divs(q, grid);
    if (fast_divs && fixed_only)
      launch_attend_wgmma_fixed(q, map, grid, attend_wgmma_skews(q, grid.x), stream);  // (s73a: attend_wgmma_fixed.cu)
    else if (fast_divs && attend_wgmma_skews(q, grid.x))
      launch_attend_wgmma_skew(q, map, grid, stream);  // (skewed splits: attend_wgmma_skew.cu)
    else if (fast_divs)
      attend_wgmma_kernel<2, 2, Tiles::kBoxes, false, true>
          <<<grid, kThreads, smem_bytes<2, Tiles::kBoxes>(), stream>>>(q, map);
    else if (qk_group_steps() == 2) go(attend_wgmma_kernel<2, 2, Tiles::kBoxes>, smem_bytes<2, Tiles::kBoxes>());
    else go(attend_wgmma_kernel<2, 1, Tiles::kBoxes>, smem_bytes<2, Tiles::kBoxes>());
  } else if (attend_wgmma_row_copies(p)) {
    // (a producer warpgroup beside the consumer: v26)
    if (qk_group_steps() == 2 && fixed_only)
      launch_attend_wgmma_fixed_rows(p, map, grid, stream);  // (s73a: attend_wgmma_fixed.cu)
    else if (qk_group_steps() == 2)
      go(attend_wgmma_kernel<2, 3, Tiles::kRows>, smem_bytes<2, Tiles::kRows>(), 2 * kThreads);
    else go(attend_wgmma_kernel<2, 1, Tiles::kRows>, smem_bytes<2, Tiles::kRows>(), 2 * kThreads);
  } else {
    if (qk_group_steps() == 2) go(attend_wgmma_kernel<2, 2, Tiles::kCopies>, smem_bytes<2, Tiles::kCopies>());
    else go(attend_wgmma_kernel<2, 1, Tiles::kCopies>, smem_bytes<2, Tiles::kCopies>());
  }
  MLA_CUDA_CHECK_LAUNCH();
  return AttendKernel::kWgmma;
}

}  // namespace mla::cuda
