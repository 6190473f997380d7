#pragma once
// `mla run`: one synthetic decode step through the public Layer API, stage by stage.
#include <CLI/CLI.hpp>
#include <string>

#include "dcp_run.hpp"
#include "step_options.hpp"

namespace mla::cli {

struct RunOptions {
  StepOptions step;
  DcpRunOptions dcp;  // --dcp W > 1 runs tools/dcp_run.cpp instead
  bool check = false;
  std::string json;  // "" none, "-" stdout, else a file
  std::string dump;  // directory for --dump, "" none
  int repeat = 3;    // timed runs per stage (after one warm-up); the median is reported
};

void add_run_command(CLI::App& app, RunOptions& o);
// Exit code: 0 ok, 1 a check failed (mla::Error propagates to main, which exits 2).
int run_command(const RunOptions& o);

}  // namespace mla::cli
