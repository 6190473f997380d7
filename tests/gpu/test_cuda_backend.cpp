// The CUDA backend against the CPU backend on the same inputs (SPEC.md tolerances), over the CPU
// tests' random configurations: presets and gate layouts, uneven batches with empty requests,
// qlen 1..8, page sizes 1/16/64 (steps also 8/32/128), shuffled page tables with NaN in unused pages and page tails,
// fp8/bf16 query and cache, head-padded queries, split partials. Outputs are poisoned before each
// call and must come back fully written. Whole steps, CUDA-graph capture and replay with new
// inputs, and device-side metadata errors (a bad slot is never written). Without a GPU every test
// skips with a message.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/backend.hpp"
#include "core/dcp_runner.hpp"
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

constexpr int kCases = 8;

testing::RandomCaseLimits limits() {
  testing::RandomCaseLimits lim;
  lim.max_batch = 12;
  lim.max_context = 3000;
  lim.max_total_context = 12000;
  return lim;
}

Tensor device_copy(const TensorView& host) {
  Tensor d = Tensor::empty(host.dtype, std::vector<int64_t>(host.shape.begin(), host.shape.begin() + host.rank),
                           Device::cuda);
  d.copy_from(host);
  return d;
}
// One random case: weights, the host scenario, and a CPU and a CUDA layer on the same weights.
struct Fixture {
  explicit Fixture(uint64_t seed, const testing::RandomCaseLimits& lim = limits())
      : rc(testing::random_case(seed, lim)),
        cfg(rc.spec.cfg),
        w(prepare_weights(cfg, random_checkpoint_weights(cfg, seed))),
        host(synth::make_scenario(rc.spec, w.k_scale)),
        cpu(cfg, w, options(Backend::cpu)),
        gpu(cfg, w, options(Backend::cuda)) {}

  LayerOptions options(Backend b) const {
    return {.backend = b,
            .q_dtype = rc.q_dtype,
            .max_tokens = std::max(1, host_tokens()),
            .num_splits = rc.num_splits,
            .q_head_pad = rc.q_head_pad,
            .num_threads = 2};
  }
  int host_tokens() const { return int(rc.spec.seq_lens.size()) * rc.spec.qlen; }
  int64_t g() const { return cfg.heads(); }
  int64_t hq() const { return rc.q_head_pad > 0 ? rc.q_head_pad : g(); }
  int64_t s() const { return host_tokens(); }
  int64_t nv() const { return int64_t(cfg.heads()) * cfg.v_head_dim; }

  testing::RandomCase rc;
  LayerConfig cfg;
  PreparedWeights w;
  synth::Scenario host;
  Layer cpu, gpu;
};

struct PreOut {
  Tensor q, gate;
  PreOutputs views() const { return {.q = q.view(), .gate = gate.view()}; }
};
PreOut make_pre_out(const Fixture& f, Device dev) {
  PreOut p;
  p.q = Tensor::empty(f.rc.q_dtype, {f.s(), f.hq(), 576}, dev);
  testing::poison(p.q);
  if (f.cfg.gate_dim() > 0) {
    p.gate = Tensor::empty(DType::bf16, {f.s(), f.cfg.gate_dim()}, dev);
    testing::poison(p.gate);
  }
  return p;
}

// pre on both backends from the same hidden states: the query, the cache rows, the gate.
void check_pre(Fixture& f) {
  synth::Scenario dev = synth::to_device(f.host);
  PreOut cpu_out = make_pre_out(f, Device::cpu), gpu_out = make_pre_out(f, Device::cuda);
  f.cpu.pre(f.host.hidden, f.host.meta(), f.host.kv(), cpu_out.views());
  f.gpu.pre(dev.hidden, dev.meta(), dev.kv(), gpu_out.views());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cuda::take_device_errors(detail::backend_of(f.gpu)), 0u);
  // Pad heads stay poisoned on both sides, so compare() also checks they were not written.
  expect_close(gpu_out.q.to_host(), cpu_out.q, 1e-2, "query");
  expect_close(dev.cache.to_host(), f.host.cache, 1e-2, "cache");
  if (f.cfg.gate_dim() > 0) expect_close(gpu_out.gate.to_host(), cpu_out.gate, 1e-2, "gate");
}

