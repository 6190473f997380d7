// Which attend kernel a step takes, and how its tiles come (the predicates stages.hpp declares):
// the mma.sync kernel (attend.cu), the 16-row wgmma kernel (attend_wgmma.cu) on TMA boxes, bulk row
// copies or cp.async tiles, the many-rows kernels (attend_rows*.cu). Host code only; the measured
// reasons behind each rule are in docs/attention.md. tests/gpu/test_attend_routing.cpp checks them.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "cuda/check.hpp"
#include "cuda/skew_plan.hpp"
#include "cuda/stages.hpp"

namespace mla::cuda {

int env_choice(const char* name, std::initializer_list<std::pair<std::string_view, int>> choices, int fallback) {
  const char* env = std::getenv(name);
  if (env)
    for (const auto& [text, value] : choices)
      if (text == env) return value;
  return fallback;
}

int attend_kernel_mode() {
  static const int mode = env_choice("MLA_ATTEND_KERNEL", {{"mma", 0}, {"wgmma", 2}}, 1);
  return mode;
}

bool attend_o_pairs_aligned(const AttendParams& p) {
  const int64_t elem = p.o_bf16 ? 2 : 4;
  return (reinterpret_cast<uintptr_t>(p.o) % (2 * elem)) == 0 && p.o_split_stride % 2 == 0 && p.o_s_stride % 2 == 0 &&
         p.o_h_stride % 2 == 0;
}

bool attend_q_split_enabled() {
  static const bool on = env_choice("MLA_ATTEND_Q_SPLIT", {{"0", 0}, {"1", 1}}, 1) == 1;
  return on;
}

bool attend_wgmma_q_split(const AttendParams& p) {
  return attend_q_split_enabled() && !p.q_fp8 && p.cache_fp8 && !p.many_rows &&
         (attend_wgmma_uses_tma(p) || attend_wgmma_row_copies(p));
}

bool attend_rows_q_split_enabled() {
  static const bool on = attend_q_split_enabled() && env_choice("MLA_ROWS_Q_SPLIT", {{"0", 0}, {"1", 1}}, 1) == 1;
  return on;
}

bool attend_rows_q_split(const AttendParams& p) {
  return attend_rows_q_split_enabled() && !p.q_fp8 && p.cache_fp8 && p.many_rows && attend_wgmma_uses_tma(p);
}

// 16-row CTAs two an SM (attend_wgmma.cu), or where attend_rows_wanted says so (17+ query rows a
// request and a batch that fills a quarter wave by itself, or up to 48 rows from B = 2), 64-row CTAs
// one an SM (launched as 48 or 32 rows where as many of those hold a request: attend_rows.cu, or
// attend_rows_bf16.cu with a bf16 query and cache). Those also need TMA tiles (or gathered ones),
// which the plan cannot see: with bf16 pages not a power of two, the mma.sync kernel runs the plan
// made for 64-row CTAs, as it does for a bf16 query over an fp8 cache under MLA_ATTEND_Q_SPLIT=0. By
// default (since session 37) the many-rows kernel's split takes that pair where attend_rows_wanted
// says so and TMA boxes the pages (rows_boxes), planned as 32-row CTAs one an SM
// (attend_rows_q_split.cu), and the 16-row kernel's split (s32a) the rest with the 16-row plan (the
// many-rows plan put 48 rows at B = 40 in 360 16-row CTAs on 264 slots: review of session 33);
// MLA_ROWS_Q_SPLIT=0: the 16-row split at every height. The 16-row kernel's bf16-cache instance
// (MLA_ATTEND_BF16_16ROW, s32b) fits one CTA an SM (171 KB).
AttendShape attend_plan_shape(int batch, int rows, bool q_bf16, bool cache_fp8, int sms, bool rows_boxes) {
  const bool q_split = q_bf16 && cache_fp8 && attend_q_split_enabled();  // (the 16-row kernel's, unless:)
  const bool rows_split = q_split && attend_rows_q_split_enabled() && rows_boxes;
  if ((!q_split || rows_split) && attend_rows_wanted(batch, rows, sms)) {
    const int rows_cta = rows_split ? kAttendRowsQSplitCta : kAttendRowsPerCta;
    return {(rows + rows_cta - 1) / rows_cta, sms, true};
  }
  const bool bf16_16row = q_bf16 && !cache_fp8 && attend_bf16_16row_enabled();
  return {(rows + 15) / 16, bf16_16row ? sms : 2 * sms, false};
}

namespace {
// The many-rows kernel's share in attend_fixed_fills_its_waves: 850 per mille; MLA_ROWS_FILL=full (s58a, session 55;
// a measurement since): 1000, so only fixed splits that fill their waves wholly stay fixed. D, E, F, G and 96 heads
// fill 128 of 132 slots (their waves 97%): their 4 idle SMs' share of the keys is 3% of each CTA's time, which the
// flat plan's whole wave of key-CTAs (attend_flat_key_ctas: 66 at D, each ~124 of a request's 128 tiles) spreads over
// every SM. Measured 3.6-18% slower (H100, session 55: F 121.2 -> 142.6 µs, D 233.4 -> 255.6): a segment switch
// costs 11-29 µs, more than the idle SMs' share (docs/attention-log.md's earlier queue, item 3 (q)); so it measures that switch at
// equal work.
int attend_rows_fill_per_mille() {
  static const int v = env_choice("MLA_ROWS_FILL", {{"850", 850}, {"full", 1000}}, 850);
  return v;
}
}  // namespace

bool attend_fixed_fills_its_waves(int64_t fixed_ctas, int slots, bool many_rows, int min_fill_per_mille) {
  const int64_t waves = (fixed_ctas + slots - 1) / slots;
  if (many_rows) return fixed_ctas * 1000 >= waves * slots * attend_rows_fill_per_mille();
  return min_fill_per_mille > 0 ? fixed_ctas * 1000 >= waves * slots * min_fill_per_mille
                                : fixed_ctas * 3 >= waves * slots * 2;
}

int attend_fill_per_mille(double peak_gbps, int sms) {
  constexpr double kCtaGbps = 16, kMargin = 1.25, kCopyShare = 0.87;
  const double share = kCopyShare * peak_gbps / (2.0 * std::max(sms, 1) * kCtaGbps * kMargin);
  return share <= 2.0 / 3 ? 0 : int(std::lround(1000 * std::min(share, 0.85)));  // (0: the exact 2/3 rule)
}

double device_peak_gbps(int device) {
  int mem_khz = 0, bus_bits = 0;
  MLA_CUDA_CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device));
  MLA_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  return 2.0 * mem_khz * 1e3 * bus_bits / 8 / 1e9;
}

