// mla::Workspace (include/mla/workspace.hpp): layers that share one run their steps exactly as
// layers with their own (outputs and cache bit for bit, steps of different layers interleaved, a
// larger layer constructed after a smaller one has run), the workspace holds the largest layer's
// need and no more, and a layer on another device is rejected. CPU backend; the CUDA backend's
// sharing is checked on a GPU (tests/gpu/test_workspace_gpu.cpp).
#include <gtest/gtest.h>

#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/synthetic.hpp"
#include "core/workspace_impl.hpp"
#include "mla/mla.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

using Model = testing::SmallModel;

// One step of m on a fresh copy of its scenario: the output and the cache after it.
struct StepResult {
  std::vector<uint8_t> out, cache;
};
StepResult step(Layer& layer, const Model& m) {
  synth::Scenario sc = synth::make_scenario(m.spec, m.w.k_scale);
  Tensor out = Tensor::empty(DType::bf16, {sc.tokens(), int64_t(m.cfg.heads()) * m.cfg.v_head_dim});
  testing::poison(out);
  layer.step(sc.hidden, sc.meta(), sc.kv(), out);
  return {testing::snapshot(out), testing::snapshot(sc.cache)};
}

LayerOptions options(int max_tokens, std::shared_ptr<Workspace> ws) {
  return {.backend = Backend::cpu, .max_tokens = max_tokens, .num_threads = 2, .workspace = std::move(ws)};
}

TEST(Workspace, SharedByLayersMatchesTheirOwn) {
  const Model a = testing::small_model("kimi-k3", GateLayout::merged, 12, {100, 0, 37}, 1, 16, 11);
  const Model b = testing::small_model("deepseek-v3", GateLayout::none, 16, {300, 65}, 4, 16, 12);
  // Alone: each layer's need, and its results.
  auto own_a = std::make_shared<Workspace>(), own_b = std::make_shared<Workspace>();
  Layer alone_a(a.cfg, a.w, options(8, own_a)), alone_b(b.cfg, b.w, options(16, own_b));
  const StepResult want_a = step(alone_a, a), want_b = step(alone_b, b);
  ASSERT_GT(own_a->bytes(), 0);
  ASSERT_GT(own_b->bytes(), own_a->bytes());  // more heads, tokens and rows

  // Shared: the smaller layer first, its step, then the larger one (the workspace grows), then both
  // again, interleaved.
  auto shared = std::make_shared<Workspace>();
  Layer la(a.cfg, a.w, options(8, shared));
  EXPECT_EQ(shared->bytes(), own_a->bytes());
  const StepResult first_a = step(la, a);
  Layer lb(b.cfg, b.w, options(16, shared));
  EXPECT_EQ(shared->bytes(), own_b->bytes()) << "the largest layer's need, not the sum";
  EXPECT_EQ(shared->device(), Device::cpu);
  const StepResult got_b = step(lb, b), got_a = step(la, a), again_b = step(lb, b);
  EXPECT_EQ(first_a.out, want_a.out);
  EXPECT_EQ(first_a.cache, want_a.cache);
  EXPECT_EQ(got_a.out, want_a.out) << "after the workspace grew";
  EXPECT_EQ(got_a.cache, want_a.cache);
  EXPECT_EQ(got_b.out, want_b.out);
  EXPECT_EQ(got_b.cache, want_b.cache);
  EXPECT_EQ(again_b.out, want_b.out);
}

