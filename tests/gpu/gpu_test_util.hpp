#pragma once
// Helpers the GPU tests (tests/gpu/*.cpp) share: the skip where no GPU is present, and the
// CUDA-against-CPU comparison of one output.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/backend.hpp"
#include "core/synthetic.hpp"
#include "cuda/device_errors.hpp"
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

// The whole step of the host scenario on a CPU and a CUDA layer, each on its own fresh copy of it
// (the CUDA output poisoned first, out_width = heads x v_head_dim): the outputs within SPEC's 1e-2,
// no device error, and with check_cache the cache rows the step wrote. A failed device sync is
// fatal here: call it under ASSERT_NO_FATAL_FAILURE.
inline void expect_step_matches(Layer& cpu, Layer& gpu, const synth::Scenario& host, float k_scale, int64_t out_width,
                                bool check_cache) {
  const int64_t s = host.tokens();
  synth::Scenario dev = synth::to_device(host);
  synth::Scenario cpu_host = synth::make_scenario(host.spec, k_scale);
  Tensor cpu_out = Tensor::empty(DType::bf16, {s, out_width});
  Tensor gpu_out = Tensor::empty(DType::bf16, {s, out_width}, Device::cuda);
  poison(gpu_out);
  cpu.step(cpu_host.hidden, cpu_host.meta(), cpu_host.kv(), cpu_out);
  gpu.step(dev.hidden, dev.meta(), dev.kv(), gpu_out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cuda::take_device_errors(detail::backend_of(gpu)), 0u);
  expect_close(gpu_out.to_host(), cpu_out, 1e-2, "step out");
  if (check_cache) expect_close(dev.cache.to_host(), cpu_host.cache, 1e-2, "cache after step");
}

}  // namespace mla::testing
