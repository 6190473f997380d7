// The CUDA backend at decode sizes (S <= 4), where pre takes its latency-bound paths: the
// weight-streaming projections at the presets' real dimensions (hidden 7168: two load batches a
// row), pre_norm with Rq = 1536 and a 1536-wide gate in its own CTA, the query kernel's 1..4-token
// variants, post merging 64 split partials (most of them empty at short contexts). And the
// metadata check that pre_norm does itself for S <= kFusedCheckTokens: the same error bits, no
// cache row of a rejected step, sticky until taken. Without a GPU every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

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

#define MLA_REQUIRE_GPU() MLA_SKIP_WITHOUT_GPU("the CUDA backend tests")

synth::ScenarioSpec decode_spec(const LayerConfig& cfg, int batch, int qlen, int max_context, uint64_t seed) {
  std::mt19937_64 rng(seed);
  synth::ScenarioSpec spec;
  spec.cfg = cfg;
  spec.qlen = qlen;
  spec.page_size = std::vector<int>{1, 16, 64}[rng() % 3];
  spec.seed = seed;
  for (int b = 0; b < batch; ++b)
    spec.seq_lens.push_back(std::uniform_int_distribution<int>(qlen, max_context)(rng));
  return spec;
}

// Real preset dimensions, S = 1..4, split counts up to 64: pre's outputs and the whole step
// against the CPU backend on the same inputs.
TEST(CudaDecode, RealDimensionsMatchCpu) {
  MLA_REQUIRE_GPU();
  struct Shape {
    const char* preset;
    int batch, qlen, splits;
  };
  const Shape shapes[] = {{"kimi-k3", 1, 1, 64}, {"kimi-k3", 2, 2, 4}, {"deepseek-v3", 1, 1, 64}, {"kimi-k2", 3, 1, 1}};
  uint64_t seed = 700;
  for (const Shape& sh : shapes) {
    ++seed;
    const LayerConfig cfg = LayerConfig::preset(sh.preset);
    SCOPED_TRACE(std::string(sh.preset) + " B=" + std::to_string(sh.batch) + " Q=" + std::to_string(sh.qlen) +
                 " splits=" + std::to_string(sh.splits));
    const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, seed));
    const synth::Scenario host = synth::make_scenario(decode_spec(cfg, sh.batch, sh.qlen, 8192, seed), w.k_scale);
    const int64_t s = host.tokens(), nv = int64_t(cfg.heads()) * cfg.v_head_dim;
    auto options = [&](Backend b) {
      return LayerOptions{.backend = b, .max_tokens = int(s), .num_splits = sh.splits, .num_threads = 2};
    };
    Layer cpu(cfg, w, options(Backend::cpu)), gpu(cfg, w, options(Backend::cuda));

    // pre
    synth::Scenario dev = synth::to_device(host);
    synth::Scenario cpu_host = synth::make_scenario(host.spec, w.k_scale);
    auto make_pre = [&](Device d) {
      std::pair<Tensor, Tensor> t{Tensor::empty(DType::fp8_e4m3, {s, cfg.heads(), 576}, d),
                                  cfg.gate_dim() > 0 ? Tensor::empty(DType::bf16, {s, cfg.gate_dim()}, d) : Tensor()};
      testing::poison(t.first);
      if (cfg.gate_dim() > 0) testing::poison(t.second);
      return t;
    };
    auto [cpu_q, cpu_gate] = make_pre(Device::cpu);
    auto [gpu_q, gpu_gate] = make_pre(Device::cuda);
    cpu.pre(cpu_host.hidden, cpu_host.meta(), cpu_host.kv(), {.q = cpu_q.view(), .gate = cpu_gate.view()});
    gpu.pre(dev.hidden, dev.meta(), dev.kv(), {.q = gpu_q.view(), .gate = gpu_gate.view()});
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cuda::take_device_errors(detail::backend_of(gpu)), 0u);
    expect_close(gpu_q.to_host(), cpu_q, 1e-2, "query");
    expect_close(dev.cache.to_host(), cpu_host.cache, 1e-2, "cache");
    if (cfg.gate_dim() > 0) expect_close(gpu_gate.to_host(), cpu_gate, 1e-2, "gate");

    // the whole step, on fresh copies
    ASSERT_NO_FATAL_FAILURE(testing::expect_step_matches(cpu, gpu, host, w.k_scale, nv, false));
  }
}

