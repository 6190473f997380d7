#pragma once
// Synthetic decode steps: random hidden states, a KV history of given lengths in a paged cache
// with a shuffled page table, unused pages and page tails filled with NaN. Used by `mla run`,
// `mla bench` and the tests. Everything lives on the host; to_device() copies it to a GPU.
#include <cstdint>
#include <vector>

#include "mla/layer.hpp"

namespace mla::synth {

struct ScenarioSpec {
  LayerConfig cfg;
  // Global context length of each request, including this step's qlen tokens; 0 marks an empty
  // (padding) request, whose tokens have slot -1 and whose outputs are o = 0, lse = -inf.
  std::vector<int32_t> seq_lens;
  int qlen = 1;
  int page_size = 64;
  DType kv_dtype = DType::fp8_e4m3;
  DcpInfo dcp{};              // the cache and page table hold rank dcp.rank's rows only
  bool shuffle_pages = true;  // page table in random order
  int spare_pages = 3;        // unused pages in the cache (NaN-filled)
  bool nan_fill = true;       // NaN in unused pages, page tails and this step's (unwritten) rows
  uint64_t seed = 1;
};

// Host tensors of one step. The history rows (positions < seq_len - qlen) are random rows shaped
// like [rmsnorm'd kv_c | k_pe], quantized with the weights' k_scale for an fp8 cache; the rows of
// this step's tokens are left for pre to write. A row's values depend only on (seed, request,
// position): the W ranks' scenarios of one spec hold exactly the rows of its W = 1 scenario.
struct Scenario {
  ScenarioSpec spec;
  Tensor hidden;        // [S, D] bf16, unit-RMS rows like input_layernorm's output
  Tensor seq_lens;      // [B] i32
  Tensor kv_indptr;     // [B+1] i32
  Tensor kv_indices;    // [nnz] i32
  Tensor slot_mapping;  // [S] i64
  Tensor cache;         // [num_pages, page_size, L+R]
  std::vector<int32_t> seq_lens_host;

  StepMeta meta() const;
  KVCache kv() const;
  int tokens() const { return int(spec.seq_lens.size()) * spec.qlen; }
};

Scenario make_scenario(const ScenarioSpec& spec, float k_scale);
// The same step with every tensor on CUDA device `device_index`.
Scenario to_device(const Scenario& host, int device_index = 0);

}  // namespace mla::synth
