#pragma once
// DCP inside the library: the checks that every rank runs the same step, shared by the backends.
#include <string>

#include "mla/comm.hpp"
#include "mla/dcp.hpp"
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

}  // namespace mla::detail
