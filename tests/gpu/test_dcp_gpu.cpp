// DCP on the GPU: the one-GPU multi-rank communicator (W ranks as threads, a stream each, on one
// device) moving strided device slabs; NCCL with one rank per GPU where there are several (and a
// single-rank NCCL communicator where there is one, which still runs the pack/unpack paths); the
// whole layer at W > 1 on one GPU against the CPU DCP-1 result. Without a GPU every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "core/dcp_runner.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/comm.hpp"
#include "mla/mla.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

#define MLA_REQUIRE_GPU() MLA_SKIP_WITHOUT_GPU("the DCP GPU tests")

// Byte (r, i, k) of rank r's send slab: distinct across ranks, rows and columns.
uint8_t pattern(int r, int i, int k) { return uint8_t(r * 37 + i * 11 + k * 3 + 1); }

// Each rank on its own thread and stream: gathers a strided slab into a padded destination, then
// all-to-alls a second slab, and checks both on the host. `make` makes the W communicators.
void exercise(std::vector<std::unique_ptr<Communicator>>& comms, std::vector<int> devices) {
  const int w = int(comms.size());
  const int rows = 7, chunk = 96, send_stride = chunk + 32, recv_stride = w * chunk + 64;
  const int a2a_send_stride = w * chunk + 16, block_stride = rows * chunk + 128;
  std::vector<std::string> errors(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      try {
        MLA_REQUIRE(cudaSetDevice(devices[r]) == cudaSuccess, "cudaSetDevice");
        cudaStream_t s;
        MLA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
        std::vector<uint8_t> send(rows * send_stride), a2a(rows * a2a_send_stride);
        for (int i = 0; i < rows; ++i)
          for (int k = 0; k < chunk; ++k) send[i * send_stride + k] = pattern(r, i, k);
        for (int i = 0; i < rows; ++i)
          for (int p = 0; p < w; ++p)
            for (int k = 0; k < chunk; ++k) a2a[i * a2a_send_stride + p * chunk + k] = pattern(r, i, p * chunk + k);
        void *d_send, *d_recv, *d_a2a, *d_blocks;
        MLA_REQUIRE(cudaMalloc(&d_send, send.size()) == cudaSuccess && cudaMalloc(&d_recv, rows * recv_stride) == cudaSuccess &&
                        cudaMalloc(&d_a2a, a2a.size()) == cudaSuccess && cudaMalloc(&d_blocks, w * block_stride) == cudaSuccess,
                    "cudaMalloc");
        cudaMemcpy(d_send, send.data(), send.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(d_a2a, a2a.data(), a2a.size(), cudaMemcpyHostToDevice);
        cudaMemset(d_recv, 0xEE, rows * recv_stride);
        cudaMemset(d_blocks, 0xEE, w * block_stride);
        cudaDeviceSynchronize();
        for (int rep = 0; rep < 3; ++rep) {  // repeated: the events are re-recorded safely
          comms[r]->all_gather_rows({.send = d_send, .send_stride = send_stride, .recv = d_recv,
                                     .recv_stride = recv_stride, .rows = rows, .chunk_bytes = chunk},
                                    s);
          comms[r]->all_to_all_rows({.send = d_a2a, .send_stride = a2a_send_stride, .recv = d_blocks,
                                     .recv_block_stride = block_stride, .recv_stride = chunk, .rows = rows,
                                     .chunk_bytes = chunk},
                                    s);
        }
        std::vector<uint8_t> recv(rows * recv_stride), blocks(w * block_stride);
        MLA_REQUIRE(cudaStreamSynchronize(s) == cudaSuccess, "sync");
        cudaMemcpy(recv.data(), d_recv, recv.size(), cudaMemcpyDeviceToHost);
        cudaMemcpy(blocks.data(), d_blocks, blocks.size(), cudaMemcpyDeviceToHost);
        for (int i = 0; i < rows; ++i) {
          for (int q = 0; q < w; ++q)
            for (int k = 0; k < chunk; ++k)
              MLA_REQUIRE(recv[i * recv_stride + q * chunk + k] == pattern(q, i, k), "all_gather_rows: rank ", r,
                          " row ", i, " from rank ", q, " byte ", k);
          for (int k = w * chunk; k < recv_stride; ++k)
            MLA_REQUIRE(recv[i * recv_stride + k] == 0xEE, "all_gather_rows wrote the pad");
        }
        for (int q = 0; q < w; ++q)
          for (int i = 0; i < rows; ++i)
            for (int k = 0; k < chunk; ++k)
              MLA_REQUIRE(blocks[q * block_stride + i * chunk + k] == pattern(q, i, r * chunk + k), "all_to_all_rows: rank ",
                          r, " block ", q, " row ", i, " byte ", k);
        cudaFree(d_send), cudaFree(d_recv), cudaFree(d_a2a), cudaFree(d_blocks);
        cudaStreamDestroy(s);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        abort_thread_group(*comms[r]);
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < w; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DcpGpu, OneGpuCommunicatorMovesStridedSlabs) {
  MLA_REQUIRE_GPU();
  for (int w : {1, 2, 4, 8}) {
    SCOPED_TRACE("W=" + std::to_string(w));
    auto comms = make_cuda_thread_group(w, 0);
    exercise(comms, std::vector<int>(w, 0));
  }
}

TEST(DcpGpu, NcclOneRankPerGpu) {
  MLA_REQUIRE_GPU();
  int count = 0;
  cudaGetDeviceCount(&count);
  const int w = std::min(count, 8);
  std::vector<std::unique_ptr<Communicator>> comms(w);
  NcclId id;
  const std::string e = testing::error_of([&] { id = nccl_unique_id(); });
  if (e.find("no NCCL") != std::string::npos) GTEST_SKIP() << e;
  ASSERT_EQ(e, "");
  std::vector<std::string> errors(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)  // ncclCommInitRank blocks until all ranks join: one thread each
    threads.emplace_back([&, r] { errors[r] = testing::error_of([&] { comms[r] = make_nccl_communicator(id, r, w, r, 1 << 20); }); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < w; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  std::vector<int> devices(w);
  for (int r = 0; r < w; ++r) devices[r] = r;
  exercise(comms, devices);
}

// The NCCL collectives captured into a CUDA graph (issue 6 captures whole W > 1 steps): capture
// succeeds only if nothing is allocated or synchronized; replays see new inputs; can_block() is
// false while capturing (the layer then skips its blocking step check). One rank per GPU present.
TEST(DcpGpu, NcclCollectivesCaptureIntoACudaGraph) {
  MLA_REQUIRE_GPU();
  int count = 0;
  cudaGetDeviceCount(&count);
  const int w = std::min(count, 8);
  NcclId id;
  const std::string e = testing::error_of([&] { id = nccl_unique_id(); });
  if (e.find("no NCCL") != std::string::npos) GTEST_SKIP() << e;
  std::vector<std::string> errors(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      errors[r] = testing::error_of([&] {
        auto comm = make_nccl_communicator(id, r, w, r, 1 << 20);
        MLA_REQUIRE(cudaSetDevice(r) == cudaSuccess, "cudaSetDevice");
        const int rows = 5, chunk = 64, stride = w * chunk + 16;
        cudaStream_t s;
        MLA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
        void *d_q, *d_send, *d_recv;
        MLA_REQUIRE(cudaMalloc(&d_q, rows * stride) == cudaSuccess && cudaMalloc(&d_send, rows * stride) == cudaSuccess &&
                        cudaMalloc(&d_recv, w * rows * chunk) == cudaSuccess,
                    "cudaMalloc");
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        MLA_REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
        const bool blocked = comm->can_block(s);
        // In place, like pre's query gather; then the combine's exchange.
        comm->all_gather_rows({.send = static_cast<char*>(d_q) + r * chunk, .send_stride = stride, .recv = d_q,
                               .recv_stride = stride, .rows = rows, .chunk_bytes = chunk},
                              s);
        comm->all_to_all_rows({.send = d_send, .send_stride = stride, .recv = d_recv, .recv_block_stride = rows * chunk,
                               .recv_stride = chunk, .rows = rows, .chunk_bytes = chunk},
                              s);
        MLA_REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end capture");
        MLA_REQUIRE(!blocked, "can_block() is true while the stream is capturing");
        MLA_REQUIRE(comm->can_block(s), "can_block() is false after the capture");
        MLA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
        for (int replay = 0; replay < 2; ++replay) {
          std::vector<uint8_t> q(rows * stride, 0xEE), send(rows * stride);
          for (int i = 0; i < rows; ++i)
            for (int k = 0; k < chunk; ++k) q[i * stride + r * chunk + k] = pattern(r + replay, i, k);
          for (int i = 0; i < rows; ++i)
            for (int k = 0; k < w * chunk; ++k) send[i * stride + k] = pattern(r + 2 * replay, i, k);
          cudaMemcpy(d_q, q.data(), q.size(), cudaMemcpyHostToDevice);
          cudaMemcpy(d_send, send.data(), send.size(), cudaMemcpyHostToDevice);
          MLA_REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess, "replay");
          std::vector<uint8_t> blocks(w * rows * chunk);
          cudaMemcpy(q.data(), d_q, q.size(), cudaMemcpyDeviceToHost);
          cudaMemcpy(blocks.data(), d_recv, blocks.size(), cudaMemcpyDeviceToHost);
          for (int i = 0; i < rows; ++i)
            for (int p = 0; p < w; ++p)
              for (int k = 0; k < chunk; ++k) {
                MLA_REQUIRE(q[i * stride + p * chunk + k] == pattern(p + replay, i, k), "replay ", replay, ": gather");
                MLA_REQUIRE(blocks[(p * rows + i) * chunk + k] == pattern(p + 2 * replay, i, r * chunk + k), "replay ",
                            replay, ": all_to_all");
              }
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaFree(d_q), cudaFree(d_send), cudaFree(d_recv);
        cudaStreamDestroy(s);
      });
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < w; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The layer at W > 1 on one GPU (ranks as threads) against the CPU DCP-1 result of each rank's
// weights on the same step.
TEST(DcpGpu, LayerOnOneGpuMatchesCpuDcp1) {
  MLA_REQUIRE_GPU();
  const LayerConfig cfg = testing::small_config("deepseek-v3", GateLayout::none, 3);
  for (int w : {2, 4, 8}) {
    for (int il : {1, 64}) {
      SCOPED_TRACE("W=" + std::to_string(w) + " I=" + std::to_string(il));
      std::vector<PreparedWeights> weights;
      for (const auto& ck : dcp::rank_checkpoints(cfg, 40 + w, w)) weights.push_back(prepare_weights(cfg, ck));
      const int wi = w * il;
      synth::ScenarioSpec spec{.cfg = cfg, .seq_lens = {0, 4, wi / 2 + 4, 3 * wi + 9, 2000}, .qlen = 4,
                               .page_size = 16, .dcp = {.size = w, .rank = 0, .interleave = il}, .seed = 9};
      std::vector<dcp::RankResult> ranks;
      const std::string e = testing::error_of(
          [&] { ranks = dcp::run_ranks(weights, spec, {.backend = Backend::cuda, .num_splits = 2}); });
      if (e.find("not implemented") != std::string::npos) GTEST_SKIP() << e;
      ASSERT_EQ(e, "");
      for (int r = 0; r < w; ++r) {
        synth::ScenarioSpec one = spec;
        one.dcp = {};
        const synth::Scenario sc = synth::make_scenario(one, weights[r].k_scale);
        Layer layer(cfg, weights[r], {.backend = Backend::cpu});
        Tensor want = Tensor::empty(DType::bf16, {sc.tokens(), int64_t(cfg.heads()) * cfg.v_head_dim});
        layer.step(sc.hidden, sc.meta(), sc.kv(), want);
        const std::vector<double> want_d = testing::to_doubles(want);
        const testing::Compare c = testing::compare(ranks[r].out, want_d.data());
        EXPECT_TRUE(c.ok(1e-2)) << "rank " << r << ": rel_l2 " << c.rel_l2 << " " << c.why;
      }
    }
  }
}

}  // namespace
}  // namespace mla
