// post's merge of a token's partials shared out over clusters of a head's CTAs (MLA_POST_CLUSTER,
// post.cu's post_kernel<_, kPostCluster>; session 37, the default since session 38): the host rule,
// and steps with many partials a token against the CPU backend. Under MLA_POST_CLUSTER=0 these steps
// check the one-CTA merge at the same partial counts; ctest runs them under =force too.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cuda/stages.hpp"
#include "gpu/gpu_test_util.hpp"

namespace mla {
namespace {

// By default (and =1) where every token has 32+ partials (fixed splits: the flat plan's counts are
// per request, on the device) and the head's CTAs make whole clusters; =force wherever they do; =0
// never.
TEST(PostRule, ClustersWhereTheSwitchSays) {
  const char* env = std::getenv("MLA_POST_CLUSTER");
  const std::string mode = env ? env : "";
  for (const int splits : {0, 1, 31, 32, 256}) {
    for (const int blocks : {1, 2, 3, 4, 8}) {
      const bool whole = blocks % cuda::kPostCluster == 0;
      const bool want = whole && mode != "0" && (mode == "force" || splits >= cuda::kPostClusterMinPartials);
      EXPECT_EQ(cuda::post_clusters(splits, blocks), want)
          << splits << " partials, " << blocks << " CTAs a head, MLA_POST_CLUSTER=" << mode;
    }
  }
}

// One request at 256, 64 and 33 fixed splits (a cluster's four CTAs get 64, 16 and 8-9 partials,
// the last CTA's groups some none), 3 requests at 16 heads and page 16 (three tokens a CTA, each
// with its own partials), and an uneven batch on the flat plan (per-request counts; clustered only under =force).
TEST(PostCluster, ManyPartialsStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("post's merge of many partials");
  for (const int splits : {256, 64, 33}) {
    SCOPED_TRACE(std::to_string(splits) + " splits");
    testing::steps_match_cpu({{"kimi-k3", 12, 1, 1, 64, 20000, false}, {"deepseek-v3", 16, 1, 3, 16, 9000, false}},
                             DType::fp8_e4m3, DType::fp8_e4m3, 4100 + uint64_t(splits), testing::RowsKernel::kSixteen,
                             {.num_splits = splits, .spread = 8});
  }
  testing::steps_match_cpu({{"kimi-k3", 12, 1, 6, 64, 30000, true}}, DType::fp8_e4m3, DType::bf16, 4500,
                           testing::RowsKernel::kSixteen);
}

}  // namespace
}  // namespace mla
