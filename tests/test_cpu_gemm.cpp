// The CPU backend's dense products (src/cpu/gemm.hpp) on both paths, oneDNN bf16 and the
// OpenBLAS fallback, against a float64 product of the same bf16 values: odd shapes, strided
// activations and outputs (the output's row pad must survive), every row count a step can have
// at decode and prefill sizes, run-to-run bit identity, concurrent callers, and the
// MLA_CPU_GEMM=openblas switch, and the pre stage giving the same outputs on either path (the
// pre tests check the default path against float64).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/synthetic.hpp"
#include "cpu/gemm.hpp"
#include "mla/formats.hpp"
#include "mla/mla.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

using cpu::DenseMatrix;
using cpu::GemmPath;

const char* name(GemmPath p) { return p == GemmPath::onednn ? "onednn" : "openblas"; }

// Skips a oneDNN case on a build or CPU without it (the fallback's own cases still run).
#define SKIP_WITHOUT_ONEDNN(path)                                                   \
  if ((path) == GemmPath::onednn && cpu::choose_gemm_path() != GemmPath::onednn) \
  GTEST_SKIP() << "no oneDNN bf16 matmul in this build or on this CPU"

// A bf16 weight matrix b [n, k] and bf16-valued activations a [m, k] in a buffer of row stride
// lda, with a few large-magnitude entries so that cancellation shows ordering errors.
struct Operands {
  int64_t m, n, k, lda;
  std::vector<uint16_t> b;
  std::vector<float> a;
};

Operands random_operands(uint64_t seed, int64_t m, int64_t n, int64_t k, int64_t lda) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  Operands op{.m = m, .n = n, .k = k, .lda = lda, .b = std::vector<uint16_t>(size_t(n * k)),
              .a = std::vector<float>(size_t(m * lda), std::nanf(""))};  // NaN pad: must not be read
  for (auto& v : op.b) v = float_to_bf16(0.05f * normal(rng) * (unit(rng) < 0.01f ? 100.0f : 1.0f));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) op.a[size_t(i * lda + j)] = round_bf16(3.0f * normal(rng));
  return op;
}

// Runs c = a @ b^T into a buffer of row stride ldc whose pad holds a sentinel; checks every
// element against float64 within the fp32-accumulation bound and that the pad survived.
// Returns c's [m, n] values for further comparisons.
std::vector<float> check_product(const Operands& op, const DenseMatrix& matrix, int64_t ldc, int threads) {
  constexpr float kPad = -12345.0f;
  std::vector<float> c(size_t(op.m * ldc), kPad);
  matrix.multiply(op.a.data(), op.lda, op.m, c.data(), ldc, threads);
  std::vector<float> dense(size_t(op.m * op.n));
  double err_sq = 0, ref_sq = 0;
  int64_t over_bound = 0, pad_overwritten = 0;
  std::string first_miss;
  for (int64_t i = 0; i < op.m; ++i) {
    for (int64_t j = 0; j < op.n; ++j) {
      double ref = 0, magnitude = 0;
      for (int64_t l = 0; l < op.k; ++l) {
        const double t = double(op.a[size_t(i * op.lda + l)]) * double(bf16_to_float(op.b[size_t(j * op.k + l)]));
        ref += t;
        magnitude += std::fabs(t);
      }
      const float got = c[size_t(i * ldc + j)];
      dense[size_t(i * op.n + j)] = got;
      // fp32 accumulation in any order: |error| <= k * 2^-24 * sum |a_l b_l| (first order; the
      // bf16 x bf16 products are exact in fp32). NaN fails the comparison too.
      const double bound = (double(op.k) + 2.0) * 0x1p-24 * magnitude + 1e-30;
      if (!(std::fabs(double(got) - ref) <= bound) && over_bound++ == 0)
        first_miss = "c[" + std::to_string(i) + ", " + std::to_string(j) + "] = " + std::to_string(got) +
                     ", float64 " + std::to_string(ref) + ", bound " + std::to_string(bound);
      err_sq += (double(got) - ref) * (double(got) - ref);
      ref_sq += ref * ref;
    }
    for (int64_t j = op.n; j < ldc; ++j) pad_overwritten += c[size_t(i * ldc + j)] != kPad;
  }
  EXPECT_EQ(over_bound, 0) << "elements beyond the fp32 accumulation bound; first: " << first_miss;
  EXPECT_EQ(pad_overwritten, 0) << "elements of c's row pad overwritten";
  EXPECT_LE(std::sqrt(err_sq / std::max(ref_sq, 1e-300)), 1e-6) << "relative L2 error";
  return dense;
}

class DenseProduct : public ::testing::TestWithParam<GemmPath> {};

