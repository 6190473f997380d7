// core/query_split.hpp: a bf16 query row as two e4m3 rows (hi + lo / 16) after a power-of-two
// scale, the form in which the 16-row wgmma kernel takes a bf16 query over an fp8 cache
// (MLA_ATTEND_Q_SPLIT=1). Every finite bf16 value, as its row's largest and below larger ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "core/query_split.hpp"
#include "mla/formats.hpp"

namespace mla {
namespace {

float recombine(E4m3Split s) { return fp8e4m3_to_float(s.hi) + fp8e4m3_to_float(s.lo) / 16.0f; }

TEST(QuerySplit, ExponentPutsTheRowMaximumIn128To256) {
  EXPECT_EQ(query_split_exponent(0.0f), 0);
  EXPECT_EQ(query_split_exponent(INFINITY), 0);
  EXPECT_EQ(query_split_exponent(NAN), 0);
  EXPECT_EQ(query_split_exponent(1.0f), 7);
  EXPECT_EQ(query_split_exponent(255.9f), 0);
  EXPECT_EQ(query_split_exponent(256.0f), -1);
  EXPECT_EQ(query_split_exponent(1e-45f), 126);  // a subnormal: as 2^-126, clamped
  for (int k = -126; k <= 127; ++k) {
    for (float m : {1.0f, 1.5f, 1.9999f}) {
      const float amax = std::ldexp(m, k);
      const int e = query_split_exponent(amax);
      ASSERT_GE(e, -120);
      ASSERT_LE(e, 126);
      const float x = amax * pow2_float(e);
      if (k >= -119) {  // (smaller maxima stop at the clamp)
        EXPECT_GE(x, 128.0f) << amax;
        EXPECT_LT(x, 256.0f) << amax;
      }
      EXPECT_EQ(pow2_float(e) * pow2_float(-e), 1.0f);
    }
  }
}

// hi + lo / 16 is x exactly where |x| >= 2^-6 (e4m3's smallest normal), within 2^-14 below it (hi alone: 2^-10),
// for every finite bf16 v scaled as the largest of its row and as a value 2^1 .. 2^20 below the
// row's largest.
TEST(QuerySplit, InfinityRowScaleIsInfinite) {
  // SplitQueryTile stores kQuerySplitInfRow for a row with an infinity: its scores' 2^-e is +inf
  // (the row's outputs non-finite, not the finite values of a saturated query).
  EXPECT_EQ(query_split_exponent(INFINITY), 0);  // (the row is split with e = 0)
  EXPECT_TRUE(std::isinf(pow2_float(-kQuerySplitInfRow)));
  EXPECT_GT(pow2_float(-kQuerySplitInfRow), 0.0f);
}

TEST(QuerySplit, EveryBf16ValueIsExactInTwoE4m3Codes) {
  int64_t exact = 0, rounded = 0;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float v = bf16_to_float(uint16_t(bits));
    if (!std::isfinite(v)) continue;
    for (int below : {0, 1, 4, 9, 13, 17, 20}) {
      const float amax = std::fabs(v) * std::ldexp(1.0f, below);
      if (!std::isfinite(amax)) continue;
      const int e = query_split_exponent(amax);
      const float x = v * pow2_float(e);
      if (v != 0.0f && std::fabs(x) < std::ldexp(1.0f, -149 + 24)) continue;  // scaled into float subnormals
      ASSERT_LT(std::fabs(x), 256.0f) << "v " << v << " below " << below;  // no saturation at 448
      const E4m3Split s = split_e4m3(x);
      const float back = recombine(s);
      if (std::fabs(x) >= std::ldexp(1.0f, -6)) {
        ASSERT_EQ(back, x) << "v " << v << " (bf16 0x" << std::hex << bits << std::dec << ") below " << below
                           << ": hi 0x" << std::hex << int(s.hi) << " lo 0x" << int(s.lo);
        ++exact;
      } else {
        ASSERT_LE(std::fabs(back - x), std::ldexp(1.0f, -14)) << "v " << v << " below " << below;
        ++rounded;
      }
    }
  }
  EXPECT_GT(exact, 300000);  // (the cases checked, so that a filter above cannot empty the test)
  EXPECT_GT(rounded, 1000);
}

// Four values at once, as the kernel packs a query chunk: dim i (w0's low half first) in byte i.
TEST(QuerySplit, FourValuesPackDimIInByteI) {
  uint32_t state = 777u;
  for (int trial = 0; trial < 20000; ++trial) {
    state = state * 1664525u + 1013904223u;
    const uint32_t w0 = state & 0x7F7F7F7Fu;  // (finite bf16 halves)
    state = state * 1664525u + 1013904223u;
    const uint32_t w1 = state & 0xBFFFBFFFu;
    const uint16_t v[4] = {uint16_t(w0), uint16_t(w0 >> 16), uint16_t(w1), uint16_t(w1 >> 16)};
    float amax = 0.0f;
    for (uint16_t b : v) amax = std::fmax(amax, std::fabs(bf16_to_float(b)));
    const float scale = pow2_float(query_split_exponent(amax));
    uint32_t hi = 0, lo = 0;
    split_e4m3_x4(w0, w1, scale, hi, lo);
    for (int i = 0; i < 4; ++i) {
      const E4m3Split want = split_e4m3(bf16_to_float(v[i]) * scale);
      ASSERT_EQ(uint8_t(hi >> (8 * i)), want.hi) << "trial " << trial << " dim " << i;
      ASSERT_EQ(uint8_t(lo >> (8 * i)), want.lo) << "trial " << trial << " dim " << i;
    }
  }
}

// A dot product through the split equals the bf16 one to float rounding: the property the kernel
// relies on (2^-e (hi . k + lo . k / 16) with e4m3 keys k).
TEST(QuerySplit, DotProductsMatchTheBf16Query) {
  uint32_t state = 12345u;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state;
  };
  for (int trial = 0; trial < 200; ++trial) {
    float q[576];
    uint8_t k[576];
    float amax = 0.0f;
    const float spread = std::ldexp(1.0f, int(next() % 30) - 15);
    for (int i = 0; i < 576; ++i) {
      const float u = float(int32_t(next() >> 8) - (1 << 23)) / float(1 << 23);  // [-1, 1)
      q[i] = round_bf16(u * spread * std::ldexp(1.0f, -int(next() % 12)));
      amax = std::fmax(amax, std::fabs(q[i]));
      k[i] = uint8_t(next());
      if ((k[i] & 0x7F) == 0x7F) k[i] = 0;  // no NaN keys
    }
    const int e = query_split_exponent(amax);
    double want = 0.0, hi_sum = 0.0, lo_sum = 0.0, slack = 0.0;  // slack: the values below 2^-6 round
    for (int i = 0; i < 576; ++i) {
      const double kv = fp8e4m3_to_float(k[i]);
      want += double(q[i]) * kv;
      const float x = q[i] * pow2_float(e);
      if (std::fabs(x) < std::ldexp(1.0f, -6)) slack += std::ldexp(1.0, -10) * double(pow2_float(-e)) * std::fabs(kv);
      const E4m3Split s = split_e4m3(x);
      hi_sum += double(fp8e4m3_to_float(s.hi)) * kv;
      lo_sum += double(fp8e4m3_to_float(s.lo)) * kv;
    }
    const double got = (hi_sum + lo_sum / 16.0) * double(pow2_float(-e));
    double scale = 0.0;
    for (int i = 0; i < 576; ++i) scale += std::fabs(double(q[i]) * fp8e4m3_to_float(k[i]));
    EXPECT_LE(std::fabs(got - want), 1e-12 * scale + slack + 1e-30) << "trial " << trial;
    EXPECT_LT(slack, 1e-3 * scale) << "trial " << trial;  // (most of the row exact)
  }
}

}  // namespace
}  // namespace mla
