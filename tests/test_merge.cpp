// The online-softmax state and the merge of normalized partials (src/core/softmax_state.hpp)
// against float64 softmax and ref::merge: -inf partials add nothing (whatever their o holds), all
// empty gives o = 0 and lse = -inf, and the merge does not depend on the partials' order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/softmax_state.hpp"
#include "mla/formats.hpp"
#include "reference/reference.hpp"

namespace mla {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Normalized float64 softmax of scores over value rows [n, len]: o [len], returns lse.
double softmax64(const std::vector<double>& scores, const std::vector<double>& values, int len,
                 std::vector<double>& o) {
  o.assign(len, 0.0);
  double m = -kInf;
  for (double s : scores) m = std::max(m, s);
  if (m == -kInf) return -kInf;
  double sum = 0;
  for (double s : scores) sum += std::exp(s - m);
  for (size_t j = 0; j < scores.size(); ++j)
    for (int l = 0; l < len; ++l) o[l] += std::exp(scores[j] - m) / sum * values[j * len + l];
  return m + std::log(sum);
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& ref) {
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    d2 += (a[i] - ref[i]) * (a[i] - ref[i]);
    r2 += ref[i] * ref[i];
  }
  return r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
}

// Random normalized partials [n][rows] with lse spread over `spread`; each partial is empty
// (lse = -inf, o = NaN garbage) with probability p_empty.
std::vector<ref::AttendResult> random_partials(std::mt19937_64& rng, int n, int rows, int len, double spread,
                                               double p_empty) {
  std::normal_distribution<double> normal(0, 1);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<ref::AttendResult> parts(n);
  for (ref::AttendResult& p : parts) {
    p.o.resize(size_t(rows) * len);
    p.lse.resize(rows);
    for (int r = 0; r < rows; ++r) {
      const bool empty = unit(rng) < p_empty;
      p.lse[r] = empty ? -kInf : spread * normal(rng);
      for (int l = 0; l < len; ++l)
        p.o[size_t(r) * len + l] = empty ? std::numeric_limits<double>::quiet_NaN() : normal(rng);
    }
  }
  return parts;
}

// merge_partials over partials stored [n][rows][len] / [n][rows] in float, row r.
float merge_row(const std::vector<ref::AttendResult>& parts, int r, int rows, int len, std::vector<float>& out,
                const std::vector<int>& order) {
  const int n = int(parts.size());
  std::vector<float> o(size_t(n) * rows * len), lse(size_t(n) * rows);
  for (int c = 0; c < n; ++c) {
    const ref::AttendResult& p = parts[order[c]];
    for (size_t i = 0; i < p.o.size(); ++i) o[size_t(c) * rows * len + i] = float(p.o[i]);
    for (int k = 0; k < rows; ++k) lse[size_t(c) * rows + k] = float(p.lse[k]);
  }
  out.assign(len, -1.0f);
  return merge_partials(n, &lse[r], rows, &o[size_t(r) * len], int64_t(rows) * len, len, out.data());
}

TEST(SoftmaxState, PushMatchesSoftmax) {
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal(0, 1);
  for (double spread : {0.1, 3.0, 80.0}) {
    const int n = 300, len = 16;
    std::vector<double> scores(n), values(size_t(n) * len);
    for (double& s : scores) s = float(spread * normal(rng));
    for (double& v : values) v = float(normal(rng));
    std::vector<double> want;
    const double want_lse = softmax64(scores, values, len, want);

    SoftmaxState st;
    std::vector<float> acc(len, 0.0f);
    for (int j = 0; j < n; ++j) {
      float alpha, w;
      st.push(float(scores[j]), alpha, w);
      for (int l = 0; l < len; ++l) acc[l] = acc[l] * alpha + w * float(values[size_t(j) * len + l]);
    }
    for (float& a : acc) a *= st.inv_sum();
    EXPECT_LT(rel_l2(acc, want), 1e-5) << "spread " << spread;
    EXPECT_NEAR(st.lse(), want_lse, 1e-4 * std::max(1.0, std::abs(want_lse))) << "spread " << spread;
  }
}

