#pragma once
// Helpers the GPU tests (tests/gpu/*.cpp) share: the skip where no GPU is present, and the
// CUDA-against-CPU comparison of one output.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/synthetic.hpp"
#include "cuda/device_errors.hpp"
#include "cuda/stages.hpp"
#include "mla/layer.hpp"
#include "mla/tensor.hpp"
#include "mla/weights.hpp"
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

// lse (copied to the host): -inf at the same places as the CPU's (a NaN on either side fails: NaN != NaN), elsewhere
// within SPEC's 1e-3 absolute, plus rel x |cpu lse| where a kernel's scores carry a relative error (fp8 QGMMA:
// ManyRows.StridedOutputsMatchCpu).
inline void expect_lse_close(const TensorView& gpu_host, const TensorView& cpu_host, double rel = 0.0) {
  const std::vector<double> a = to_doubles(gpu_host), b = to_doubles(cpu_host);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) || std::isinf(a[i]) || std::isnan(a[i]) || std::isnan(b[i])) {
      ASSERT_TRUE(a[i] == b[i]) << "lse[" << i << "]: cuda " << a[i] << ", cpu " << b[i];
      continue;
    }
    ASSERT_NEAR(a[i], b[i], 1e-3 + rel * std::fabs(b[i])) << "lse[" << i << "]";
  }
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

// A step shape for steps_match_cpu: preset, heads (this rank's), qlen, batch, page size, the
// longest context; uneven: lengths from 0 and short ones up to max_context (the flat plan), else
// within its last quarter (fixed splits).
struct Shape {
  const char* preset;
  int heads, qlen, batch, page, max_context;
  bool uneven;
};
// What the planner's rule (attend_rows_wanted) must say for each shape, asserted unless
// MLA_ATTEND_ROWS_MIN forces many rows everywhere: many rows (attend_rows.cu, attend_rows_bf16.cu; a
// bf16 query over an fp8 cache then runs elsewhere) or the 16-row kernel's height.
enum class RowsKernel { kMany, kSixteen };

// The attend kernel family a shape's step must launch (cuda::last_attend_run), or none to leave it
// unchecked (e.g. where a switch in the environment reroutes it).
using FamilyOf = std::function<std::optional<cuda::AttendKernel>(const Shape&)>;
// Whether the environment sets a switch that reroutes attend across families (the family checks then
// stand down; the q-split and bf16 16-row switches are read by the tests' own expectations).
inline bool attend_rerouted() {
  for (const char* v : {"MLA_ATTEND_KERNEL", "MLA_ATTEND_TMA", "MLA_ROWS_SMALL_BOXES", "MLA_ATTEND_ROWS_MIN",
                        "MLA_ATTEND_ROWS_CTA"})
    if (std::getenv(v)) return true;
  return false;
}

struct StepOptions {
  int num_splits = 0;  // > 0: fixes the split count (LayerOptions.num_splits)
  int spread = 4;      // an even shape's lengths from the last 1/spread of max_context (8: within
                       // flat::lengths_even's eighth: an even batch, fixed splits unless they fill
                       // their waves poorly, attend_fixed_fills_its_waves)
  FamilyOf family;     // the attend kernel family each shape's step must launch
  std::optional<bool> flat;  // whether each step must take the flat plan (none: unchecked)
  std::function<void(const LayerConfig&, CheckpointWeights&)> weights;  // changes to the random weights
};

// Each shape's whole step on both backends (same weights, same inputs: expect_step_matches), the
// cache in kv_dtype and the query in q_dtype, NaN in unused pages and page tails.
inline void steps_match_cpu(const std::vector<Shape>& shapes, DType kv_dtype, DType q_dtype, uint64_t seed,
                            RowsKernel kernel, const StepOptions& opt = {}) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const Shape& sh : shapes) {
    ++seed;
    const LayerConfig cfg = small_config(sh.preset, GateLayout::merged, sh.heads);
    const int rows = cfg.heads() * sh.qlen;
    const std::string what = std::string(sh.preset) + " G=" + std::to_string(cfg.heads()) + " Q=" +
                             std::to_string(sh.qlen) + " B=" + std::to_string(sh.batch) + " page " +
                             std::to_string(sh.page) + (sh.uneven ? " uneven" : " even");
    SCOPED_TRACE(what);
    if (!std::getenv("MLA_ATTEND_ROWS_MIN")) {
      ASSERT_EQ(cuda::attend_rows_wanted(sh.batch, rows, sms), kernel == RowsKernel::kMany) << what;
    }
    std::mt19937_64 rng(seed);
    synth::ScenarioSpec spec;
    spec.cfg = cfg;
    spec.qlen = sh.qlen;
    spec.page_size = sh.page;
    spec.kv_dtype = kv_dtype;
    spec.spare_pages = 3;
    spec.seed = seed;
    for (int b = 0; b < sh.batch; ++b) {
      int len = std::uniform_int_distribution<int>(sh.max_context - sh.max_context / opt.spread, sh.max_context)(rng);
      if (sh.uneven) {
        const int kind = int(rng() % 8);
        len = kind == 0 ? 0 : kind == 1 ? std::uniform_int_distribution<int>(sh.qlen, sh.qlen + 70)(rng)
                                        : std::uniform_int_distribution<int>(sh.qlen, sh.max_context)(rng);
      }
      spec.seq_lens.push_back(len);
    }
    CheckpointWeights ckpt = random_checkpoint_weights(cfg, seed);
    if (opt.weights) opt.weights(cfg, ckpt);
    const PreparedWeights w = prepare_weights(cfg, ckpt);
    const synth::Scenario host = synth::make_scenario(spec, w.k_scale);
    const int64_t s = host.tokens(), nv = int64_t(cfg.heads()) * cfg.v_head_dim;
    auto options = [&](Backend backend) {
      return LayerOptions{
          .backend = backend, .q_dtype = q_dtype, .max_tokens = int(s), .num_splits = opt.num_splits, .num_threads = 2};
    };
    Layer cpu(cfg, w, options(Backend::cpu)), gpu(cfg, w, options(Backend::cuda));
    ASSERT_NO_FATAL_FAILURE(expect_step_matches(cpu, gpu, host, w.k_scale, nv, true));
    // (the step's one attend; what benchmark records and `mla run` report names the same)
    const cuda::AttendRun ran = cuda::last_attend_run(detail::backend_of(gpu));
    const std::string said = gpu.last_attend_kernel();
    if (const std::optional<cuda::AttendKernel> want = opt.family ? opt.family(sh) : std::nullopt) {
      EXPECT_EQ(ran.family, *want) << "the step launched " << cuda::attend_kernel_name(ran.family) << ", not "
                                   << cuda::attend_kernel_name(*want);
      EXPECT_EQ(said.rfind(std::string(cuda::attend_kernel_name(*want)) + ", ", 0), 0u) << said;
    }
    if (opt.flat) {
      EXPECT_EQ(ran.flat_ctas > 0, *opt.flat) << said;
      EXPECT_EQ(said.find("flat plan") != std::string::npos, *opt.flat) << said;
    }
  }
}

}  // namespace mla::testing
