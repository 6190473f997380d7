#pragma once
// `mla run --check`: every stage's outputs against the float64 reference from the same stage
// inputs (SPEC.md, Tolerances), and the step's output against the unabsorbed end-to-end reference.
#include <string>
#include <vector>

#include "step_options.hpp"

namespace mla::cli {

struct CheckRow {
  std::string stage;   // pre, attend, post, end_to_end
  std::string tensor;  // q, gate, cache_rows, o, lse, out
  std::string metric;  // rel_l2, max_abs
  double error = 0;
  double tolerance = 0;
  std::string why;     // non-empty: inf/NaN at different places (the row fails)
  bool ok() const { return why.empty() && error <= tolerance; }
};

// Host copies of the step's tensors, taken by `mla run` while it runs the stages.
struct StepSnapshot {
  Tensor cache_before;  // before pre (the history, NaN where pre writes)
  Tensor cache_after;   // after pre
  Tensor q, gate, o, lse, out;
};

StepSnapshot host_copies(const Step& step, Tensor cache_before);

std::vector<CheckRow> check_step(const Step& step, const StepSnapshot& snap);

// The table `mla run --check` prints.
std::string format_check_table(const std::vector<CheckRow>& rows);

}  // namespace mla::cli
