#pragma once
// Helpers the checkpoint tests share (header-only, uses GoogleTest): the small model they write, and
// a decode step on weights loaded from a checkpoint against the same step on weights built in memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/synthetic.hpp"
#include "mla/config.hpp"
#include "mla/layer.hpp"
#include "mla/weights.hpp"
#include "support/testing.hpp"

namespace mla::testing {

// A whole model, small: D and Rq ragged against 128-wide fp8 blocks; L and R as the kernels fix them.
inline LayerConfig tiny_model(int heads, RopeType rope, GateLayout gate) {
  const LayerConfig c{.name = "tiny", .hidden = 96, .q_lora_rank = 80, .kv_lora_rank = 512, .qk_nope_dim = 32,
                      .qk_rope_dim = 64, .v_head_dim = 32, .total_heads = heads, .tp_size = 1, .gate = gate,
                      .rope = rope,
                      .yarn = YarnParams{.theta = 50000, .factor = 32, .original_max_position = 4096,
                                         .beta_fast = 32, .beta_slow = 1, .mscale = 0.707, .mscale_all_dim = 0.707},
                      .rms_eps = 1e-5};
  c.validate();
  return c;
}

// One CPU step of the same scenario (requests of 37, 0 and 130 tokens, qlen 2, pages of 16; the
// scenario's shapes from mem_cfg) on the loaded layer and on the in-memory one: the outputs must be
// bit-identical; the padding request's tokens are 0, the others finite and not all zero.
inline void expect_same_step(const LayerConfig& loaded_cfg, const CheckpointWeights& loaded,
                             const LayerConfig& mem_cfg, const CheckpointWeights& mem) {
  synth::ScenarioSpec ss{.cfg = mem_cfg, .seq_lens = {37, 0, 130}, .qlen = 2, .page_size = 16, .seed = 5};
  const LayerOptions opts{.backend = Backend::cpu, .num_threads = 1};
  std::vector<Tensor> outs;
  for (const auto& [cfg, w] : {std::pair{loaded_cfg, loaded}, std::pair{mem_cfg, mem}}) {
    const synth::Scenario sc = synth::make_scenario(ss, w.k_scale);
    Layer layer(cfg, prepare_weights(cfg, w), opts);
    Tensor out = Tensor::empty(DType::bf16, {sc.tokens(), cfg.heads() * cfg.v_head_dim});
    poison(out);
    layer.step(sc.hidden, sc.meta(), sc.kv(), out);
    outs.push_back(std::move(out));
  }
  ASSERT_EQ(outs[0].bytes(), outs[1].bytes());
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].bytes()), 0);
  double norm = 0;
  for (double v : to_doubles(outs[0])) {
    ASSERT_TRUE(std::isfinite(v));
    norm += v * v;
  }
  EXPECT_GT(norm, 0);
}

}  // namespace mla::testing