TEST_P(DenseProduct, MatchesFloat64AcrossShapesRowsAndStrides) {
  const GemmPath path = GetParam();
  SKIP_WITHOUT_ONEDNN(path);
  struct Shape {
    int64_t n, k;
  };
  // Odd n and k (oneDNN pads k to pairs and n to its blocks), a single element, and shapes like
  // the small test models' qkv_a / q_b.
  const Shape shapes[] = {{1, 1}, {7, 3}, {37, 101}, {130, 257}, {1795, 256}, {576, 128}};
  uint64_t seed = 100 + uint64_t(path);
  for (const Shape& s : shapes) {
    const DenseMatrix matrix(random_operands(seed, 1, s.n, s.k, s.k).b.data(), s.n, s.k, 2, path);
    ASSERT_EQ(matrix.path(), path);
    for (int64_t m : {1, 2, 3, 5, 8, 9, 33}) {
      const bool strided = m % 2 == 1;  // odd row counts: padded activation and output rows
      Operands op = random_operands(seed, m, s.n, s.k, strided ? s.k + 5 : s.k);
      op.b = random_operands(seed, 1, s.n, s.k, s.k).b;  // the matrix's weights
      SCOPED_TRACE(std::string(name(path)) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " m " +
                   std::to_string(m) + (strided ? " strided" : ""));
      check_product(op, matrix, strided ? s.n + 3 : s.n, 1 + int(m % 3));
    }
    ++seed;
  }
}

TEST_P(DenseProduct, PrefillRowCountsMatchFloat64) {
  const GemmPath path = GetParam();
  SKIP_WITHOUT_ONEDNN(path);
  const Operands op = random_operands(7 + uint64_t(path), 256, 96, 192, 192);
  const DenseMatrix matrix(op.b.data(), op.n, op.k, 2, path);
  check_product(op, matrix, op.n, 2);
}

TEST_P(DenseProduct, BitIdenticalRunToRunAndAcrossRebuilds) {
  const GemmPath path = GetParam();
  SKIP_WITHOUT_ONEDNN(path);
  const Operands op = random_operands(21 + uint64_t(path), 8, 300, 700, 700);
  const DenseMatrix matrix(op.b.data(), op.n, op.k, 2, path);
  const std::vector<float> first = check_product(op, matrix, op.n, 2);
  for (int rep = 0; rep < 3; ++rep) {
    const DenseMatrix again(op.b.data(), op.n, op.k, 2, path);
    const std::vector<float> reused = check_product(op, matrix, op.n, 2);
    const std::vector<float> rebuilt = check_product(op, again, op.n, 2);
    ASSERT_EQ(std::memcmp(first.data(), reused.data(), first.size() * sizeof(float)), 0) << "rep " << rep;
    ASSERT_EQ(std::memcmp(first.data(), rebuilt.data(), first.size() * sizeof(float)), 0) << "rep " << rep;
  }
}

// Several threads through one matrix at once (distinct row counts: each makes its primitive
// while others run theirs) give what each gives alone.
TEST_P(DenseProduct, ConcurrentCallersGetTheirOwnResults) {
  const GemmPath path = GetParam();
  SKIP_WITHOUT_ONEDNN(path);
  const Operands w = random_operands(31 + uint64_t(path), 1, 200, 320, 320);
  const DenseMatrix matrix(w.b.data(), w.n, w.k, 1, path);
  constexpr int kCallers = 4;
  std::vector<Operands> ops;
  std::vector<std::vector<float>> alone(kCallers), together(kCallers);
  for (int t = 0; t < kCallers; ++t) {
    ops.push_back(random_operands(40 + uint64_t(t), 1 + t, w.n, w.k, w.k));
    ops.back().b = w.b;
  }
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t)
    callers.emplace_back([&, t] {
      together[size_t(t)].assign(size_t(ops[size_t(t)].m * w.n), 0.0f);
      matrix.multiply(ops[size_t(t)].a.data(), w.k, ops[size_t(t)].m, together[size_t(t)].data(), w.n, 1);
    });
  for (auto& c : callers) c.join();
  for (int t = 0; t < kCallers; ++t) {
    alone[size_t(t)] = check_product(ops[size_t(t)], matrix, w.n, 1);
    EXPECT_EQ(std::memcmp(alone[size_t(t)].data(), together[size_t(t)].data(), alone[size_t(t)].size() * 4), 0)
        << "caller " << t;
  }
}

TEST_P(DenseProduct, NoRowsWritesNothing) {
  const GemmPath path = GetParam();
  SKIP_WITHOUT_ONEDNN(path);
  const Operands op = random_operands(51, 1, 16, 32, 32);
  const DenseMatrix matrix(op.b.data(), op.n, op.k, 1, path);
  std::vector<float> c(16, 7.0f);
  matrix.multiply(op.a.data(), op.k, 0, c.data(), op.n, 2);
  for (float v : c) EXPECT_EQ(v, 7.0f);
}

INSTANTIATE_TEST_SUITE_P(CpuGemm, DenseProduct, ::testing::Values(GemmPath::onednn, GemmPath::openblas),
                         [](const auto& info) { return std::string(name(info.param)); });

