#pragma once
// `mla bench`: per stage and whole step, µs (median of many runs, caches flushed), GB/s and TFLOP/s
// from explicit byte and FLOP formulas, and the percentage of the ceilings measured in the same run.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "step_options.hpp"

namespace mla::cli {

struct BenchOptions {
  StepOptions step;
  int warmup = 3;
  int iters = 20;
  bool sweep = false;
  std::vector<int> batches{1, 8, 32};
  std::vector<int> contexts{1024, 4096, 16384};
  std::vector<int> qlens{1, 4};
  std::vector<int> heads;  // empty: the preset's (or --heads)
  std::string json;        // file ("-": stdout), "" none
};

void add_bench_command(CLI::App& app, BenchOptions& o);
int bench_command(const BenchOptions& o);

// The bytes a stage must move and the FLOPs it must do, written out explicitly.
struct Work {
  double bytes = 0;
  double flops = 0;
};
struct StepWork {
  Work pre, attend, post, step;
  // attend.flops by instruction: the 576-long scores (bf16 dot products where the CPU has them)
  // and the 512-long P.V updates (fp32 FMA), for the compute roof.
  double attend_qk_flops = 0, attend_pv_flops = 0;
};
StepWork step_work(const Step& st);

}  // namespace mla::cli