// A long uneven batch under the 16-row kernel's flat plan (12 requests of 20000-32768 keys: over
// 3700 tiles, 14 a key-CTA on the H200's 264, most CTAs serving two requests), at pages 64, 16
// and 1 (TMA boxes, boxes of 16 rows, bulk row copies): the whole step against the CPU backend.
// The random cases' short contexts never reach segment switches between long segments.
TEST(CudaDecode, LongUnevenBatchMatchesCpu) {
  MLA_REQUIRE_GPU();
  const LayerConfig cfg = LayerConfig::preset("kimi-k3");
  uint64_t seed = 760;
  for (const int page : {64, 16, 1}) {
    ++seed;
    SCOPED_TRACE("page " + std::to_string(page));
    const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, seed));
    synth::ScenarioSpec spec = decode_spec(cfg, 12, 1, 32768, seed);
    spec.page_size = page;
    std::mt19937_64 rng(seed);
    for (int32_t& len : spec.seq_lens) len = std::uniform_int_distribution<int32_t>(20000, 32768)(rng);
    const synth::Scenario host = synth::make_scenario(spec, w.k_scale);
    const int64_t s = host.tokens(), nv = int64_t(cfg.heads()) * cfg.v_head_dim;
    auto options = [&](Backend b) { return LayerOptions{.backend = b, .max_tokens = int(s)}; };
    Layer cpu(cfg, w, options(Backend::cpu)), gpu(cfg, w, options(Backend::cuda));
    ASSERT_NO_FATAL_FAILURE(testing::expect_step_matches(cpu, gpu, host, w.k_scale, nv, false));
  }
}

// Bad slots at decode sizes (pre_norm's own check, S <= 64) and just above (meta_check_kernel):
// reported, and the cache is left as it was; the error is sticky (a good step after it writes
// nothing either until the host takes the error); after that a good step writes its rows.
TEST(CudaDecode, BadSlotsAreReportedAndNotWritten) {
  MLA_REQUIRE_GPU();
  struct Shape {
    int batch, qlen;
  };
  const Shape shapes[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {64, 1}, {65, 1}};
  uint64_t seed = 800;
  for (const Shape& sh : shapes) {
    ++seed;
    const LayerConfig cfg = testing::small_config("kimi-k3", GateLayout::merged, 2);
    const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, seed));
    const synth::Scenario host = synth::make_scenario(decode_spec(cfg, sh.batch, sh.qlen, 300, seed), w.k_scale);
    const int64_t s = host.tokens(), nv = int64_t(cfg.heads()) * cfg.v_head_dim;
    SCOPED_TRACE("S=" + std::to_string(s) + (cuda::pre_norm_checks_meta(s) ? " (check in pre_norm)" : " (meta_check)"));
    Layer layer(cfg, w, {.backend = Backend::cuda, .max_tokens = int(s)});
    const int64_t num_slots = host.cache.view().shape[0] * host.cache.view().shape[1];
    const std::vector<int64_t> good(host.slot_mapping.ptr<int64_t>(), host.slot_mapping.ptr<int64_t>() + s);
    Tensor out = Tensor::empty(DType::bf16, {s, nv}, Device::cuda);

    struct Bad {
      const char* what;
      std::vector<int64_t> slots;
      uint32_t bit;
    };
    std::vector<Bad> bad{{"slot past the cache", good, cuda::kBadSlot}, {"slot below -1", good, cuda::kBadSlot}};
    bad[0].slots[s - 1] = num_slots + 7;
    bad[1].slots[0] = -2;
    if (s >= 2) {
      bad.push_back({"duplicate slot", good, cuda::kDuplicateSlot});
      bad.back().slots[s - 1] = good[0];
    }
    for (const Bad& c : bad) {
      SCOPED_TRACE(c.what);
      synth::Scenario dev = synth::to_device(host);
      dev.slot_mapping.copy_from(TensorView::contiguous(c.slots.data(), DType::i64, {s}));
      const std::vector<uint8_t> before = testing::snapshot(dev.cache);
      layer.step(dev.hidden, dev.meta(), dev.kv(), out);
      const uint32_t bits = cuda::take_device_errors(detail::backend_of(layer));
      EXPECT_TRUE(bits & c.bit) << "error bits " << bits << ": " << cuda::describe_device_errors(bits);
      EXPECT_EQ(testing::snapshot(dev.cache), before) << "a rejected step changed the cache";
    }

    // Sticky: a bad step, then a good one before the error is taken: neither writes.
    synth::Scenario dev_bad = synth::to_device(host), dev_good = synth::to_device(host);
    dev_bad.slot_mapping.copy_from(TensorView::contiguous(bad[0].slots.data(), DType::i64, {s}));
    const std::vector<uint8_t> good_before = testing::snapshot(dev_good.cache);
    layer.step(dev_bad.hidden, dev_bad.meta(), dev_bad.kv(), out);
    layer.step(dev_good.hidden, dev_good.meta(), dev_good.kv(), out);
    EXPECT_NE(cuda::take_device_errors(detail::backend_of(layer)) & cuda::kBadSlot, 0u);
    EXPECT_EQ(testing::snapshot(dev_good.cache), good_before) << "a step after an untaken error wrote the cache";

    // Taken: a good step runs clean and writes its rows.
    layer.step(dev_good.hidden, dev_good.meta(), dev_good.kv(), out);
    EXPECT_NO_THROW(cuda::check_device_errors(detail::backend_of(layer)));
    EXPECT_NE(testing::snapshot(dev_good.cache), good_before);
  }
}

}  // namespace
}  // namespace mla