TEST(CudaBackend, PreMatchesCpu) {
  MLA_REQUIRE_GPU();
  for (int k = 0; k < kCases; ++k) {
    Fixture f(100 + k);
    SCOPED_TRACE(f.rc.describe());
    if (f.s() == 0) continue;
    check_pre(f);
  }
}

// attend and post from the CPU's pre outputs, so both backends see identical inputs; case k picks
// the output form.
void check_attend_post(Fixture& f, int k) {
  PreOut pre = make_pre_out(f, Device::cpu);
  f.cpu.pre(f.host.hidden, f.host.meta(), f.host.kv(), pre.views());
  synth::Scenario dev = synth::to_device(f.host);  // the cache now holds this step's rows
  Tensor q_dev = device_copy(pre.q);

  // Output forms: merged f32 / bf16, or split partials (f32).
  const int splits = f.rc.num_splits;
  const DType o_dtype = (k % 3 == 2) ? DType::bf16 : DType::f32;
  auto make_out = [&](Device d) {
    std::vector<int64_t> o_shape{f.s(), f.g(), 512}, lse_shape{f.s(), f.g()};
    if (splits > 1) {
      o_shape.insert(o_shape.begin(), splits);
      lse_shape.insert(lse_shape.begin(), splits);
    }
    std::pair<Tensor, Tensor> t{Tensor::empty(splits > 1 ? DType::f32 : o_dtype, o_shape, d),
                                Tensor::empty(DType::f32, lse_shape, d)};
    testing::poison(t.first);
    testing::poison(t.second);
    return t;
  };
  auto [cpu_o, cpu_lse] = make_out(Device::cpu);
  auto [gpu_o, gpu_lse] = make_out(Device::cuda);
  f.cpu.attend(pre.q, f.host.kv(), f.host.meta(), {cpu_o, cpu_lse});
  f.gpu.attend(q_dev, dev.kv(), dev.meta(), {gpu_o, gpu_lse});
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cuda::take_device_errors(detail::backend_of(f.gpu)), 0u);
  const Tensor gpu_o_host = gpu_o.to_host();
  EXPECT_EQ(testing::count_poison(gpu_o_host), 0);
  expect_close(gpu_o_host, cpu_o, cpu_o.view().dtype == DType::f32 ? 1e-4 : 1e-2, "attend o");
  testing::expect_lse_close(gpu_lse.to_host(), cpu_lse);

  // post from the CPU's attend outputs and gate.
  Tensor gate_dev = f.cfg.gate_dim() > 0 ? device_copy(pre.gate) : Tensor();
  Tensor o_dev = device_copy(cpu_o), lse_dev = device_copy(cpu_lse);
  Tensor cpu_out = Tensor::empty(DType::bf16, {f.s(), f.nv()});
  Tensor gpu_out = Tensor::empty(DType::bf16, {f.s(), f.nv()}, Device::cuda);
  testing::poison(gpu_out);
  f.cpu.post({cpu_o, cpu_lse}, pre.gate, f.host.meta(), cpu_out);
  f.gpu.post({o_dev, lse_dev}, gate_dev, dev.meta(), gpu_out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(gpu_out.to_host(), cpu_out, 1e-2, "post out");
}

TEST(CudaBackend, AttendAndPostMatchCpu) {
  MLA_REQUIRE_GPU();
  for (int k = 0; k < kCases; ++k) {
    Fixture f(200 + k);
    SCOPED_TRACE(f.rc.describe());
    if (f.s() == 0) continue;
    check_attend_post(f, k);
  }
}

// 16+ tokens: pre's W_UK and post's W_UV take the tensor-core kernels (mxfp4_mma.cuh) where the
// rows (tokens x heads) are many enough too (cuda::mma_products); the cases above reach them only
// where their batch and qlen happen to.
TEST(CudaBackend, ManyTokensMatchCpu) {
  MLA_REQUIRE_GPU();
  testing::RandomCaseLimits lim = limits();
  lim.small_model = false;  // the presets' heads: 32+ tokens x 12+ heads pass the rows rule
  lim.min_batch = 32;
  lim.max_batch = 40;
  lim.max_qlen = 2;
  lim.max_total_context = 8000;
  for (int k = 0; k < 4; ++k) {
    Fixture f(300 + k, lim);
    SCOPED_TRACE(f.rc.describe());
    ASSERT_GE(f.s(), cuda::kMmaProductsMinTokens);
    if (!cuda::mma_products(f.s(), f.cfg.heads()))  // (MLA_MMA_PRODUCTS_MIN says otherwise)
      std::printf("  case %d takes the CUDA-core products: %lld tokens x %d heads\n", k, (long long)f.s(),
                  f.cfg.heads());
    check_pre(f);
    check_attend_post(f, k);
  }
}

