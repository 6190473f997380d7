#pragma once
// Runs one synthetic decode step on W DCP ranks as threads of this process: on the CPU (thread
// communicators) or on one GPU (the one-GPU multi-rank communicator, a stream per rank). Used by
// the tests and by `mla run --dcp W`. Each rank r is a tensor-parallel rank with its own N heads
// (its own q-side weights) but the same kv_a (the latent projection is replicated across TP
// ranks) and the same q_scale / k_scale, as in a real deployment.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/synthetic.hpp"
#include "mla/layer.hpp"

namespace mla::detail {
// An owned cudaStream_t on `device` as void* (src/cuda/comm; throws without CUDA), and a wait for it.
std::shared_ptr<void> make_rank_stream(int device);
void sync_rank_stream(void* stream, int device);
}  // namespace mla::detail

namespace mla::dcp {

// Checkpoints of W TP ranks of one DCP group: rank r's weights come from seed + r, except the
// kv_a and k_pe rows of qkv_a and the scales, which are rank 0's on every rank.
std::vector<CheckpointWeights> rank_checkpoints(const LayerConfig& cfg, uint64_t seed, int size);

struct RankResult {
  synth::Scenario scenario;  // host: this rank's step inputs; its cache as the step left it
  Tensor out;                // host [S, N*V] bf16
};

// One step on spec.dcp.size ranks (spec.dcp.rank is ignored; rank r's scenario has rank r):
// weights[r] is rank r's; opts.backend picks CPU threads or one GPU (opts.cuda_device). opts.dcp
// and opts.comm are set here; opts.num_threads = 0 shares the cores among the ranks. Every
// rank's exception is rethrown (the first by rank) after all threads have stopped.
std::vector<RankResult> run_ranks(std::span<const PreparedWeights> weights, const synth::ScenarioSpec& spec,
                                  LayerOptions opts);

}  // namespace mla::dcp
