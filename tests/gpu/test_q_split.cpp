// A bf16 query over an fp8 cache in whole steps against the CPU backend, at shapes the planner gives
// the 16-row kernel (12 and 16 heads, 8 x qlen 2, 24 rows at B = 1): under MLA_ATTEND_Q_SPLIT=1 the
// 16-row wgmma kernel with each query row split into two e4m3 rows (core/query_split.hpp,
// attend_wgmma_q_split.cu) where TMA boxes the pages (8+ rows, a power of two), else and without the
// switch the mma.sync kernel, which these cases then check. Fixed splits and the flat plan, NaN in
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
                            {"kimi-k3", 12, 1, 4, 1, 500, true}},        // page 1: the mma.sync kernel
                           DType::fp8_e4m3, DType::bf16, 1300, testing::RowsKernel::kSixteen);
}

}  // namespace
}  // namespace mla