TEST(SoftmaxState, EmptyAndMaskedScores) {
  SoftmaxState st;
  EXPECT_TRUE(st.empty());
  EXPECT_EQ(st.lse(), -INFINITY);
  EXPECT_EQ(st.inv_sum(), 0.0f);
  // A block whose scores are all masked (-inf) leaves the state empty and asks for no rescale
  // that could turn an accumulator into NaN.
  EXPECT_EQ(st.rescale(-INFINITY), 1.0f);
  EXPECT_EQ(st.weight(-INFINITY), 0.0f);
  EXPECT_TRUE(st.empty());
  // The first real score: alpha 0 (nothing accumulated yet), weight 1.
  float alpha, w;
  st.push(2.5f, alpha, w);
  EXPECT_EQ(alpha, 0.0f);
  EXPECT_EQ(w, 1.0f);
  EXPECT_FLOAT_EQ(st.lse(), 2.5f);
  st.push(-INFINITY, alpha, w);
  EXPECT_EQ(alpha, 1.0f);
  EXPECT_EQ(w, 0.0f);
  EXPECT_FLOAT_EQ(st.lse(), 2.5f);
  EXPECT_TRUE(SoftmaxState::from_lse(-INFINITY).empty());
  EXPECT_FLOAT_EQ(SoftmaxState::from_lse(-3.0f).lse(), -3.0f);
}

TEST(SoftmaxState, MergeOfStatesEqualsWhole) {
  std::mt19937_64 rng(2);
  std::normal_distribution<double> normal(0, 1);
  const int len = 8;
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + int(rng() % 40), cut = int(rng() % (n + 1));  // cut = 0 or n: one side empty
    const double spread = trial % 2 ? 40.0 : 2.0;
    std::vector<double> scores(n), values(size_t(n) * len);
    for (double& s : scores) s = float(spread * normal(rng));
    for (double& v : values) v = float(normal(rng));
    std::vector<double> whole, a, b;
    const double lse_whole = softmax64(scores, values, len, whole);
    const double lse_a = softmax64({scores.begin(), scores.begin() + cut}, {values.begin(), values.begin() + cut * len}, len, a);
    const double lse_b = softmax64({scores.begin() + cut, scores.end()}, {values.begin() + cut * len, values.end()}, len, b);

    SoftmaxState sa = SoftmaxState::from_lse(float(lse_a));
    const SoftmaxState sb = SoftmaxState::from_lse(float(lse_b));
    float wa, wb;
    sa.merge(sb, wa, wb);
    std::vector<float> o(len);
    for (int l = 0; l < len; ++l) o[l] = (wa ? wa * float(a[l]) : 0.0f) + (wb ? wb * float(b[l]) : 0.0f);
    EXPECT_LT(rel_l2(o, whole), 1e-5) << "trial " << trial;
    EXPECT_NEAR(sa.lse(), lse_whole, 1e-4 * std::max(1.0, std::abs(lse_whole))) << "trial " << trial;
  }
  // Two empty states merge to an empty one with zero weights.
  SoftmaxState e1, e2;
  float w1 = -1, w2 = -1;
  e1.merge(e2, w1, w2);
  EXPECT_EQ(w1, 0.0f);
  EXPECT_EQ(w2, 0.0f);
  EXPECT_TRUE(e1.empty());
}

TEST(MergePartials, MatchesReferenceMerge) {
  std::mt19937_64 rng(3);
  const int rows = 7, len = 48;
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + trial % 9;
    const double spread = trial % 3 == 0 ? 50.0 : 1.5;
    const std::vector<ref::AttendResult> parts = random_partials(rng, n, rows, len, spread, 0.3);
    const ref::AttendResult want = ref::merge(parts);
    std::vector<int> order(n);
    for (int c = 0; c < n; ++c) order[c] = c;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> out;
      const float lse = merge_row(parts, r, rows, len, out, order);
      const std::vector<double> want_o(want.o.begin() + r * len, want.o.begin() + (r + 1) * len);
      for (float x : out) ASSERT_FALSE(std::isnan(x)) << "an empty partial's NaN o leaked, trial " << trial;
      if (want.lse[r] == -kInf) {
        EXPECT_EQ(lse, -INFINITY);
        for (float x : out) EXPECT_EQ(x, 0.0f);
        continue;
      }
      EXPECT_LT(rel_l2(out, want_o), 1e-5) << "trial " << trial << " row " << r;
      EXPECT_NEAR(lse, want.lse[r], 1e-4 * std::max(1.0, std::abs(want.lse[r]))) << "trial " << trial;
    }
  }
}

