// The many-rows attend kernels inside whole steps against the CPU backend, at shapes where the
// planner picks 64-row CTAs by its own rule (17+ query rows a request, a batch that fills a quarter
// wave), so these cases reach them without MLA_ATTEND_ROWS_MIN: the bf16 kernel
// (src/cuda/attend_rows_bf16.cu, a bf16 query and cache, TMA pages, boxes of 1-2 rows included),
// the fp8 kernel (src/cuda/attend_rows.cu) on pages of 1-4 rows (one TMA box a key row since
// session 24, the 32- and 64-row CTAs' page-1 form included; MLA_ROWS_SMALL_BOXES=0: gathered
// tiles; fixed splits for even batches, the flat plan for uneven ones) and on pages TMA cannot box
// (3, 6, 12, 48 rows: gathered tiles). Head counts that leave
// the second row tile part-empty, qlen 1-8, even batches (fixed splits) and uneven ones with empty
// and short requests (the flat plan where TMA allows), NaN in unused pages and page tails, poisoned
// outputs. (scripts/device-check also runs every random case with MLA_ATTEND_ROWS_MIN=1.) Without
// a GPU every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/synthetic.hpp"
#include "cuda/device_errors.hpp"
#include "cuda/stages.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/mla.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

using testing::expect_close;

using testing::Shape;

// Each shape's whole step on both backends, kv and query in `dtype`, at shapes the planner gives the
// many-rows kernel (unless MLA_ATTEND_ROWS_MIN forces it everywhere), which each step must launch
// (attend_rows_bf16.cu's or attend_rows.cu's, TMA or gathered tiles).
void steps_match_cpu(const std::vector<Shape>& shapes, DType dtype, uint64_t seed) {
  const testing::FamilyOf family = [dtype](const Shape&) -> std::optional<cuda::AttendKernel> {
    if (testing::attend_rerouted()) return std::nullopt;
    return dtype == DType::bf16 ? cuda::AttendKernel::kRowsBf16 : cuda::AttendKernel::kRows;
  };
  testing::steps_match_cpu(shapes, dtype, dtype, seed, testing::RowsKernel::kMany, {.family = family});
}

TEST(ManyRows, Bf16StepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the many-rows kernel tests");
  steps_match_cpu({{"deepseek-v3", 100, 1, 36, 64, 700, false},  // 100 rows: the second row tile 36 of 64
                   {"kimi-k3", 16, 4, 40, 16, 500, true},         // 64 rows, qlen 4 (causal inside the tile)
                   {"kimi-k2", 24, 3, 40, 32, 600, false},        // 72 rows
                   {"deepseek-v3", 64, 1, 40, 8, 400, true},      // 8-row boxes: 8 a tile
                   {"kimi-k3", 12, 8, 40, 128, 900, true},        // 96 rows, qlen 8, a 64-row box in a page of 128
                   {"kimi-k3", 16, 4, 40, 1, 500, true},          // one-row boxes (v20)
                   {"deepseek-v3", 100, 1, 36, 2, 700, false}},   // two-row boxes
                  DType::bf16, 900);
}

// The fp8 kernel on TMA pages, with 32-row CTAs (24 and 32 rows a request), 48-row ones (48, 72 and
// 96) and 64-row ones (64 and 100: the second CTA 36 of 64), fixed splits and the flat plan.
TEST(ManyRows, Fp8StepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the many-rows kernel tests");
  steps_match_cpu({{"kimi-k3", 12, 2, 40, 64, 700, true},       // 24 rows: one 32-row CTA
                   {"deepseek-v3", 16, 2, 40, 16, 600, false},  // 32 rows
                   {"kimi-k3", 12, 4, 40, 64, 700, false},      // 48 rows: one 48-row CTA
                   {"kimi-k3", 12, 8, 40, 16, 600, true},       // 96 rows: two, causal inside each
                   {"deepseek-v3", 96, 1, 24, 64, 900, true},   // 96 heads
                   {"kimi-k2", 24, 3, 40, 32, 600, false},      // 72 rows: 48 + 24
                   {"kimi-k3", 16, 4, 40, 8, 500, true},        // 64 rows: one 64-row CTA
                   {"deepseek-v3", 100, 1, 36, 64, 700, false}},  // 100 rows: 64 + 36
                  DType::fp8_e4m3, 970);
}

