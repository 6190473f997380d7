#pragma once
// DCP inside the library: the checks that every rank runs the same step, shared by the backends.
#include <string>
#include <vector>

#include "mla/comm.hpp"
#include "mla/dcp.hpp"
#include "mla/error.hpp"
#include "mla/layer.hpp"

namespace mla::detail {

// Checks opts.dcp against cfg (dcp::validate) and, for W > 1, the communicator: present, of
// size W and rank dcp.rank, on the layer's device. Throws mla::Error naming the field.
void validate_dcp_options(const LayerConfig& cfg, const LayerOptions& opts, Device layer_device);

// A collective check that every rank of opts.comm runs the same step (S, qlen, B and seq_lens,
// where seq_lens are readable on the host: a host tensor or meta.seq_lens_host) and that every
// rank's own validation passed. `local_error` is this rank's validation failure ("" when none).
// Throws mla::Error on EVERY rank when any rank failed or the ranks disagree, so no rank writes
// its cache and none waits forever in a later collective. A no-op at W = 1.
void check_step_agreement(const LayerOptions& opts, const StepMeta& meta, const std::string& local_error);

// Runs this rank's validation `validate()` and then, at W > 1, check_step_agreement with its
// outcome: every rank throws if any rank's validation failed or the ranks disagree. Layer calls
// it before a stage that writes (pre, step).
template <class Validate>
void validate_on_every_rank(const LayerOptions& opts, const StepMeta& meta, Validate validate) {
  if (opts.dcp.size == 1) {
    validate();
    return;
  }
  std::string error;
  try {
    validate();
  } catch (const Error& e) {
    error = e.what();
    if (error.empty()) error = "validation failed";
  }
  check_step_agreement(opts, meta, error);
}

// pre's step 8, shared by the backends: all-gathers the query in place along heads. q [S, Hq, 576]
// holds this rank's N heads at rank*N; afterwards rank q's heads are at q*N on every rank. The
// heads of a token must be packed (q.stride[1] == 576, q.stride[2] == 1); the row stride may span
// a head pad. `stream` is the backend's (cudaStream_t as void*; ignored on the CPU).
void gather_query(const LayerConfig& cfg, const LayerOptions& opts, const TensorView& q, void* stream);

// post's combine exchange (SPEC.md post 1), shared by the backends: every rank sends peer p the
// partials of p's N heads, so that `mine` receives [W*splits, S, N, L] o and [W*splits, S, N]
// lse of this rank's heads (block q from rank q), the split-partials form post merges with
// merge_partials (softmax_state.hpp): one merge for splits and ranks. attn is [S, G, L] / [S, G]
// (splits = 1) or [splits, S, G, L] / [splits, S, G]; mine must be contiguous, o of attn's dtype.
void exchange_partials(const LayerConfig& cfg, const LayerOptions& opts, const AttendOutputs& attn,
                       const AttendOutputs& mine, void* stream);
// The shapes of exchange_partials' destination: {W*splits, S, N, L} and {W*splits, S, N}.
std::vector<int64_t> exchanged_o_shape(const LayerConfig& cfg, const LayerOptions& opts, const TensorView& attn_o);
std::vector<int64_t> exchanged_lse_shape(const LayerConfig& cfg, const LayerOptions& opts, const TensorView& attn_o);

}  // namespace mla::detail
