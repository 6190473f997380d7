#pragma once
// Helpers shared by the tests: poisoning, comparison metrics, random configurations.
#include <cstdint>
#include <random>
#include <string>

#include "mla/tensor.hpp"

namespace mla::testing {

// Fills a host or device tensor's bytes with a pattern that no stage writes (NaN for floats,
// 0xFF bytes otherwise), so "every element written" can be checked afterwards.
void poison(const TensorView& t);
// True if any element still holds the poison pattern (host view).
bool has_poison(const TensorView& host);

// Relative L2 error ||a - ref|| / ||ref|| over finite entries, after checking that non-finite
// values (inf, NaN) sit at exactly the same places with the same value; on mismatch returns +inf
// and writes where into *why.
struct Compare {
  double rel_l2 = 0;
  double max_abs = 0;
  std::string why;  // empty when inf/NaN positions agree
  bool ok(double tol) const { return why.empty() && rel_l2 <= tol; }
};
// a: host view of any float dtype; ref: float64 values, same logical shape, contiguous.
Compare compare(const TensorView& a, const double* ref);

// Reads element i (row-major logical index) of a host view as double.
double element(const TensorView& host, int64_t i);

}  // namespace mla::testing