// Layer a's stages into buffers of the caller's, with or without layer b's steps through the shared
// workspace between them: the same bits (the stage calls keep their data out of the workspace).
std::vector<uint8_t> staged(Layer& la, const Model& a, Layer* lb, const Model& b) {
  synth::Scenario sc = synth::make_scenario(a.spec, a.w.k_scale);
  const int64_t s = sc.tokens(), g = la.query_heads();
  Tensor q = Tensor::empty(DType::fp8_e4m3, {s, g, a.cfg.row_dim()});
  Tensor gate = Tensor::empty(DType::bf16, {s, a.cfg.gate_dim()});
  Tensor o = Tensor::empty(DType::f32, {s, g, a.cfg.kv_lora_rank}), lse = Tensor::empty(DType::f32, {s, g});
  Tensor out = Tensor::empty(DType::bf16, {s, int64_t(a.cfg.heads()) * a.cfg.v_head_dim});
  la.pre(sc.hidden, sc.meta(), sc.kv(), {.q = q, .gate = gate});
  if (lb) step(*lb, b);
  la.attend(q, sc.kv(), sc.meta(), {.o = o, .lse = lse});
  if (lb) step(*lb, b);
  la.post({.o = o, .lse = lse}, gate, sc.meta(), out);
  return testing::snapshot(out);
}

TEST(Workspace, StageCallsKeepOutOfIt) {
  const Model a = testing::small_model("kimi-k3", GateLayout::merged, 12, {90, 40}, 2, 16, 21);
  const Model b = testing::small_model("kimi-k3", GateLayout::merged, 12, {200, 7, 55}, 2, 16, 22);
  auto shared = std::make_shared<Workspace>();
  Layer la(a.cfg, a.w, options(8, shared)), lb(b.cfg, b.w, options(8, shared));
  const std::vector<uint8_t> want = staged(la, a, nullptr, b);
  EXPECT_EQ(staged(la, a, &lb, b), want);
}

TEST(Workspace, FailedGrowthChangesNothing) {
  // The backends' side: a growth whose allocation fails (out of memory) leaves the block, its size
  // and the device binding as they were, so the layers already using it go on as before.
  Workspace ws;
  auto host = [](int64_t bytes) { return Workspace::Impl::Block(new uint8_t[size_t(bytes)], std::default_delete<uint8_t[]>()); };
  auto fails = [](int64_t) -> Workspace::Impl::Block { throw std::bad_alloc(); };
  EXPECT_THROW(ws.impl().reserve(Device::cuda, 1, 4096, fails), std::bad_alloc);
  EXPECT_EQ(ws.bytes(), 0);
  ws.impl().reserve(Device::cpu, 0, 1000, host);  // not bound to the failed reservation's device
  uint8_t* const block = ws.impl().data();
  ASSERT_NE(block, nullptr);
  EXPECT_THROW(ws.impl().reserve(Device::cpu, 0, 1 << 20, fails), std::bad_alloc);
  EXPECT_EQ(ws.bytes(), 1000);
  EXPECT_EQ(ws.impl().data(), block);
  ws.impl().reserve(Device::cpu, 0, 500, fails);  // within the block: no allocation
  EXPECT_EQ(ws.bytes(), 1000);
  const std::string err = testing::error_of([&] { ws.impl().reserve(Device::cuda, 0, 10, host); });
  EXPECT_NE(err.find("LayerOptions.workspace"), std::string::npos) << err;
  EXPECT_EQ(ws.device(), Device::cpu);
  detail::WorkspaceLayout layout;  // slots at 256-byte boundaries, an empty one null
  EXPECT_EQ(layout.add(1), 0);
  EXPECT_EQ(layout.add(0), 1);
  EXPECT_EQ(layout.add(300), 2);
  EXPECT_EQ(layout.total(), 256 + 512);
  EXPECT_EQ(layout.at(block, 0), block);
  EXPECT_EQ(layout.at(block, 1), nullptr);
  EXPECT_EQ(layout.at(block, 2), block + 256);
}

TEST(Workspace, DefaultIsTheLayersOwn) {
  const Model a = testing::small_model("kimi-k2", GateLayout::none, 4, {70}, 1, 16, 31);
  Layer own(a.cfg, a.w, {.backend = Backend::cpu, .max_tokens = 4, .num_threads = 2});
  auto ws = std::make_shared<Workspace>();
  Layer shared(a.cfg, a.w, options(4, ws));
  EXPECT_EQ(step(own, a).out, step(shared, a).out);
  EXPECT_EQ(Workspace().bytes(), 0);
  EXPECT_EQ(Workspace().device(), Device::cpu);
}

}  // namespace
}  // namespace mla
