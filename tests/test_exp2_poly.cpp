// exp2_poly (src/core/exp2_poly.hpp), the host form of the device's MUFU-free 2^x: its relative error over the
// softmax's range, -inf to +0 exactly, NaN kept, and monotone across the exponent steps where n changes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/exp2_poly.hpp"

namespace {

TEST(Exp2Poly, RelativeErrorBelowATenThousandthOverTheSoftmaxRange) {
  double worst = 0.0, at = 0.0;
  for (int i = 0; i <= 2'000'000; ++i) {  // x in [-126, 8]: every weight the lazy rescale allows, above subnormals
    const float x = -126.0f + 134.0f * float(i) / 2'000'000.0f;
    const double want = std::exp2(double(x)), got = double(mla::exp2_poly(x));
    const double rel = std::fabs(got / want - 1.0);
    if (rel > worst) worst = rel, at = x;
  }
  EXPECT_LT(worst, 8.7e-5) << "at x = " << at;
  EXPECT_GT(worst, 1e-6) << "a cubic cannot be this close: the test is not measuring the polynomial";
}

TEST(Exp2Poly, ExactAtIntegersAndZeroForMinusInfinity) {
  for (int n = -126; n <= 8; ++n) EXPECT_EQ(mla::exp2_poly(float(n)), std::ldexp(1.0f, n)) << "n = " << n;
  const float zero = mla::exp2_poly(-std::numeric_limits<float>::infinity());
  EXPECT_EQ(zero, 0.0f);
  EXPECT_FALSE(std::signbit(zero));
  EXPECT_EQ(mla::exp2_poly(-127.0f), 0.0f);
  EXPECT_EQ(mla::exp2_poly(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isnan(mla::exp2_poly(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Exp2Poly, MonotoneAcrossEachIntegerStep) {
  for (int n = -125; n <= 8; ++n) {
    const float below = std::nextafter(float(n), -1000.0f), above = std::nextafter(float(n), 1000.0f);
    EXPECT_LE(mla::exp2_poly(below), mla::exp2_poly(float(n))) << "n = " << n;
    EXPECT_LE(mla::exp2_poly(float(n)), mla::exp2_poly(above)) << "n = " << n;
  }
}

}  // namespace
