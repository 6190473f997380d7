#pragma once
// Helpers shared by the tests: poisoning, comparison metrics, random configurations.
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/synthetic.hpp"
#include "mla/config.hpp"
#include "mla/tensor.hpp"
#include "mla/weights.hpp"

namespace mla::testing {

// Fills a host or device tensor's bytes with a pattern that no stage writes (NaN for floats,
// 0xFF bytes otherwise), so "every element written" can be checked afterwards.
// Only the view's elements are touched: the pad of a strided view keeps its bytes.
void poison(const TensorView& t);
// True if any element still holds the poison pattern (host view).
bool has_poison(const TensorView& host);
// Number of elements still holding the poison pattern (host view).
int64_t count_poison(const TensorView& host);

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
// When ref is all zero, rel_l2 is the absolute L2 norm of a (0 iff a is all zero too).
// fp8 views are read as raw codes (no scale): multiply ref by 1/scale or compare dequantized copies.
Compare compare(const TensorView& a, const double* ref);

// Reads element i (row-major logical index) of a host view as double.
// Floats (bf16, f16, f32, f64, fp8 raw code) and integers (i32, i64, u8).
double element(const TensorView& host, int64_t i);
// All elements of a host view, row-major, as double.
std::vector<double> to_doubles(const TensorView& host);

// The bytes a view spans (first to last addressed element), copied to the host: for checking
// that a rejected call left a tensor (the KV cache) byte-identical. Works for device views too.
std::vector<uint8_t> snapshot(const TensorView& t);

// Runs fn; returns mla::Error's message, or "" when fn returned normally. Other exceptions pass.
std::string error_of(const std::function<void()>& fn);

// --- random configurations ------------------------------------------------------------------

// A preset shrunk for fast tests: hidden 256, q_lora_rank 128, heads_per_rank heads per rank
// (total_heads = heads_per_rank * tp_size), the given gate layout. L = 512, R = 64, P = 128,
// V = 128 stay (the kernels fix rows of 576; MXFP4 blocks need P, L multiples of 32).
LayerConfig small_config(std::string_view preset, GateLayout gate, int heads_per_rank);

// A small layer (small_config), its random weights, and one step's scenario over it: lens are the
// requests' global lengths (0: padding), pages of page_size rows.
struct SmallModel {
  LayerConfig cfg;
  PreparedWeights w;
  synth::ScenarioSpec spec;
};
SmallModel small_model(std::string_view preset, GateLayout gate, int heads, std::vector<int32_t> lens, int qlen,
                       int page_size, uint64_t seed);

struct RandomCaseLimits {
  int min_batch = 1, max_batch = 64;
  int max_context = 5000;          // longest request (global length)
  int64_t max_total_context = 60000;  // sum over requests; lengths are scaled down to fit
  double empty_fraction = 0.1;     // share of padding requests (seq_len 0)
  int max_qlen = 8;
  std::vector<int> page_sizes{1, 16, 64};
  bool small_model = true;         // small_config() dims; false: the real preset dims
  bool allow_bf16_q = true;        // bf16 query (only used at dcp.size 1)
  bool allow_bf16_kv = true;
  int dcp_size = 1;                // spec.dcp.size; rank and interleave are drawn
  std::vector<int> interleaves{1, 16, 64};
};

// One random step: preset, gate layout, odd head counts (small model), batch, uneven context
// lengths with empty and short (< page) requests, qlen, page size, kv/q dtypes, split count.
struct RandomCase {
  synth::ScenarioSpec spec;
  DType q_dtype = DType::fp8_e4m3;
  int num_splits = 1;   // 1..4: split-KV partials for tests that exercise them
  int q_head_pad = 0;   // 0 or > G: a head-padded query buffer
  std::string describe() const;  // one line for SCOPED_TRACE
};
RandomCase random_case(uint64_t seed, const RandomCaseLimits& limits = {});

}  // namespace mla::testing
