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

}  // namespace
}  // namespace mla