TEST(CudaBackend, StepMatchesCpu) {
  MLA_REQUIRE_GPU();
  testing::RandomCaseLimits decode = limits();  // S <= 4: pre's weight-streaming projections
  decode.max_batch = 2;
  decode.max_qlen = 2;
  decode.empty_fraction = 0;
  // The TMA box shapes beyond the random pages 1/16/64 (fp8: the wgmma kernel's TMA tiles): boxes
  // of 2, 4, 8 and 32 rows, one 64-row box inside a page of 128; and pages of 48 rows, which TMA
  // cannot box (cp.async tiles).
  testing::RandomCaseLimits boxes = limits();
  boxes.page_sizes = {2, 4, 8, 32, 128, 48};
  boxes.allow_bf16_q = boxes.allow_bf16_kv = false;
  for (int k = 0; k < kCases + 6; ++k) {
    Fixture f(300 + k, k < kCases ? limits() : k < kCases + 3 ? decode : boxes);
    SCOPED_TRACE(f.rc.describe());
    if (f.s() == 0) continue;
    synth::Scenario dev = synth::to_device(f.host);
    Tensor cpu_out = Tensor::empty(DType::bf16, {f.s(), f.nv()});
    Tensor gpu_out = Tensor::empty(DType::bf16, {f.s(), f.nv()}, Device::cuda);
    testing::poison(gpu_out);
    f.cpu.step(f.host.hidden, f.host.meta(), f.host.kv(), cpu_out);
    f.gpu.step(dev.hidden, dev.meta(), dev.kv(), gpu_out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cuda::take_device_errors(detail::backend_of(f.gpu)), 0u);
    expect_close(gpu_out.to_host(), cpu_out, 1e-2, "step out");
    expect_close(dev.cache.to_host(), f.host.cache, 1e-2, "cache after step");
  }
}

// The roofline ceilings `mla bench` and mla_graph_bench report run (no timing is asserted: only that
// each kernel and cuBLASLt call completes and yields a rate).
TEST(CudaBackend, CeilingsAreMeasured) {
  MLA_REQUIRE_GPU();
  const testing::RandomCase rc = testing::random_case(402, limits());
  const PreparedWeights w = prepare_weights(rc.spec.cfg, random_checkpoint_weights(rc.spec.cfg, 402));
  Layer layer(rc.spec.cfg, w, LayerOptions{.backend = Backend::cuda});
  const detail::Ceilings c = detail::backend_of(layer).measure_ceilings();
  EXPECT_FALSE(c.device_name.empty());
  EXPECT_GT(c.copy_gbps, 0.0);
  EXPECT_GT(c.read_rows_gbps, 0.0);
  EXPECT_GT(c.gather_rows_gbps, 0.0);
  EXPECT_GT(c.matmul_tflops, 0.0);
  EXPECT_NE(c.cache_flush.find("L2"), std::string::npos) << c.cache_flush;  // recorded with each benchmark
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The SM clock probe benchmarks record beside their times (no clock is asserted but that the probe
// reads a clock at all: an idle H200 sits at 345 MHz of its 1980, so above a twentieth of the peak and
// not past it: a wrong unit or an unmeasured 0 fails).
TEST(CudaBackend, SmClockIsMeasured) {
  MLA_REQUIRE_GPU();
  const testing::RandomCase rc = testing::random_case(403, limits());
  const PreparedWeights w = prepare_weights(rc.spec.cfg, random_checkpoint_weights(rc.spec.cfg, 403));
  Layer layer(rc.spec.cfg, w, LayerOptions{.backend = Backend::cuda});
  int peak_khz = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&peak_khz, cudaDevAttrClockRate, 0), cudaSuccess);
  const double mhz = detail::backend_of(layer).sm_clock_mhz();
  EXPECT_GT(mhz, 0.05 * peak_khz / 1e3);
  EXPECT_LT(mhz, 1.05 * peak_khz / 1e3);
}

