// A bf16 query over an fp8 cache in whole steps against the CPU backend, at shapes the planner gives
// the 16-row kernel (12 and 16 heads, 8 x qlen 2, 24 rows at B = 1) and at many-rows ones (48, 96
// and 128 rows a request, which no many-rows kernel takes for this pair): under MLA_ATTEND_Q_SPLIT=1 the
// 16-row wgmma kernel with each query row split into two e4m3 rows (core/query_split.hpp,
// attend_wgmma_q_split.cu) on TMA boxes (pages of 8+ rows, a power of two) or bulk row copies (pages
// 1 and 3 here); without the switch the mma.sync kernel, which these cases then check. Fixed splits and the flat plan, NaN in
// unused pages, poisoned outputs. (scripts/device-check q-split runs the GPU tests under the switch,
// with MLA_ATTEND_KERNEL=wgmma too, where attend()'s LSE meets SPEC's 1e-3 through the split.)
// Without a GPU every test skips.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/stages.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/mla.hpp"

namespace mla {
namespace {

using testing::Shape;

TEST(QuerySplit, Bf16QueryFp8CacheStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the bf16-query steps");
  testing::steps_match_cpu({{"kimi-k3", 12, 1, 8, 64, 900, true},        // the flat plan
                            {"kimi-k3", 16, 1, 6, 16, 700, false},       // fixed splits, 4 boxes a tile
                            {"deepseek-v3", 8, 2, 5, 64, 600, true},     // 16 rows, causal inside the tile
                            {"kimi-k3", 12, 2, 1, 64, 3000, false},      // 24 rows at B = 1: two row tiles
                            {"kimi-k2", 4, 1, 3, 32, 500, false},        // a part-empty row tile, page 32
                            {"kimi-k3", 12, 1, 4, 1, 500, true},         // page 1: bulk row copies, the flat plan
                            {"deepseek-v3", 16, 1, 5, 3, 400, false}},   // page 3: row copies, fixed splits
                           DType::fp8_e4m3, DType::bf16, 1300, testing::RowsKernel::kSixteen);
}

// Shapes the planner gives many rows: a bf16 query over an fp8 cache has no many-rows kernel, so the
// 16-row kernel's split takes them under the switch (3 and 8 row tiles a request), else mma.sync.
TEST(QuerySplit, Bf16QueryFp8CacheManyRowsStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the bf16-query steps");
  testing::steps_match_cpu({{"kimi-k3", 12, 4, 40, 64, 600, false},      // 48 rows, fixed splits
                            {"deepseek-v3", 128, 1, 24, 16, 400, true},  // 128 heads, the flat plan
                            {"kimi-k3", 12, 8, 32, 64, 500, true}},      // 96 rows, causal inside the tiles
                           DType::fp8_e4m3, DType::bf16, 1400, testing::RowsKernel::kMany);
}

}  // namespace
}  // namespace mla