// Pages of 1-4 rows: the fp8 kernel boxes them a key row (or page) a box (gathered by cp.async
// under MLA_ROWS_SMALL_BOXES=0); uneven batches take the flat plan on those tiles, even ones fixed
// splits. 100 rows: two 64-row CTAs (the second 36 of 64; at page 1 the kAhead form), 64 rows: one
// 64-row CTA, 72 rows: two 48-row CTAs; at page 1, two row tiles run as a 2-CTA cluster; 48 rows
// (F's shape) and 24 rows (qlen 2's) at page 1: one 48- or 32-row CTA a request, alone (under
// MLA_ROWS_ROW_COPIES=1 by bulk row copies, session 31). (The forced variant, MLA_ATTEND_ROWS_MIN=1:
// the 12- and 16-head cases take 32-row CTAs.)
TEST(ManyRows, SmallPagesStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the many-rows kernel tests");
  steps_match_cpu({{"deepseek-v3", 100, 1, 36, 1, 700, false},
                   {"kimi-k3", 16, 4, 40, 1, 500, true},
                   {"kimi-k2", 24, 3, 40, 2, 600, false},
                   {"deepseek-v3", 64, 1, 40, 4, 400, true},
                   {"deepseek-v3", 128, 1, 24, 4, 600, true},   // two 64-row CTAs, the flat plan
                   {"deepseek-v3", 96, 1, 30, 1, 600, true},    // two 48-row CTAs as a cluster, the flat plan
                   {"deepseek-v3", 128, 1, 30, 1, 600, false},  // two 64-row CTAs as a cluster, fixed splits
                   {"kimi-k3", 12, 8, 32, 1, 600, false},       // the same, fixed splits, causal inside each
                   {"kimi-k3", 12, 4, 40, 1, 600, true},        // 48 rows: one 48-row CTA, the flat plan
                   {"kimi-k3", 12, 2, 40, 1, 600, false}},      // 24 rows: one 32-row CTA, fixed splits
                  DType::fp8_e4m3, 960);
}

// The 2-CTA clusters (TMA multicast) of 64- and 48-row CTAs at page 1 apply where every pair of a
// launch fits at once; the planner gives the many-rows kernel one CTA an SM, so half the SMs in
// pairs must.
TEST(ManyRows, ClusterPairsFitOneWave) {
  MLA_SKIP_WITHOUT_GPU("the many-rows kernel's clusters");
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (int rows : {64, 48}) {
    const int pairs = cuda::attend_rows_max_pairs(rows);
    std::printf("%d-row CTAs: %d clusters of 2 at once on %d SMs\n", rows, pairs, sms);
    EXPECT_GE(pairs, sms / 2) << rows << "-row CTAs";
  }
  EXPECT_EQ(cuda::attend_rows_max_pairs(32), 0);
}

// Pages TMA cannot box (not a power of two): the fp8 many-rows kernel gathers its tiles a row at a
// time (fixed splits for even batches, the flat plan for uneven ones).
TEST(ManyRows, GatheredTilesStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the many-rows kernel tests");
  steps_match_cpu({{"deepseek-v3", 100, 1, 36, 3, 700, false},
                   {"kimi-k3", 16, 4, 40, 6, 500, true},
                   {"kimi-k2", 24, 3, 40, 12, 600, false},
                   {"kimi-k3", 12, 8, 40, 48, 900, true}},
                  DType::fp8_e4m3, 950);
}

}  // namespace
}  // namespace mla