// The same step twice gives bit-identical outputs; a graph captured on one step's buffers and
// replayed after new inputs are copied into them matches an eager step on those inputs.
TEST(CudaBackend, GraphReplayWithNewInputs) {
  MLA_REQUIRE_GPU();
  testing::RandomCaseLimits lim = limits();
  lim.empty_fraction = 0.2;
  testing::RandomCase rc = testing::random_case(400, lim);
  const LayerConfig& cfg = rc.spec.cfg;
  const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, 400));
  synth::ScenarioSpec spec_b = rc.spec;
  spec_b.seed = 401;  // same lengths and shapes, other hidden states, history and page order
  const synth::Scenario a = synth::make_scenario(rc.spec, w.k_scale), b = synth::make_scenario(spec_b, w.k_scale);
  const int64_t s = a.tokens(), nv = int64_t(cfg.heads()) * cfg.v_head_dim;
  ASSERT_GT(s, 0);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const LayerOptions opts{.backend = Backend::cuda, .q_dtype = rc.q_dtype, .max_tokens = int(s), .cuda_stream = stream};
  Layer layer(cfg, w, opts), eager(cfg, w, opts);

  synth::Scenario dev = synth::to_device(a);
  Tensor out = Tensor::empty(DType::bf16, {s, nv}, Device::cuda);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  layer.step(dev.hidden, dev.meta(), dev.kv(), out);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  // New inputs into the captured buffers, then replay.
  dev.hidden.copy_from(b.hidden);
  dev.kv_indptr.copy_from(b.kv_indptr);
  dev.kv_indices.copy_from(b.kv_indices);
  dev.slot_mapping.copy_from(b.slot_mapping);
  dev.cache.copy_from(b.cache);
  testing::poison(out);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor replayed = out.to_host(), replayed_cache = dev.cache.to_host();

  synth::Scenario dev_b = synth::to_device(b);
  Tensor eager_out = Tensor::empty(DType::bf16, {s, nv}, Device::cuda);
  eager.step(dev_b.hidden, dev_b.meta(), dev_b.kv(), eager_out);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor expected = eager_out.to_host(), expected_cache = dev_b.cache.to_host();
  EXPECT_EQ(std::memcmp(replayed.data(), expected.data(), replayed.bytes()), 0) << "graph replay != eager step";
  EXPECT_EQ(std::memcmp(replayed_cache.data(), expected_cache.data(), replayed_cache.bytes()), 0);

  // Replay again on the same inputs (the cache rows of this step are rewritten identically).
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor again = out.to_host();
  EXPECT_EQ(std::memcmp(again.data(), replayed.data(), again.bytes()), 0) << "replays differ: not deterministic";
  EXPECT_EQ(cuda::take_device_errors(detail::backend_of(layer)), 0u);

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Device-resident metadata the host cannot check: the kernels find it, write nothing, and the
// error comes back through take_device_errors / check_device_errors.
TEST(CudaBackend, BadDeviceMetadataIsReportedAndNotWritten) {
  MLA_REQUIRE_GPU();
  testing::RandomCaseLimits lim = limits();
  lim.empty_fraction = 0;
  lim.min_batch = 2;
  testing::RandomCase rc = testing::random_case(500, lim);
  const LayerConfig& cfg = rc.spec.cfg;
  const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, 500));
  const synth::Scenario host = synth::make_scenario(rc.spec, w.k_scale);
  const int64_t s = host.tokens(), nv = int64_t(cfg.heads()) * cfg.v_head_dim;
  Layer layer(cfg, w, {.backend = Backend::cuda, .max_tokens = int(s)});
  const int64_t num_slots = host.cache.view().shape[0] * host.cache.view().shape[1];
  const std::vector<int64_t> good(host.slot_mapping.ptr<int64_t>(), host.slot_mapping.ptr<int64_t>() + s);

  struct Bad {
    const char* what;
    std::vector<int64_t> slots;
    uint32_t bit;
  };
  std::vector<Bad> bad{{"slot past the cache", good, cuda::kBadSlot},
                       {"slot below -1", good, cuda::kBadSlot},
                       {"duplicate slot", good, cuda::kDuplicateSlot}};
  bad[0].slots[s - 1] = num_slots + 7;
  bad[1].slots[0] = -2;
  bad[2].slots[s - 1] = good[0];
  for (const Bad& c : bad) {
    SCOPED_TRACE(c.what);
    synth::Scenario dev = synth::to_device(host);
    dev.slot_mapping.copy_from(TensorView::contiguous(c.slots.data(), DType::i64, {s}));
    const std::vector<uint8_t> before = testing::snapshot(dev.cache);
    Tensor out = Tensor::empty(DType::bf16, {s, nv}, Device::cuda);
    layer.step(dev.hidden, dev.meta(), dev.kv(), out);  // enqueues; the host cannot see the values
    const uint32_t bits = cuda::take_device_errors(detail::backend_of(layer));
    EXPECT_TRUE(bits & c.bit) << "error bits " << bits << ": " << cuda::describe_device_errors(bits);
    EXPECT_EQ(testing::snapshot(dev.cache), before) << "a rejected step changed the cache";
  }

  // A page index outside the cache is never read: reported, and the outputs stay finite.
  synth::Scenario dev = synth::to_device(host);
  std::vector<int32_t> indices(host.kv_indices.ptr<int32_t>(), host.kv_indices.ptr<int32_t>() + host.kv_indices.view().numel());
  ASSERT_FALSE(indices.empty());
  indices[0] = int32_t(host.cache.view().shape[0]) + 3;
  dev.kv_indices.copy_from(TensorView::contiguous(indices.data(), DType::i32, {int64_t(indices.size())}));
  Tensor out = Tensor::empty(DType::bf16, {s, nv}, Device::cuda);
  layer.step(dev.hidden, dev.meta(), dev.kv(), out);
  EXPECT_NE(cuda::take_device_errors(detail::backend_of(layer)) & cuda::kBadPage, 0u);
  const std::vector<double> values = testing::to_doubles(out.to_host());
  for (double v : values) ASSERT_TRUE(std::isfinite(v));

  // After the error was taken, a good step runs clean and writes its rows.
  synth::Scenario clean = synth::to_device(host);
  const std::vector<uint8_t> before = testing::snapshot(clean.cache);
  layer.step(clean.hidden, clean.meta(), clean.kv(), out);
  EXPECT_NO_THROW(cuda::check_device_errors(detail::backend_of(layer)));
  EXPECT_NE(testing::snapshot(clean.cache), before);
}

