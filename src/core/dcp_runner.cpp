// W DCP ranks as threads over one synthetic step (dcp_runner.hpp).
#include "core/dcp_runner.hpp"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <string>
#include <thread>

#include "mla/comm.hpp"
#include "mla/error.hpp"

namespace mla::dcp {

std::vector<CheckpointWeights> rank_checkpoints(const LayerConfig& cfg, uint64_t seed, int size) {
  MLA_REQUIRE(size >= 1, "rank_checkpoints: size expected >= 1, got ", size);
  std::vector<CheckpointWeights> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(random_checkpoint_weights(cfg, seed + uint64_t(r)));
  // qkv_a rows [Rq, Rq + L + R) make the cache row: identical on every TP rank.
  const size_t first = size_t(cfg.q_lora_rank) * cfg.hidden;
  const size_t count = size_t(cfg.kv_lora_rank + cfg.qk_rope_dim) * cfg.hidden;
  for (int r = 1; r < size; ++r) {
    std::copy_n(ranks[0].qkv_a.begin() + first, count, ranks[r].qkv_a.begin() + first);
    ranks[r].kv_a_norm = ranks[0].kv_a_norm;
    ranks[r].q_scale = ranks[0].q_scale;
    ranks[r].k_scale = ranks[0].k_scale;
  }
  return ranks;
}

std::vector<RankResult> run_ranks(std::span<const PreparedWeights> weights, const synth::ScenarioSpec& spec,
                                  LayerOptions opts) {
  const int w = spec.dcp.size;
  MLA_REQUIRE(int(weights.size()) == w, "run_ranks: expected ", w, " ranks' weights, got ", weights.size());
  Backend backend = opts.backend;
  if (backend == Backend::automatic) backend = cuda_available() ? Backend::cuda : Backend::cpu;
  opts.backend = backend;
  const bool cuda = backend == Backend::cuda;
  if (!cuda && opts.num_threads == 0) opts.num_threads = std::max(1, omp_get_num_procs() / w);
  opts.max_tokens = std::max<int>(opts.max_tokens, int(spec.seq_lens.size()) * spec.qlen);

  std::vector<RankResult> results(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    synth::ScenarioSpec rs = spec;
    rs.dcp.rank = r;
    results[r].scenario = synth::make_scenario(rs, weights[r].k_scale);
  }
  auto comms = cuda ? make_cuda_thread_group(w, opts.cuda_device) : make_thread_group(w);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      try {
        LayerOptions ro = opts;
        ro.workspace = nullptr;  // (the ranks step at once: each its own)
        ro.dcp = {.size = w, .rank = r, .interleave = spec.dcp.interleave};
        ro.comm = comms[r].get();
        std::shared_ptr<void> stream;
        if (cuda) {
          stream = detail::make_rank_stream(opts.cuda_device);
          ro.cuda_stream = stream.get();
        }
        Layer layer(spec.cfg, weights[r], ro);
        RankResult& res = results[r];
        const int64_t s = res.scenario.tokens(), nv = int64_t(spec.cfg.heads()) * spec.cfg.v_head_dim;
        if (cuda) {
          const synth::Scenario dev = synth::to_device(res.scenario, opts.cuda_device);
          Tensor out = Tensor::empty(DType::bf16, {s, nv}, Device::cuda, opts.cuda_device);
          layer.step(dev.hidden, dev.meta(), dev.kv(), out);
          detail::sync_rank_stream(stream.get(), opts.cuda_device);
          res.out = out.to_host();
          res.scenario.cache = dev.cache.to_host();
        } else {
          res.out = Tensor::empty(DType::bf16, {s, nv});
          layer.step(res.scenario.hidden, res.scenario.meta(), res.scenario.kv(), res.out);
        }
      } catch (...) {
        errors[r] = std::current_exception();
        abort_thread_group(*comms[r]);  // peers waiting in a collective for this rank throw too
      }
    });
  }
  for (auto& t : threads) t.join();
  // The first failing rank's own error explains the others' "aborted" ones.
  for (int r = 0; r < w; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      if (std::string(e.what()).find("aborted") == std::string::npos) throw;
    }
  }
  for (int r = 0; r < w; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
  return results;
}

}  // namespace mla::dcp