// Sets an environment variable for the scope, then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* key, const char* value) : key_(key) {
    if (const char* old = std::getenv(key)) old_ = old;
    ::setenv(key, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(key_, old_->c_str(), 1);
    } else {
      ::unsetenv(key_);
    }
  }

 private:
  const char* key_;
  std::optional<std::string> old_;
};

TEST(CpuGemmPath, EnvironmentForcesTheOpenBlasFallback) {
  const Operands op = random_operands(61, 4, 40, 64, 64);
  {
    const ScopedEnv env("MLA_CPU_GEMM", "openblas");
    EXPECT_EQ(cpu::choose_gemm_path(), GemmPath::openblas);
    const DenseMatrix matrix(op.b.data(), op.n, op.k, 1);
    EXPECT_EQ(matrix.path(), GemmPath::openblas);
    check_product(op, matrix, op.n, 1);
  }
  {
    const ScopedEnv env("MLA_CPU_GEMM", "auto");
    const DenseMatrix matrix(op.b.data(), op.n, op.k, 1);
    EXPECT_EQ(matrix.path(), cpu::choose_gemm_path());
  }
  // Asking for openblas needs no environment.
  EXPECT_EQ(cpu::choose_gemm_path(GemmPath::openblas), GemmPath::openblas);
}

// The two paths agree to within the fp32 accumulation bound on a decode-sized product shaped
// like a real qkv_a slice (both already match float64; this pins that both run here).
TEST(CpuGemmPath, BothPathsAgreeOnADecodeProduct) {
  if (cpu::choose_gemm_path() != GemmPath::onednn) GTEST_SKIP() << "no oneDNN bf16 matmul here";
  const Operands op = random_operands(71, 4, 256, 7168, 7168);
  const DenseMatrix fast(op.b.data(), op.n, op.k, 2, GemmPath::onednn);
  const DenseMatrix fallback(op.b.data(), op.n, op.k, 2, GemmPath::openblas);
  const std::vector<float> a = check_product(op, fast, op.n, 2), b = check_product(op, fallback, op.n, 2);
  double diff_sq = 0, ref_sq = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff_sq += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref_sq += double(b[i]) * b[i];
  }
  EXPECT_LE(std::sqrt(diff_sq / ref_sq), 1e-6);
}

// pre through a layer built with MLA_CPU_GEMM=openblas and through the default layer: the same
// query, gate and cache from the same step, up to the rare bf16 / fp8 rounding that the two
// summation orders put on different sides of a boundary (the pre tests' tolerances).
TEST(CpuGemmPath, PreAgreesOnBothPaths) {
  if (cpu::choose_gemm_path() != GemmPath::onednn) GTEST_SKIP() << "no oneDNN bf16 matmul here";
  const testing::RandomCaseLimits limits{.max_batch = 8, .max_context = 3000, .max_total_context = 6000};
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const testing::RandomCase rc = testing::random_case(3000 + seed, limits);
    SCOPED_TRACE(rc.describe());
    const LayerConfig& cfg = rc.spec.cfg;
    const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, seed * 31 + 5));
    const int64_t S = int64_t(rc.spec.seq_lens.size()) * rc.spec.qlen;
    const LayerOptions opts{.backend = Backend::cpu, .q_dtype = rc.q_dtype, .max_tokens = int(S)};
    struct Outputs {
      synth::Scenario sc;
      Tensor q, gate;
    };
    auto run_pre = [&](Layer& layer) {
      Outputs o{.sc = synth::make_scenario(rc.spec, w.k_scale),
                .q = Tensor::empty(rc.q_dtype, {S, cfg.heads(), cfg.row_dim()}),
                .gate = cfg.gate_dim() > 0 ? Tensor::empty(DType::bf16, {S, cfg.gate_dim()}) : Tensor()};
      layer.pre(o.sc.hidden, o.sc.meta(), o.sc.kv(), {.q = o.q.view(), .gate = o.gate.view()});
      return o;
    };
    Layer fast(cfg, w, opts);
    std::optional<Layer> fallback;
    {
      const ScopedEnv env("MLA_CPU_GEMM", "openblas");
      fallback.emplace(cfg, w, opts);
    }
    const Outputs a = run_pre(fast), b = run_pre(*fallback);
    // fp8 views compare as raw codes: the same scale on both sides.
    auto agree = [](const TensorView& got, const TensorView& other, const char* what) {
      const double tolerance = got.dtype == DType::fp8_e4m3 ? 1e-2 : 4e-3;
      const std::vector<double> ref = testing::to_doubles(other);
      const testing::Compare c = testing::compare(got, ref.data());
      EXPECT_TRUE(c.ok(tolerance)) << what << ": rel_l2 " << c.rel_l2 << " " << c.why;
    };
    agree(a.q.view(), b.q.view(), "query");
    if (cfg.gate_dim() > 0) agree(a.gate.view(), b.gate.view(), "gate");
    agree(a.sc.cache.view(), b.sc.cache.view(), "cache");  // NaN-filled tails: same places on both
  }
}

}  // namespace
}  // namespace mla
