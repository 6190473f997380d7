// Where the planner sends a step's attend to the many-rows kernel (src/cuda/attend_rows.cu,
// attend_rows_wanted): 17+ query rows a request, and a batch whose 64-row CTAs fill a quarter of
// a wave by themselves (at B = 1 x 128 heads the kernel was 2x slower than the 16-row one on the
// H200: its many splits each write 128 KB of partials), or up to 48 rows from B = 2. Host arithmetic, no GPU needed; the
// kernels themselves are checked against the CPU backend by the GPU tests (scripts/device-check
// runs them once with MLA_ATTEND_ROWS_MIN=1, the many-rows kernel on every case).
#include <gtest/gtest.h>

#include <cstdlib>

#include "cuda/stages.hpp"

namespace mla {
namespace {

TEST(RowsRule, ManyRowsWhereTheBatchFillsAQuarterWave) {
  if (std::getenv("MLA_ATTEND_ROWS_MIN")) GTEST_SKIP() << "MLA_ATTEND_ROWS_MIN is set: the rule is overridden";
  constexpr int kSms = 132;  // H200
  ASSERT_EQ(cuda::attend_rows_min(), cuda::kAttendRowsMinDefault);
  // 128 heads (2 row tiles of 64): from B = 17 (17 x 2 x 4 >= 132).
  EXPECT_TRUE(cuda::attend_rows_wanted(64, 128, kSms));
  EXPECT_TRUE(cuda::attend_rows_wanted(17, 128, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(16, 128, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(1, 128, kSms));
  // 12 heads x qlen 8 = 96 rows (two row tiles): from B = 17; 64 rows (one): from B = 33.
  EXPECT_TRUE(cuda::attend_rows_wanted(32, 96, kSms));
  EXPECT_TRUE(cuda::attend_rows_wanted(17, 96, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(16, 96, kSms));
  EXPECT_TRUE(cuda::attend_rows_wanted(33, 64, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(32, 64, kSms));
  // Up to 48 rows (one 32- or 48-row CTA): from B = 2 (12 heads x qlen 2 or 4, 32 heads).
  EXPECT_TRUE(cuda::attend_rows_wanted(64, 48, kSms));
  EXPECT_TRUE(cuda::attend_rows_wanted(4, 48, kSms));
  EXPECT_TRUE(cuda::attend_rows_wanted(3, 24, kSms));
  EXPECT_TRUE(cuda::attend_rows_wanted(2, 48, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(1, 24, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(1, 32, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(1, 48, kSms));
  // Under the row threshold (one 16-row CTA holds them): never (12 and 16 heads at qlen 1).
  EXPECT_FALSE(cuda::attend_rows_wanted(1024, 12, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(1024, 16, kSms));
  EXPECT_TRUE(cuda::attend_rows_wanted(1024, 36, kSms));
  EXPECT_FALSE(cuda::attend_rows_wanted(1024, cuda::kAttendRowsMinDefault - 1, kSms));
  EXPECT_TRUE(cuda::attend_rows_wanted(1024, cuda::kAttendRowsMinDefault, kSms));
}

// The launch's CTA height: the shortest of 32, 48 and 64 rows that needs no more CTAs a request than
// 64-row ones (the planner's count), so 16 heads x qlen 2, 12 x qlen 4 or 8 and 96 heads pad no MMA
// with absent rows.
TEST(RowsRule, ShortestCtasThatAreNoMore) {
  if (std::getenv("MLA_ATTEND_ROWS_CTA")) GTEST_SKIP() << "MLA_ATTEND_ROWS_CTA is set: the rule is overridden";
  EXPECT_EQ(cuda::attend_rows_cta_rows(12), 32);   // forced (MLA_ATTEND_ROWS_MIN=1): one CTA either way
  EXPECT_EQ(cuda::attend_rows_cta_rows(24), 32);   // 12 heads x qlen 2
  EXPECT_EQ(cuda::attend_rows_cta_rows(32), 32);   // 16 heads x qlen 2, 32 heads
  EXPECT_EQ(cuda::attend_rows_cta_rows(33), 48);
  EXPECT_EQ(cuda::attend_rows_cta_rows(48), 48);   // 12 heads x qlen 4
  EXPECT_EQ(cuda::attend_rows_cta_rows(49), 64);   // 2 CTAs of 48 vs 1 of 64
  EXPECT_EQ(cuda::attend_rows_cta_rows(64), 64);
  EXPECT_EQ(cuda::attend_rows_cta_rows(72), 48);   // 24 heads x qlen 3
  EXPECT_EQ(cuda::attend_rows_cta_rows(96), 48);   // 12 heads x qlen 8, 96 heads
  EXPECT_EQ(cuda::attend_rows_cta_rows(97), 64);
  EXPECT_EQ(cuda::attend_rows_cta_rows(128), 64);  // 128 heads
  EXPECT_EQ(cuda::attend_rows_cta_rows(144), 48);
}

// The plan's CTA shape (attend_plan_shape: the CTAs of one request and split, the slots of a wave,
// many rows or not) for each operand pair, under the switches that change it as they are set for
// this process (ctest runs this test under each: tests/CMakeLists.txt).
TEST(RowsRule, PlanShapeOfEachKernel) {
  if (std::getenv("MLA_ATTEND_ROWS_MIN")) GTEST_SKIP() << "MLA_ATTEND_ROWS_MIN is set: the rule is overridden";
  constexpr int kSms = 132;  // H200
  auto expect = [](const cuda::AttendShape& got, int m_tiles, int slots, bool many_rows, const char* what) {
    EXPECT_EQ(got.m_tiles, m_tiles) << what;
    EXPECT_EQ(got.slots, slots) << what;
    EXPECT_EQ(got.many_rows, many_rows) << what;
  };
  // fp8 query and cache: 16-row CTAs two an SM, or 64-row ones one an SM where the rule says so.
  expect(cuda::attend_plan_shape(64, 12, false, true, kSms), 1, 2 * kSms, false, "fp8, 12 heads");
  expect(cuda::attend_plan_shape(1, 128, false, true, kSms), 8, 2 * kSms, false, "fp8, 128 heads at B = 1");
  expect(cuda::attend_plan_shape(64, 128, false, true, kSms), 2, kSms, true, "fp8, 128 heads");
  expect(cuda::attend_plan_shape(64, 48, false, true, kSms), 1, kSms, true, "fp8, 12 heads x qlen 4");
  // A bf16 query and cache: the same heights; 12-16 heads on the 16-row bf16 instance (one CTA an
  // SM) unless MLA_ATTEND_BF16_16ROW=0.
  const int bf16_slots = cuda::attend_bf16_16row_enabled() ? kSms : 2 * kSms;
  expect(cuda::attend_plan_shape(64, 12, true, false, kSms), 1, bf16_slots, false, "bf16, 12 heads");
  expect(cuda::attend_plan_shape(64, 128, true, false, kSms), 2, kSms, true, "bf16, 128 heads");
  // A bf16 query over an fp8 cache: by default the many-rows split's 32-row CTAs where the rule asks
  // for many rows and TMA boxes the pages (else the 16-row split's plan); under MLA_ROWS_Q_SPLIT=0 the
  // 16-row split at every height; under MLA_ATTEND_Q_SPLIT=0 the mma.sync kernel under the 64-row plan.
  expect(cuda::attend_plan_shape(64, 12, true, true, kSms), 1, 2 * kSms, false, "bf16 query, 12 heads");
  if (!cuda::attend_q_split_enabled()) {
    expect(cuda::attend_plan_shape(64, 128, true, true, kSms), 2, kSms, true, "bf16 query, 128 heads, mma.sync");
  } else if (cuda::attend_rows_q_split_enabled()) {
    expect(cuda::attend_plan_shape(64, 128, true, true, kSms), 4, kSms, true, "bf16 query, 128 heads, rows split");
    expect(cuda::attend_plan_shape(64, 48, true, true, kSms), 2, kSms, true, "bf16 query, 48 rows, rows split");
    expect(cuda::attend_plan_shape(1, 128, true, true, kSms), 8, 2 * kSms, false, "bf16 query, 128 heads at B = 1");
    expect(cuda::attend_plan_shape(64, 128, true, true, kSms, false), 8, 2 * kSms, false,
           "bf16 query, 128 heads, pages not boxed: the 16-row split");
  } else {
    expect(cuda::attend_plan_shape(64, 128, true, true, kSms), 8, 2 * kSms, false, "bf16 query, 128 heads, 16-row split");
    expect(cuda::attend_plan_shape(64, 48, true, true, kSms), 3, 2 * kSms, false, "bf16 query, 48 rows, 16-row split");
  }
  // Whether the pages box does not change any other pair's plan.
  expect(cuda::attend_plan_shape(64, 128, false, true, kSms, false), 2, kSms, true, "fp8, 128 heads, pages not boxed");
  expect(cuda::attend_plan_shape(64, 128, true, false, kSms, false), 2, kSms, true, "bf16, 128 heads, pages not boxed");
}

// The planner's view of a cache's pages (attend_rows_q_split_boxes, from the cache alone) for the
// many-rows split of a bf16 query: boxed where TMA takes them (a power-of-two page of contiguous,
// 16-byte aligned rows; pages of 1-4 rows unless MLA_ROWS_Q_SPLIT=0, the boxes the split's
// instances take), not otherwise.
alignas(16) uint8_t some_cache[16];
constexpr int64_t kRowBytes = 576;
bool boxes(int page, int64_t page_stride, int64_t row_stride = kRowBytes, const void* base = some_cache) {
  return cuda::attend_rows_q_split_boxes(base, true, page_stride, row_stride, page, 1000);
}

TEST(RowsRule, PlannerSeesWhetherThePagesBox) {
  if (std::getenv("MLA_ATTEND_TMA") || std::getenv("MLA_ROWS_SMALL_BOXES")) GTEST_SKIP() << "a TMA switch is set";
  constexpr int64_t row = kRowBytes;
  const uint8_t* cache = some_cache;
  EXPECT_TRUE(boxes(64, 64 * row));
  EXPECT_TRUE(boxes(16, 16 * row));
  EXPECT_FALSE(boxes(3, 3 * row)) << "page 3";
  EXPECT_FALSE(boxes(48, 48 * row)) << "page 48";
  EXPECT_FALSE(boxes(64, 65 * row)) << "pages not contiguous";
  EXPECT_FALSE(boxes(64, 64 * 584, 584)) << "rows not 16-byte aligned";
  EXPECT_FALSE(boxes(64, 64 * row, row, cache + 8)) << "cache not 16-byte aligned";
  const bool small = cuda::attend_rows_q_split_enabled();
  EXPECT_EQ(boxes(1, row), small) << "page 1";
  EXPECT_EQ(boxes(4, 4 * row), small) << "page 4";
}

}  // namespace
}  // namespace mla
