#pragma once
// Helpers the GPU tests (tests/gpu/*.cpp) share: the skip where no GPU is present, and the
// CUDA-against-CPU comparison of one output.
#include <gtest/gtest.h>

#include <vector>

#include "mla/layer.hpp"
#include "mla/tensor.hpp"
#include "support/testing.hpp"

// Skips the calling test with a message where no CUDA device is present; `tests` names the tests
// in it ("the CUDA backend tests"). Each test file defines its MLA_REQUIRE_GPU() from this.
#define MLA_SKIP_WITHOUT_GPU(tests)                                                   \
  do {                                                                                \
    if (!::mla::cuda_available()) GTEST_SKIP() << "no CUDA device: " tests " need a GPU"; \
  } while (0)

namespace mla::testing {

// The CUDA result (copied to the host) within relative L2 error tol of the CPU one, inf/NaN at the
// same places; `what` names the output in the failure message.
inline void expect_close(const TensorView& gpu_host, const TensorView& cpu_host, double tol, const char* what) {
  const std::vector<double> ref = to_doubles(cpu_host);
  const Compare c = compare(gpu_host, ref.data());
  EXPECT_TRUE(c.ok(tol)) << what << ": rel L2 " << c.rel_l2 << " (tolerance " << tol << ") " << c.why;
}

}  // namespace mla::testing
