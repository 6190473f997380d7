// The whole Layer::step on the CPU against ref::end_to_end: plain multi-head attention in float64
// with keys and values expanded from the cached latent (no absorption, no fp8/bf16 rounding).
// Every preset and gate layout, fp8 and bf16 cache and query, uneven lengths with an empty
// request, every page size; plus a check that the 5e-2 tolerance catches a head-order bug.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/synthetic.hpp"
#include "mla/mla.hpp"
#include "reference/reference.hpp"
#include "reference/tolerances.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

// The end-to-end tolerances and why an fp8 query gets 1e-1: reference/tolerances.hpp.
using ref::kTolEndToEnd, ref::kTolEndToEndFp8Query;
double e2e_tolerance(DType q_dtype) { return ref::end_to_end_tolerance(q_dtype); }

struct E2eCase {
  std::string preset;
  GateLayout gate;
  int heads;
  DType kv_dtype, q_dtype;
  int qlen, page_size;
  std::vector<int32_t> seq_lens;  // global, incl. this step's qlen; 0 = padding request
};

std::string name_of(const E2eCase& c) {
  const char* gates[] = {"none", "merged", "separate"};
  std::string s = c.preset + " gate=" + gates[int(c.gate)] + " N=" + std::to_string(c.heads) +
                  " kv=" + dtype_name(c.kv_dtype) + " q=" + dtype_name(c.q_dtype) + " Q=" + std::to_string(c.qlen) +
                  " page=" + std::to_string(c.page_size) + " seq_lens=";
  for (int32_t l : c.seq_lens) s += std::to_string(l) + ",";
  return s;
}

struct E2eRun {
  LayerConfig cfg;
  PreparedWeights w;
  synth::Scenario sc;
  Tensor out;
};

E2eRun run_step(const E2eCase& c, uint64_t seed) {
  E2eRun r;
  r.cfg = testing::small_config(c.preset, c.gate, c.heads);
  r.w = prepare_weights(r.cfg, random_checkpoint_weights(r.cfg, seed));
  r.sc = synth::make_scenario({.cfg = r.cfg,
                               .seq_lens = c.seq_lens,
                               .qlen = c.qlen,
                               .page_size = c.page_size,
                               .kv_dtype = c.kv_dtype,
                               .seed = seed + 7},
                              r.w.k_scale);
  const int S = r.sc.tokens();
  Layer layer(r.cfg, r.w, {.backend = Backend::cpu, .q_dtype = c.q_dtype, .max_tokens = S});
  r.out = Tensor::empty(DType::bf16, {S, int64_t(r.cfg.heads()) * r.cfg.v_head_dim});
  testing::poison(r.out);
  layer.step(r.sc.hidden, r.sc.meta(), r.sc.kv(), r.out);
  return r;
}

class EndToEnd : public ::testing::TestWithParam<E2eCase> {};

TEST_P(EndToEnd, StepMatchesUnabsorbedFloat64) {
  const E2eCase& c = GetParam();
  SCOPED_TRACE(name_of(c));
  const uint64_t seed = 1000 + std::hash<std::string>{}(name_of(c)) % 1000;  // varies per case
  const E2eRun r = run_step(c, seed);
  EXPECT_EQ(testing::count_poison(r.out), 0) << "out not fully written";
  const ref::Weights64 w64 = ref::dequantize(r.cfg, r.w);
  // The cache after the step: the history rows are what the reference reads; this step's rows
  // (written by pre, rounded) are recomputed unrounded by the reference.
  const std::vector<double> want = ref::end_to_end(r.cfg, w64, r.sc.hidden, r.sc.kv(), r.sc.meta());
  const testing::Compare cmp = testing::compare(r.out, want.data());
  EXPECT_TRUE(cmp.ok(e2e_tolerance(c.q_dtype))) << "rel_l2 " << cmp.rel_l2 << " " << cmp.why;
  // Padding requests give exactly zero.
  const int Q = c.qlen, NV = r.cfg.heads() * r.cfg.v_head_dim;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    if (c.seq_lens[b] != 0) continue;
    for (int64_t i = int64_t(b) * Q * NV; i < int64_t(b + 1) * Q * NV; ++i)
      ASSERT_EQ(testing::element(r.out, i), 0.0) << "request " << b << " is padding";
  }
}

constexpr DType fp8 = DType::fp8_e4m3, bf16 = DType::bf16;
INSTANTIATE_TEST_SUITE_P(
    Configs, EndToEnd,
    ::testing::Values(
        E2eCase{"kimi-k3", GateLayout::merged, 3, fp8, fp8, 1, 64, {70, 0, 200}},
        E2eCase{"kimi-k3", GateLayout::separate, 2, bf16, bf16, 3, 16, {5, 130}},
        E2eCase{"kimi-k3", GateLayout::none, 1, fp8, bf16, 8, 1, {40, 9}},
        E2eCase{"deepseek-v3", GateLayout::none, 4, fp8, fp8, 2, 16, {300, 2, 0, 77}},
        E2eCase{"deepseek-v3", GateLayout::merged, 2, bf16, fp8, 1, 64, {1500}},  // RoPE at long positions
        E2eCase{"deepseek-v3", GateLayout::separate, 3, fp8, bf16, 4, 64, {64, 65}},
        E2eCase{"kimi-k2", GateLayout::none, 5, bf16, bf16, 1, 1, {33, 1}},
        E2eCase{"kimi-k2", GateLayout::merged, 2, fp8, fp8, 5, 16, {0, 180}},
        E2eCase{"kimi-k2", GateLayout::separate, 2, fp8, fp8, 2, 64, {900, 17}}),
    [](const ::testing::TestParamInfo<E2eCase>& info) { return "case" + std::to_string(info.index); });

// The tolerances have teeth: the reference with two heads of W_UV swapped (a head-order bug in
// post) or with W_UK scaled (a wrong scale in the absorption) is outside even the fp8 one.
TEST(EndToEndTolerance, CatchesSwappedHeadsAndWrongScale) {
  const E2eCase c{"deepseek-v3", GateLayout::none, 2, fp8, bf16, 2, 16, {120, 60}};
  const E2eRun r = run_step(c, 4242);
  ref::Weights64 w64 = ref::dequantize(r.cfg, r.w);
  const auto rel = [&](const ref::Weights64& w) {
    const std::vector<double> want = ref::end_to_end(r.cfg, w, r.sc.hidden, r.sc.kv(), r.sc.meta());
    return testing::compare(r.out, want.data()).rel_l2;
  };
  ASSERT_LT(rel(w64), kTolEndToEnd);
  const size_t head_uv = size_t(r.cfg.v_head_dim) * r.cfg.kv_lora_rank;
  ref::Weights64 swapped = w64;
  std::swap_ranges(swapped.w_uv.begin(), swapped.w_uv.begin() + head_uv, swapped.w_uv.begin() + head_uv);
  EXPECT_GT(rel(swapped), 5 * kTolEndToEndFp8Query);
  ref::Weights64 scaled = w64;
  for (double& x : scaled.w_uk) x *= 1.5;
  EXPECT_GT(rel(scaled), kTolEndToEndFp8Query);
}

}  // namespace
}  // namespace mla