TEST(MergePartials, AllEmptyGivesZeroAndMinusInf) {
  std::mt19937_64 rng(4);
  for (int n : {1, 2, 5}) {
    const std::vector<ref::AttendResult> parts = random_partials(rng, n, 3, 16, 1.0, 1.0);  // all empty, o NaN
    std::vector<int> order(n);
    for (int c = 0; c < n; ++c) order[c] = c;
    std::vector<float> out;
    EXPECT_EQ(merge_row(parts, 1, 3, 16, out, order), -INFINITY);
    for (float x : out) EXPECT_EQ(x, 0.0f);
    const ref::AttendResult want = ref::merge(parts);
    for (double l : want.lse) EXPECT_EQ(l, -kInf);
    for (double x : want.o) EXPECT_EQ(x, 0.0);
  }
}

TEST(MergePartials, OrderIndependent) {
  std::mt19937_64 rng(5);
  const int rows = 4, len = 32, n = 6;
  for (int trial = 0; trial < 10; ++trial) {
    const std::vector<ref::AttendResult> parts = random_partials(rng, n, rows, len, trial % 2 ? 30.0 : 1.0, 0.25);
    std::vector<int> order(n);
    for (int c = 0; c < n; ++c) order[c] = c;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> first;
      const float lse_first = merge_row(parts, r, rows, len, first, order);
      std::vector<int> perm = order;
      for (int k = 0; k < 5; ++k) {
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<float> other;
        const float lse_other = merge_row(parts, r, rows, len, other, perm);
        if (lse_first == -INFINITY) {
          EXPECT_EQ(lse_other, -INFINITY);
          continue;
        }
        EXPECT_NEAR(lse_other, lse_first, 1e-5 * std::max(1.0f, std::abs(lse_first)));
        const std::vector<double> first64(first.begin(), first.end());
        EXPECT_LT(rel_l2(other, first64), 1e-6);
      }
    }
  }
}

TEST(MergePartials, Bf16PartialsThroughConverter) {
  // The split partials may be bf16: the template reads them through a converter.
  std::mt19937_64 rng(6);
  const int n = 3, len = 64;
  const std::vector<ref::AttendResult> parts = random_partials(rng, n, 1, len, 2.0, 0.0);
  std::vector<uint16_t> o(size_t(n) * len);
  std::vector<float> lse(n);
  std::vector<ref::AttendResult> rounded = parts;
  for (int c = 0; c < n; ++c) {
    lse[c] = float(parts[c].lse[0]);
    for (int l = 0; l < len; ++l) {
      o[size_t(c) * len + l] = float_to_bf16(float(parts[c].o[l]));
      rounded[c].o[l] = bf16_to_float(o[size_t(c) * len + l]);
    }
  }
  std::vector<float> out(len);
  const float got = merge_partials(n, lse.data(), 1, o.data(), len, len, out.data(),
                                   [](uint16_t b) { return bf16_to_float(b); });
  const ref::AttendResult want = ref::merge(rounded);
  EXPECT_LT(rel_l2(out, want.o), 1e-6);
  EXPECT_NEAR(got, want.lse[0], 1e-5);
}

TEST(RefMerge, SinglePartialIsIdentity) {
  std::mt19937_64 rng(7);
  const std::vector<ref::AttendResult> parts = random_partials(rng, 1, 5, 8, 3.0, 0.4);
  const ref::AttendResult m = ref::merge(parts);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(m.lse[r], parts[0].lse[r]);
    for (int l = 0; l < 8; ++l) {
      if (parts[0].lse[r] == -kInf) EXPECT_EQ(m.o[r * 8 + l], 0.0);  // the empty partial's NaN is dropped
      else EXPECT_NEAR(m.o[r * 8 + l], parts[0].o[r * 8 + l], 1e-15);
    }
  }
}

}  // namespace
}  // namespace mla
