// The 16-row kernel's fixed splits skewed toward the CTAs placed first (s33a, skew_plan.hpp): whole
// steps against the CPU backend at even batches whose grid holds one to two CTAs an SM, with even
// split counts (2, 4, 6, and ~sms / 2 at B = 1), one and two row tiles, qlen 2, pages 64, 32 and
// 16, lengths within an eighth of each other (fixed splits, not the flat plan), NaN in unused
// pages and page tails, poisoned outputs. By default the shapes of two or more requests take the
// skewed instance (asserted by its launch count), under MLA_ATTEND_SKEW=1 the B = 1 one too, under
// =0 none (the unskewed instance, checked the same way). By default (s73a; not under MLA_ATTEND_FIXED_ONLY=0)
// every shape's steps take attend_wgmma_fixed.cu's instances without the flat plan's code (their launch count).
// Without a GPU they skip.
#include <gtest/gtest.h>

#include "cuda/skew_plan.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/mla.hpp"

namespace mla {
namespace {

TEST(Skew, EvenBatchStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the skewed-split steps");
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  // (shape, forced splits); batches from the SM count so that B x splits x row tiles lies in
  // (sms, 2 sms] on any GPU (the planner sends 17+ rows a request to the many-rows kernel from B = 2).
  const std::vector<std::pair<testing::Shape, int>> shapes = {
      {{"kimi-k3", 12, 1, sms / 2, 64, 4096, false}, 4},         // B64's form: pairs of 16 + 16 tiles
      {{"kimi-k3", 16, 1, sms / 2 + 2, 16, 2048, false}, 2},     // C's form at page 16: 4 boxes a tile
      {{"deepseek-v3", 8, 2, sms / 3, 64, 6000, false}, 6},      // qlen 2 (16 rows), three pairs, the last short
      {{"kimi-k2", 4, 1, sms - 32, 32, 3000, false}, 2},         // a part-empty row tile, page 32
      {{"kimi-k3", 12, 2, 1, 64, 70000, false}, sms / 4 * 2 + 2}};  // B = 1, two row tiles a pair
  for (const auto& [shape, splits] : shapes) {
    const int m_tiles = (shape.heads * shape.qlen + 15) / 16;
    const int64_t ctas = int64_t(shape.batch) * splits * m_tiles;
    ASSERT_TRUE(cuda::skew::applies(splits, ctas, sms)) << ctas << " CTAs on " << sms << " SMs";
    cuda::AttendParams p{};  // what CudaBackend::attend sets under the switch, at fixed splits
    p.splits = splits;
    const bool wanted = cuda::attend_skew_wanted(shape.batch);
    p.skew_sms = wanted ? sms : 0;
    EXPECT_EQ(cuda::attend_wgmma_skews(p, ctas), wanted);
    const int64_t launched = cuda::attend_skew_launches(), fixed_launched = cuda::attend_fixed_launches();
    testing::steps_match_cpu({shape}, DType::fp8_e4m3, DType::fp8_e4m3, 3300 + uint64_t(splits),
                             testing::RowsKernel::kSixteen, {.num_splits = splits, .spread = 8});
    // Each shape's steps took the skewed instance under the switch (and never without it).
    if (wanted) EXPECT_GT(cuda::attend_skew_launches(), launched);
    else EXPECT_EQ(cuda::attend_skew_launches(), launched);
    if (cuda::attend_fixed_only_enabled()) EXPECT_GT(cuda::attend_fixed_launches(), fixed_launched);
    else EXPECT_EQ(cuda::attend_fixed_launches(), fixed_launched);
  }
}

// s73a (the default; MLA_ATTEND_FIXED_ONLY=0: off): fixed-split steps off the skewed instance take
// attend_wgmma_fixed.cu's instances without the flat plan's code too: the plain FastDivs one (B = 1; odd split
// counts) and the bulk row copies' one (page 1). Asserted by their launch count where it is on, none under =0.
TEST(FixedOnly, PlainAndRowCopyStepsMatchCpu) {
  MLA_SKIP_WITHOUT_GPU("the fixed-split instances");
  const std::vector<std::pair<testing::Shape, int>> shapes = {
      {{"kimi-k3", 12, 1, 1, 64, 20000, false}, 8},    // B = 1 (unskewed by default), page 64
      {{"deepseek-v3", 8, 2, 6, 16, 5000, false}, 3},  // odd splits (never skewed), qlen 2, page 16
      {{"kimi-k3", 12, 1, 8, 1, 3000, false}, 2}};     // page 1: the bulk row copies
  for (const auto& [shape, splits] : shapes) {
    const int64_t launched = cuda::attend_fixed_launches();
    testing::steps_match_cpu({shape}, DType::fp8_e4m3, DType::fp8_e4m3, 3400 + uint64_t(splits),
                             testing::RowsKernel::kSixteen, {.num_splits = splits, .spread = 8, .flat = false});
    if (cuda::attend_fixed_only_enabled()) EXPECT_GT(cuda::attend_fixed_launches(), launched);
    else EXPECT_EQ(cuda::attend_fixed_launches(), launched);
  }
}

}  // namespace
}  // namespace mla