TEST(CudaBackend, HostValidationRejectsBeforeLaunch) {
  MLA_REQUIRE_GPU();
  Fixture f(600);
  if (f.s() == 0) GTEST_SKIP() << "empty case";
  synth::Scenario dev = synth::to_device(f.host);
  const std::vector<uint8_t> before = testing::snapshot(dev.cache);
  // A host tensor handed to a CUDA layer: rejected by the host validation, nothing enqueued.
  Tensor out = Tensor::empty(DType::bf16, {f.s(), f.nv()}, Device::cuda);
  EXPECT_NE(testing::error_of([&] { f.gpu.step(f.host.hidden, dev.meta(), dev.kv(), out); }), "");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(testing::snapshot(dev.cache), before);
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// DCP on one GPU: W ranks as threads with a stream each (the one-GPU communicator); every rank's
// output and cache against the same W ranks on the CPU.
TEST(CudaBackend, DcpRanksMatchCpu) {
  MLA_REQUIRE_GPU();
  for (int k = 0; k < 3; ++k) {
    testing::RandomCaseLimits lim = limits();
    lim.dcp_size = k == 0 ? 2 : 4;
    lim.allow_bf16_q = false;
    lim.max_batch = 6;
    const testing::RandomCase rc = testing::random_case(700 + k, lim);
    SCOPED_TRACE(rc.describe());
    const LayerConfig& cfg = rc.spec.cfg;
    std::vector<PreparedWeights> weights;
    for (const CheckpointWeights& c : dcp::rank_checkpoints(cfg, 700 + k, lim.dcp_size))
      weights.push_back(prepare_weights(cfg, c));
    const LayerOptions opts{.num_splits = rc.num_splits};
    LayerOptions cpu_opts = opts, gpu_opts = opts;
    cpu_opts.backend = Backend::cpu;
    gpu_opts.backend = Backend::cuda;
    const auto cpu = dcp::run_ranks(weights, rc.spec, cpu_opts);
    const auto gpu = dcp::run_ranks(weights, rc.spec, gpu_opts);
    for (int r = 0; r < lim.dcp_size; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      if (cpu[r].out.view().numel() == 0) continue;
      expect_close(gpu[r].out, cpu[r].out, 1e-2, "out");
      expect_close(gpu[r].scenario.cache, cpu[r].scenario.cache, 1e-2, "cache");
    }
  }
}

}  // namespace
}  // namespace mla