bool attend_fill_from_bandwidth() {
  static const int mode = env_choice("MLA_ATTEND_FILL_BW", {{"0", 0}, {"1", 1}}, 1);
  return mode == 1;
}

int attend_flat_key_ctas(int batch, int m_tiles, int slots, bool whole_waves) {
  const int per_wave = std::max(1, slots / m_tiles);
  const int64_t ctas = whole_waves ? (int64_t(batch) + per_wave - 1) / per_wave * per_wave : std::max(batch, per_wave);
  return int(std::min<int64_t>(kMaxPostPartials - 1, ctas));
}

bool attend_skew_enabled() { return attend_skew_wanted(2); }

bool attend_skew_wanted(int batch) {
  static const int mode = env_choice("MLA_ATTEND_SKEW", {{"0", 0}, {"1", 1}}, -1);
  return mode == 1 || (mode < 0 && batch > 1);
}

bool attend_wgmma_skews(const AttendParams& p, int64_t ctas) {
  return p.skew_sms > 0 && p.flat_ctas == 0 && skew::applies(p.splits, ctas, p.skew_sms);
}

bool attend_bf16_16row_enabled() {
  static const bool on = env_choice("MLA_ATTEND_BF16_16ROW", {{"0", 0}, {"1", 1}}, 1) == 1;
  return on;
}

bool attend_wgmma_bf16_cache(const AttendParams& p) {
  return attend_bf16_16row_enabled() && !p.q_fp8 && !p.cache_fp8 && !p.many_rows && attend_wgmma_uses_tma(p);
}

bool attend_wgmma_applies(const AttendParams& p) {
  // The default for the step's partials: with its copies through L1 it beats the mma.sync kernel on
  // every shape measured (H200, docs/attention.md v8d).
  const int mode = attend_kernel_mode();
  const bool operands =
      p.cache_fp8 ? p.q_fp8 || attend_wgmma_q_split(p) || attend_rows_q_split(p) : attend_wgmma_bf16_cache(p);
  return mode > 0 && (p.step_partials || mode == 2) && operands && !p.exact_p && attend_o_pairs_aligned(p);
}

