#pragma once
// `mla run --dcp W [--interleave I]`: one synthetic step on W DCP ranks as threads (CPU, or one
// GPU with --backend cuda), each rank a TP rank with its own heads; with --check every rank's out
// is compared with the DCP-1 result of its weights on the same step and with the float64 reference.
#include <CLI/CLI.hpp>
#include <string>

#include "step_options.hpp"

namespace mla::cli {

struct DcpRunOptions {
  int size = 1;        // --dcp W
  int interleave = 1;  // --interleave I
};

void add_dcp_options(CLI::App& run, DcpRunOptions& o);
// Exit code: 0 ok, 1 a check failed.
int dcp_run_command(const StepOptions& step, const DcpRunOptions& dcp, bool check, const std::string& json);

}  // namespace mla::cli
