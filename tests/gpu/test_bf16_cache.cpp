// A bf16 query and cache in whole steps against the CPU backend at the heights the planner leaves to
// the 16-row kernel (12 and 16 heads at qlen 1, 8 heads at qlen 2, 4 heads): under
// MLA_ATTEND_BF16_16ROW=1 the 16-row wgmma kernel's bf16 instance (attend_wgmma_bf16.cu: HGMMA, V read
// MN-major from the TMA slabs, the rows of keys not loaded zeroed before p.v), without it the
// mma.sync kernel, which these cases then check. Pages 64, 16, 32 and 1 (one-row boxes of nine
// slabs), fixed splits and the flat plan, NaN in unused pages and page tails, poisoned outputs.
// (scripts/device-check bf16-16row runs the GPU tests under the switch.) Without a GPU every test skips.
#include <gtest/gtest.h>

#include <optional>

#include "cuda/stages.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/mla.hpp"

namespace mla {
namespace {

TEST(Bf16Cache, SixteenRowStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the bf16-cache steps");
  const testing::FamilyOf family = [](const testing::Shape&) -> std::optional<cuda::AttendKernel> {
    if (testing::attend_rerouted()) return std::nullopt;
    return cuda::attend_bf16_16row_enabled() ? cuda::AttendKernel::kWgmmaBf16 : cuda::AttendKernel::kMma;
  };
  testing::steps_match_cpu({{"kimi-k3", 12, 1, 8, 64, 900, true},       // the flat plan
                            {"kimi-k3", 16, 1, 6, 16, 700, false},      // fixed splits, 4 boxes a tile
                            {"deepseek-v3", 8, 2, 5, 64, 600, true},    // 16 rows, causal inside the tile
                            {"kimi-k2", 4, 1, 3, 32, 500, false},       // a part-empty row tile, page 32
                            {"kimi-k3", 12, 1, 4, 1, 400, true}},       // page 1: a box a key row
                           DType::bf16, DType::bf16, 1500, testing::RowsKernel::kSixteen, {.family = family});
}

}  // namespace
}  // namespace mla