namespace {
// MLA_ATTEND_TMA (comparisons): 0 cp.async tiles everywhere (no TMA boxes, no bulk row copies);
// rows: the 16-row kernel's fp8 tiles by bulk row copies on every page size, boxes or not.
int tma_mode() {
  static const int mode = env_choice("MLA_ATTEND_TMA", {{"0", 0}, {"rows", 2}}, 1);
  return mode;
}
bool tma_allowed() { return tma_mode() > 0; }
bool rows_forced(const AttendParams& p) { return tma_mode() == 2 && p.cache_fp8 && !p.many_rows; }
// Key rows any kernel can copy 16 bytes at a time (bulk row copies, cp.async gathers): the cache,
// its rows and its pages 16-byte aligned, and partials that may be chunked by whole tiles (the
// step's own, merged by post, or a single split).
bool rows_copyable(const AttendParams& p) {
  return reinterpret_cast<uintptr_t>(p.cache) % 16 == 0 && p.row_stride % 16 == 0 && p.page_stride % 16 == 0 &&
         (p.step_partials || p.splits == 1);
}
}  // namespace

bool attend_wgmma_uses_tma(const AttendParams& p) {
  const bool allowed = tma_allowed() && !rows_forced(p);
  // A box is box_rows = min(page, 64) rows of one page, at row box_rows * i of its 1024-byte aligned
  // slab: pages of a power of two rows (v20: 1, 2 and 4 for a bf16 cache only, whose kernel takes
  // TMA tiles only; TMA swizzles a box that starts inside an 8-row atom by its shared address as it
  // does whole atoms. An fp8 cache gathers such pages: five boxes a key row cost more than its 36
  // cp.async chunks, H200 v20: B64 page 1 158.5 vs 121.2 µs; uneven 128-head batches 863.1 vs
  // 744.8 under the flat plan, session 10), rows of a
  // page contiguous (the cache is one [rows, 576] matrix), and what any 16-byte copy needs
  // (rows_copyable: 16-byte aligned rows, partials chunked by whole tiles: only the step's own,
  // merged by post, or a single split).
  // The fp8 many-rows kernel boxes pages of 1-4 rows too, issued by its producer warpgroup
  // (session 24; session 10's one-row boxes were issued by the consumers); MLA_ROWS_SMALL_BOXES=0
  // gathers them by the consumers' cp.async as before (A/B).
  static const bool small_boxes = env_choice("MLA_ROWS_SMALL_BOXES", {{"0", 0}}, 1) == 1;
  const bool boxes_small = !p.cache_fp8 || (small_boxes && p.many_rows && (p.q_fp8 || attend_rows_q_split_enabled()));
  const bool pow2_page = p.page_size >= (boxes_small ? 1 : kFp8SmallPage) && (p.page_size & (p.page_size - 1)) == 0;
  return allowed && pow2_page && p.page_stride == int64_t(p.page_size) * p.row_stride &&
         p.num_pages * p.page_size <= INT32_MAX && rows_copyable(p);
}

bool attend_rows_q_split_boxes(const void* cache, bool cache_fp8, int64_t page_stride, int64_t row_stride,
                             int page_size, int64_t num_pages) {
  AttendParams p{};
  p.cache = cache, p.cache_fp8 = cache_fp8, p.page_stride = page_stride, p.row_stride = row_stride;
  p.page_size = page_size, p.num_pages = num_pages;
  p.many_rows = true, p.step_partials = true;  // a step's many-rows launch of a bf16 query (q_fp8 false)
  return attend_wgmma_uses_tma(p);
}

bool attend_wgmma_row_copies(const AttendParams& p) {
  // The pages TMA does not box, in the 16-row kernel: a bulk copy a key row (v24), whatever the page
  // size and page stride, for 16-byte aligned fp8 rows and, as with boxes, partials chunked by whole
  // tiles (the step's own, or one split).
  return tma_allowed() && p.cache_fp8 && !p.many_rows && !attend_wgmma_uses_tma(p) && rows_copyable(p);
}

bool attend_rows_gathers(const AttendParams& p) { return !attend_wgmma_uses_tma(p) && rows_copyable(p); }

}  // namespace mla::cuda
