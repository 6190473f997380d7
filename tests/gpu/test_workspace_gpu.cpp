// mla::Workspace on the CUDA backend: layers sharing one produce what layers with their own do, bit
// for bit (outputs and cache), with steps of different layers interleaved, a larger layer
// constructed after a smaller one has run (the block grows and moves), and the steps of two layers
// captured in one CUDA graph and replayed; a CPU layer and a CUDA layer cannot share one. Without a
// GPU these tests skip.
#include <gtest/gtest.h>

#include <cstring>
#include <algorithm>
#include <memory>
#include <optional>

#include "gpu/gpu_test_util.hpp"
#include "mla/mla.hpp"

namespace mla {
namespace {

using Model = testing::SmallModel;

// A model's step inputs on the GPU and its output buffer.
struct StepRun {
  synth::Scenario dev;
  Tensor out;
};
StepRun inputs(const Model& m) {
  const synth::Scenario host = synth::make_scenario(m.spec, m.w.k_scale);
  StepRun r{synth::to_device(host), Tensor::empty(DType::bf16, {host.tokens(), int64_t(m.cfg.heads()) * m.cfg.v_head_dim},
                                              Device::cuda)};
  testing::poison(r.out);
  return r;
}
void run(Layer& layer, StepRun& r) { layer.step(r.dev.hidden, r.dev.meta(), r.dev.kv(), r.out); }
bool same(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to_host(), hb = b.to_host();
  return ha.bytes() == hb.bytes() && std::memcmp(ha.data(), hb.data(), ha.bytes()) == 0;
}

TEST(WorkspaceGpu, SharedByLayersMatchesTheirOwn) {
  MLA_SKIP_WITHOUT_GPU("the shared-workspace tests");
  // 12 heads with the flat plan (uneven), then 128 heads x qlen 2 (16 row tiles at B = 2): the larger second.
  const Model a = testing::small_model("kimi-k3", GateLayout::merged, 12, {900, 0, 130, 2000}, 1, 64, 41);
  const Model b = testing::small_model("deepseek-v3", GateLayout::none, 128, {1500, 700}, 2, 64, 42);
  auto opts = [](int max_tokens, std::shared_ptr<Workspace> ws) {
    return LayerOptions{.backend = Backend::cuda, .max_tokens = max_tokens, .workspace = std::move(ws)};
  };
  auto own_a = std::make_shared<Workspace>(), own_b = std::make_shared<Workspace>();
  Layer alone_a(a.cfg, a.w, opts(8, own_a)), alone_b(b.cfg, b.w, opts(8, own_b));
  StepRun want_a = inputs(a), want_b = inputs(b);
  run(alone_a, want_a);
  run(alone_b, want_b);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // (on the H200, session 33: a's 46.9 MB over b's 45.3 MB; the smaller one is constructed first)
  ASSERT_NE(own_b->bytes(), own_a->bytes());
  EXPECT_EQ(own_a->device(), Device::cuda);
  const bool a_first = own_a->bytes() < own_b->bytes();

  auto shared = std::make_shared<Workspace>();
  std::optional<Layer> la, lb;
  StepRun first_a = inputs(a), first_b = inputs(b);
  if (a_first) la.emplace(a.cfg, a.w, opts(8, shared)), run(*la, first_a);
  else lb.emplace(b.cfg, b.w, opts(8, shared)), run(*lb, first_b);
  // The larger one grows the block: the first layer's next step must find the new one.
  if (a_first) lb.emplace(b.cfg, b.w, opts(8, shared)), run(*lb, first_b);
  else la.emplace(a.cfg, a.w, opts(8, shared)), run(*la, first_a);
  EXPECT_EQ(shared->bytes(), std::max(own_a->bytes(), own_b->bytes()));
  StepRun got_b = inputs(b), got_a = inputs(a);
  run(*lb, got_b);
  run(*la, got_a);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cuda::take_device_errors(detail::backend_of(*la)), 0u);
  EXPECT_EQ(cuda::take_device_errors(detail::backend_of(*lb)), 0u);
  EXPECT_TRUE(same(first_a.out, want_a.out));
  EXPECT_TRUE(same(first_a.dev.cache, want_a.dev.cache));
  EXPECT_TRUE(same(first_b.out, want_b.out));
  EXPECT_TRUE(same(got_a.out, want_a.out)) << "after the workspace grew";
  EXPECT_TRUE(same(got_b.out, want_b.out)) << "after the workspace grew";
  EXPECT_TRUE(same(got_b.dev.cache, want_b.dev.cache));
}

TEST(WorkspaceGpu, TwoLayersInOneGraph) {
  MLA_SKIP_WITHOUT_GPU("the shared-workspace tests");
  const Model a = testing::small_model("kimi-k3", GateLayout::merged, 12, {640, 333}, 1, 64, 51);
  const Model b = testing::small_model("kimi-k3", GateLayout::merged, 12, {1000, 64}, 1, 64, 52);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto shared = std::make_shared<Workspace>();
  const LayerOptions opts{.backend = Backend::cuda, .max_tokens = 4, .cuda_stream = stream, .workspace = shared};
  const LayerOptions own{.backend = Backend::cuda, .max_tokens = 4, .cuda_stream = stream};
  Layer la(a.cfg, a.w, opts), lb(b.cfg, b.w, opts), ea(a.cfg, a.w, own), eb(b.cfg, b.w, own);
  StepRun ga = inputs(a), gb = inputs(b), wa = inputs(a), wb = inputs(b);
  run(la, ga);  // (cuBLASLt's algorithms chosen outside the capture)
  run(lb, gb);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ga = inputs(a), gb = inputs(b);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  run(la, ga);
  run(lb, gb);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  run(ea, wa);
  run(eb, wb);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(same(ga.out, wa.out));
  EXPECT_TRUE(same(gb.out, wb.out));
  EXPECT_TRUE(same(gb.dev.cache, wb.dev.cache));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(WorkspaceGpu, OneDeviceAWorkspace) {
  MLA_SKIP_WITHOUT_GPU("the shared-workspace tests");
  const Model a = testing::small_model("kimi-k2", GateLayout::none, 4, {100}, 1, 64, 61);
  auto shared = std::make_shared<Workspace>();
  Layer cpu(a.cfg, a.w, {.backend = Backend::cpu, .max_tokens = 2, .num_threads = 2, .workspace = shared});
  const std::string err = testing::error_of(
      [&] { Layer gpu(a.cfg, a.w, {.backend = Backend::cuda, .max_tokens = 2, .workspace = shared}); });
  EXPECT_NE(err.find("LayerOptions.workspace"), std::string::npos) << err;
  EXPECT_NE(err.find("cpu"), std::string::npos) << err;
  EXPECT_EQ(shared->device(), Device::cpu);
}

}  // namespace
}  // namespace mla
