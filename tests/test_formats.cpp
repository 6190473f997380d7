// The number formats: every conversion against two independent expectations, (1) first principles
// (nearest representable value in float64, ties to the even code, saturation) and (2) the host
// paths of the CUDA toolkit's cuda_fp8.h / cuda_fp4.h / cuda_bf16.h, bit for bit. (2) skips where
// the toolkit headers are absent (tests/CMakeLists.txt defines MLA_HAVE_CUDA_FP_HEADERS).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "mla/formats.hpp"

#if defined(MLA_HAVE_CUDA_FP_HEADERS)
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

namespace mla {
namespace {

#if defined(MLA_HAVE_CUDA_FP_HEADERS)
constexpr bool kHaveCuda = true;
uint8_t cuda_to_fp8(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
float cuda_from_fp8(uint8_t c) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3))); }
uint8_t cuda_to_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }
float cuda_from_e2m1(uint8_t c) { return __half2float(__half(__nv_cvt_fp4_to_halfraw(c, __NV_E2M1))); }
uint16_t cuda_to_bf16(float x) { return __nv_bfloat16_raw(__float2bfloat16(x)).x; }
float cuda_from_bf16(uint16_t b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}
float cuda_from_e8m0(uint8_t e) { return cuda_from_bf16(__nv_cvt_e8m0_to_bf16raw(e).x); }
// floor(log2(amax)) + 127 by the toolkit's round-toward-zero E8M0 conversion.
int cuda_e8m0_floor(float amax) { return __nv_cvt_float_to_e8m0(amax, __NV_SATFINITE, cudaRoundZero); }
#else
constexpr bool kHaveCuda = false;
uint8_t cuda_to_fp8(float) { return 0; }
float cuda_from_fp8(uint8_t) { return 0; }
uint8_t cuda_to_e2m1(float) { return 0; }
float cuda_from_e2m1(uint8_t) { return 0; }
uint16_t cuda_to_bf16(float) { return 0; }
float cuda_from_bf16(uint16_t) { return 0; }
float cuda_from_e8m0(uint8_t) { return 0; }
int cuda_e8m0_floor(float) { return 0; }
#endif

#define REQUIRE_CUDA_HEADERS()                                                                 \
  if (!kHaveCuda) {                                                                              \
    GTEST_SKIP() << "CUDA toolkit headers (cuda_fp8.h, cuda_fp4.h) not found at configure time: " \
                    "bit-exact comparison with them skipped";                                    \
  }

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Every float whose top 16 bits are each bf16 pattern, and the bf16 value itself: all 2^16
// patterns (NaNs, infinities, subnormals included).
std::vector<float> all_bf16_values() {
  std::vector<float> v(1 << 16);
  for (uint32_t b = 0; b < (1u << 16); ++b) v[b] = from_bits(b << 16);
  return v;
}

// A stride over all 2^32 float bit patterns: 2^32 / 509 ~ 8.4M inputs with varied low bits.
template <class F>
void for_float_sweep(F&& f) {
  for (uint64_t u = 0; u < (1ull << 32); u += 509) f(from_bits(uint32_t(u)));
}

// ---- first-principles expectations ------------------------------------------------------------

// Positive finite values of fp8 e4m3fn, by code 0..0x7E: subnormals m * 2^-9, normals
// (1 + m/8) * 2^(e-7).
std::vector<double> fp8_values() {
  std::vector<double> v;
  for (int c = 0; c <= 0x7E; ++c) {
    const int e = c >> 3, m = c & 7;
    v.push_back(e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7));
  }
  return v;
}
const std::vector<double> kE2m1Values = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Round-to-nearest of |x| among the ascending positive values (index = code), ties to the even
// code, anything above the largest value saturates to it; the sign of x goes into sign_bit.
uint8_t nearest_code(double x, const std::vector<double>& values, uint8_t sign_bit) {
  const double a = std::fabs(x);
  const uint8_t sign = std::signbit(x) ? sign_bit : 0;
  const auto it = std::lower_bound(values.begin(), values.end(), a);
  if (it == values.end()) return uint8_t((values.size() - 1) | sign);
  const int hi = int(it - values.begin());
  if (values[hi] == a || hi == 0) return uint8_t(hi | sign);
  const int lo = hi - 1;
  const double mid2 = values[lo] + values[hi];  // exact: both are short dyadic numbers
  int code = 2 * a < mid2 ? lo : 2 * a > mid2 ? hi : (lo % 2 == 0 ? lo : hi);
  return uint8_t(code | sign);
}

uint8_t expected_fp8(float x) {
  static const std::vector<double> values = fp8_values();
  if (std::isnan(x)) return 0x7F;
  return nearest_code(x, values, 0x80);
}
uint8_t expected_e2m1(float x) {
  if (std::isnan(x)) return 0x7;
  return nearest_code(x, kE2m1Values, 0x8);
}
// bf16 RNE by comparing the two bracketing bf16 values in float64; the one above the largest
// finite bf16 is 2^128 (IEEE rounds as if the exponent were unbounded, then overflows to inf).
uint16_t expected_bf16(float x) {
  if (std::isnan(x)) return 0x7FFF;
  if (std::isinf(x)) return uint16_t(bits(x) >> 16);
  const uint32_t lo_bits = bits(x) & 0xFFFF0000u;
  const double a = std::fabs(double(x));
  const double lo = std::fabs(double(from_bits(lo_bits)));
  const uint32_t hi_bits = (lo_bits & 0x7FFFFFFFu) + 0x10000u;
  const double hi = hi_bits == 0x7F800000u ? std::ldexp(1.0, 128) : double(from_bits(hi_bits));
  uint32_t mag = lo_bits & 0x7FFFFFFFu;
  if (2 * a > lo + hi || (2 * a == lo + hi && ((mag >> 16) & 1))) mag = hi_bits;
  return uint16_t(((bits(x) & 0x80000000u) | mag) >> 16);
}
// floor(log2(amax)) - 2 + 127 clamped to [0, 254], by frexp (amax = f * 2^e, f in [0.5, 1)).
uint8_t expected_scale(float amax) {
  if (!std::isfinite(amax)) return 0xFF;
  if (amax == 0) return 0;
  int e = 0;
  std::frexp(double(amax), &e);
  return uint8_t(std::clamp(e - 1 - 2 + 127, 0, 254));
}

// Same bits, or both NaN with the same bits.
#define EXPECT_SAME_FLOAT(a, b, what) EXPECT_EQ(bits(a), bits(b)) << what << ": " << (a) << " vs " << (b)

// ---- bf16 ------------------------------------------------------------------------------------

TEST(Formats, Bf16AllPatternsRoundTrip) {
  for (uint32_t b = 0; b < (1u << 16); ++b) {
    const float f = bf16_to_float(uint16_t(b));
    ASSERT_EQ(bits(f), b << 16) << "bf16 " << b;
    const uint16_t back = float_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_EQ(back, 0x7FFF) << "NaN bf16 " << b << " must become the canonical NaN";
    } else {
      ASSERT_EQ(back, b) << "bf16 " << b << " must round-trip";
    }
  }
}

TEST(Formats, Bf16EdgeCases) {
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(float_to_bf16(-NAN), 0x7FFF);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F800001u)), 0x7FFF);  // signaling NaN stays NaN
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);          // tie, even below
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);      // tie, even above
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808001u)), 0x3F81);  // just above the tie
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to inf
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7F);  // just below the overflow tie
  EXPECT_EQ(float_to_bf16(from_bits(0x00000001u)), 0x0000);  // smallest subnormal
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie to even
  EXPECT_EQ(round_bf16(1.0f + 0x1p-7f), 1.0f + 0x1p-7f);
}

TEST(Formats, Bf16FloatSweepFirstPrinciples) {
  for (float x : all_bf16_values()) ASSERT_EQ(float_to_bf16(x), expected_bf16(x)) << "x bits " << bits(x);
  for_float_sweep([](float x) { ASSERT_EQ(float_to_bf16(x), expected_bf16(x)) << "x bits " << bits(x); });
}

TEST(Formats, Bf16MatchesCudaHeaders) {
  REQUIRE_CUDA_HEADERS();
  for (uint32_t b = 0; b < (1u << 16); ++b) {
    ASSERT_EQ(bits(bf16_to_float(uint16_t(b))), bits(cuda_from_bf16(uint16_t(b)))) << "bf16 " << b;
  }
  for_float_sweep([](float x) { ASSERT_EQ(float_to_bf16(x), cuda_to_bf16(x)) << "x bits " << bits(x); });
}

// ---- fp8 e4m3fn ------------------------------------------------------------------------------

TEST(Formats, Fp8DecodeAllCodes) {
  const std::vector<double> values = fp8_values();
  for (int c = 0; c < 256; ++c) {
    const float f = fp8e4m3_to_float(uint8_t(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << "code " << c;
      continue;
    }
    const double v = (c & 0x80) ? -values[c & 0x7F] : values[c & 0x7F];
    EXPECT_EQ(double(f), v) << "code " << c;
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << "code " << c;
    EXPECT_EQ(float_to_fp8e4m3(f), c) << "code " << c << " must round-trip";
  }
  EXPECT_EQ(fp8e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(fp8e4m3_to_float(0x08), 0x1p-6f);
}

TEST(Formats, Fp8EdgeCases) {
  EXPECT_EQ(float_to_fp8e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_fp8e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_fp8e4m3(INFINITY), 0x7E);  // satfinite
  EXPECT_EQ(float_to_fp8e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(float_to_fp8e4m3(NAN), 0x7F);
  EXPECT_EQ(float_to_fp8e4m3(-NAN), 0x7F);
  EXPECT_EQ(float_to_fp8e4m3(from_bits(0xFF800001u)), 0x7F);
  EXPECT_EQ(float_to_fp8e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_fp8e4m3(464.0f), 0x7E);  // tie between 448 and (absent) 480: saturates
  EXPECT_EQ(float_to_fp8e4m3(std::nextafter(464.0f, INFINITY)), 0x7E);
  EXPECT_EQ(float_to_fp8e4m3(-1e30f), 0xFE);
  EXPECT_EQ(float_to_fp8e4m3(400.0f), 0x7C);  // tie 384 | 416 -> even 384
  EXPECT_EQ(float_to_fp8e4m3(0x1p-10f), 0x00);              // half the smallest subnormal: tie to 0
  EXPECT_EQ(float_to_fp8e4m3(-0x1p-10f), 0x80);
  EXPECT_EQ(float_to_fp8e4m3(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(float_to_fp8e4m3(1.5f * 0x1p-9f), 0x02);        // subnormal tie to even
  EXPECT_EQ(float_to_fp8e4m3(2.5f * 0x1p-9f), 0x02);
  EXPECT_EQ(float_to_fp8e4m3(7.5f * 0x1p-9f), 0x08);        // largest subnormal rounds up to 2^-6
  EXPECT_EQ(float_to_fp8e4m3(from_bits(0x00000001u)), 0x00);  // float subnormals underflow
  EXPECT_EQ(float_to_fp8e4m3(-from_bits(0x007FFFFFu)), 0x80);
  EXPECT_EQ(float_to_fp8e4m3(1.0625f), 0x38);  // 1 + 1/16: tie to even 1.0
  EXPECT_EQ(float_to_fp8e4m3(1.1875f), 0x3A);  // 1 + 3/16: tie to even 1.25
  EXPECT_EQ(float_to_fp8e4m3(15.5f), 0x58);    // 15 | 16 tie, carry into the exponent
}

// Every midpoint between neighbouring fp8 values, and one float ulp on each side of it.
TEST(Formats, Fp8Midpoints) {
  const std::vector<double> values = fp8_values();
  for (int c = 0; c + 1 < int(values.size()); ++c) {
    const float mid = float((values[c] + values[c + 1]) / 2);
    ASSERT_EQ(double(mid), (values[c] + values[c + 1]) / 2);
    const int even = c % 2 == 0 ? c : c + 1;
    for (float s : {1.0f, -1.0f}) {
      const uint8_t sign = s < 0 ? 0x80 : 0;
      EXPECT_EQ(float_to_fp8e4m3(s * mid), even | sign) << "midpoint above code " << c;
      EXPECT_EQ(float_to_fp8e4m3(s * std::nextafter(mid, 0.0f)), c | sign) << "below midpoint of " << c;
      EXPECT_EQ(float_to_fp8e4m3(s * std::nextafter(mid, INFINITY)), (c + 1) | sign)
          << "above midpoint of " << c;
    }
  }
}

TEST(Formats, Fp8FirstPrinciples) {
  for (float x : all_bf16_values()) ASSERT_EQ(float_to_fp8e4m3(x), expected_fp8(x)) << "x bits " << bits(x);
  for_float_sweep([](float x) { ASSERT_EQ(float_to_fp8e4m3(x), expected_fp8(x)) << "x bits " << bits(x); });
}

TEST(Formats, Fp8MatchesCudaHeaders) {
  REQUIRE_CUDA_HEADERS();
  for (int c = 0; c < 256; ++c) EXPECT_SAME_FLOAT(fp8e4m3_to_float(uint8_t(c)), cuda_from_fp8(uint8_t(c)), c);
  for (float x : all_bf16_values()) ASSERT_EQ(float_to_fp8e4m3(x), cuda_to_fp8(x)) << "x bits " << bits(x);
  for_float_sweep([](float x) { ASSERT_EQ(float_to_fp8e4m3(x), cuda_to_fp8(x)) << "x bits " << bits(x); });
}

// ---- E2M1, E8M0 ------------------------------------------------------------------------------

TEST(Formats, E2m1DecodeAndEdgeCases) {
  for (int c = 0; c < 16; ++c) {
    const float f = e2m1_to_float(uint8_t(c));
    EXPECT_EQ(std::fabs(double(f)), kE2m1Values[c & 7]) << "code " << c;
    EXPECT_EQ(std::signbit(f), (c & 8) != 0) << "code " << c;
    EXPECT_EQ(float_to_e2m1(f), c) << "code " << c << " must round-trip";
    EXPECT_EQ(e2m1_to_float(uint8_t(c | 0xF0)), f) << "only the low nibble is read";
  }
  EXPECT_EQ(float_to_e2m1(0.25f), 0x0);  // tie to even 0
  EXPECT_EQ(float_to_e2m1(std::nextafter(0.25f, 1.0f)), 0x1);
  EXPECT_EQ(float_to_e2m1(0.75f), 0x2);  // tie 0.5 | 1.0 -> 1.0 (even code)
  EXPECT_EQ(float_to_e2m1(1.25f), 0x2);  // tie 1.0 | 1.5 -> 1.0
  EXPECT_EQ(float_to_e2m1(1.75f), 0x4);  // tie 1.5 | 2.0 -> 2.0
  EXPECT_EQ(float_to_e2m1(2.5f), 0x4);
  EXPECT_EQ(float_to_e2m1(3.5f), 0x6);
  EXPECT_EQ(float_to_e2m1(5.0f), 0x6);   // tie 4 | 6 -> 4
  EXPECT_EQ(float_to_e2m1(std::nextafter(5.0f, 6.0f)), 0x7);
  EXPECT_EQ(float_to_e2m1(6.0f), 0x7);
  EXPECT_EQ(float_to_e2m1(7.0f), 0x7);
  EXPECT_EQ(float_to_e2m1(1e30f), 0x7);
  EXPECT_EQ(float_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(float_to_e2m1(-INFINITY), 0xF);
  EXPECT_EQ(float_to_e2m1(NAN), 0x7);
  EXPECT_EQ(float_to_e2m1(-NAN), 0x7);
  EXPECT_EQ(float_to_e2m1(-0.1f), 0x8);  // underflow keeps the sign
  EXPECT_EQ(float_to_e2m1(-0.0f), 0x8);
}

TEST(Formats, E2m1FirstPrinciples) {
  for (float x : all_bf16_values()) ASSERT_EQ(float_to_e2m1(x), expected_e2m1(x)) << "x bits " << bits(x);
  for_float_sweep([](float x) { ASSERT_EQ(float_to_e2m1(x), expected_e2m1(x)) << "x bits " << bits(x); });
}

TEST(Formats, E2m1MatchesCudaHeaders) {
  REQUIRE_CUDA_HEADERS();
  for (int c = 0; c < 16; ++c) EXPECT_SAME_FLOAT(e2m1_to_float(uint8_t(c)), cuda_from_e2m1(uint8_t(c)), c);
  for (float x : all_bf16_values()) ASSERT_EQ(float_to_e2m1(x), cuda_to_e2m1(x)) << "x bits " << bits(x);
  for_float_sweep([](float x) { ASSERT_EQ(float_to_e2m1(x), cuda_to_e2m1(x)) << "x bits " << bits(x); });
}

TEST(Formats, E8m0Decode) {
  for (int e = 0; e < 255; ++e) EXPECT_EQ(double(e8m0_to_float(uint8_t(e))), std::ldexp(1.0, e - 127)) << e;
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
}

TEST(Formats, E8m0MatchesCudaHeaders) {
  REQUIRE_CUDA_HEADERS();
  for (int e = 0; e < 256; ++e) EXPECT_SAME_FLOAT(e8m0_to_float(uint8_t(e)), cuda_from_e8m0(uint8_t(e)), e);
}

// ---- MXFP4 -----------------------------------------------------------------------------------

std::vector<float> scale_probe_amaxes() {
  std::vector<float> v = {0.0f, from_bits(1), from_bits(0x007FFFFFu), 0x1p-126f, 0x1p-125f, 0x1p-124f,
                          0x1.8p-125f, 1.0f, 3.99f, 4.0f, 6.0f, 7.99f, 8.0f, 448.0f, 1e30f,
                          std::numeric_limits<float>::max()};
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    v.insert(v.end(), {p, std::nextafter(p, 0.0f), std::nextafter(p, INFINITY)});
  }
  return v;
}

TEST(Formats, MxScaleFirstPrinciples) {
  for (float a : scale_probe_amaxes()) EXPECT_EQ(mxfp4_scale_for_amax(a), expected_scale(a)) << "amax " << a;
  EXPECT_EQ(mxfp4_scale_for_amax(0.0f), 0);  // all-zero block: smallest scale
  EXPECT_EQ(mxfp4_scale_for_amax(1.0f), 125);
  EXPECT_EQ(mxfp4_scale_for_amax(6.0f), 127);  // 6 = 1.5 * 2^2 -> scale 1
  EXPECT_EQ(mxfp4_scale_for_amax(std::numeric_limits<float>::max()), 252);
  EXPECT_EQ(mxfp4_scale_for_amax(INFINITY), 0xFF);
  EXPECT_EQ(mxfp4_scale_for_amax(NAN), 0xFF);
}

TEST(Formats, MxScaleMatchesCudaHeaders) {
  REQUIRE_CUDA_HEADERS();
  for (float a : scale_probe_amaxes()) {
    EXPECT_EQ(mxfp4_scale_for_amax(a), std::max(cuda_e8m0_floor(a) - 2, 0)) << "amax " << a;
  }
}

// Checks one quantized block element by element: the scale from the block's amax, each code the
// nearest E2M1 value of x / scale (first principles) and the toolkit's conversion of it.
void check_block(const std::array<float, kMxBlock>& x, const char* what) {
  std::array<uint8_t, kMxBlock / 2> codes{};
  uint8_t scale = 0;
  quantize_mxfp4_block(x, codes, scale);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  ASSERT_EQ(scale, expected_scale(amax)) << what;
  const double s = std::ldexp(1.0, scale - 127);
  for (int i = 0; i < kMxBlock; ++i) {
    const uint8_t code = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
    const double q = double(x[i]) / s;
    ASSERT_EQ(code, expected_e2m1(float(q))) << what << " element " << i << " x " << x[i];
    ASSERT_EQ(double(float(q)), q) << "x / scale must be exact";
    if (kHaveCuda) {
      ASSERT_EQ(code, cuda_to_e2m1(x[i] / e8m0_to_float(scale))) << what << " element " << i;
    }
    ASSERT_EQ(mxfp4_at(codes.data(), &scale, i), float(kE2m1Values[code & 7] * s * ((code & 8) ? -1 : 1)))
        << what << " element " << i;
  }
}

TEST(Formats, MxBlockAllZero) {
  std::array<float, kMxBlock> x{};
  std::array<uint8_t, kMxBlock / 2> codes;
  codes.fill(0xAB);
  uint8_t scale = 0xAB;
  quantize_mxfp4_block(x, codes, scale);
  EXPECT_EQ(scale, 0);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
  for (int i = 0; i < kMxBlock; ++i) EXPECT_EQ(mxfp4_at(codes.data(), &scale, i), 0.0f);
}

TEST(Formats, MxBlockPackingLowNibbleFirst) {
  std::array<float, kMxBlock> x{};
  x[0] = 0.5f;  // amax 6 -> scale 2^0
  x[1] = 6.0f;
  x[2] = -1.5f;
  x[31] = -3.0f;
  std::array<uint8_t, kMxBlock / 2> codes{};
  uint8_t scale = 0;
  quantize_mxfp4_block(x, codes, scale);
  EXPECT_EQ(scale, 127);
  EXPECT_EQ(codes[0], 0x71);
  EXPECT_EQ(codes[1], 0x0B);
  EXPECT_EQ(codes[15], 0xD0);
}

TEST(Formats, MxBlockHugeAndTinyAmax) {
  std::array<float, kMxBlock> x{};
  // Huge: amax near FLT_MAX, small entries underflow to zero.
  for (int i = 0; i < kMxBlock; ++i) x[i] = std::ldexp(1.0f + i / 32.0f, 127 - i);
  x[5] = -std::numeric_limits<float>::max();
  check_block(x, "huge amax");
  // Tiny: amax below 2^-125 clamps the scale to 2^-127, so elements can sit well below 4.
  for (int i = 0; i < kMxBlock; ++i) x[i] = std::ldexp(float(i % 7) - 3.0f, -128);
  check_block(x, "tiny amax");
  x.fill(0x1p-126f);  // x / 2^-127 = 2
  check_block(x, "min normal amax");
  x[3] = -0x1.8p-125f;  // x / 2^-127 = -6
  check_block(x, "clamped scale, full range");
  for (int i = 0; i < kMxBlock; ++i) x[i] = from_bits(uint32_t(1 + 1000 * i));  // float subnormals
  check_block(x, "subnormal block");
}

TEST(Formats, MxBlockRandom) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exp(-140, 120);
  std::array<float, kMxBlock> x{};
  for (int trial = 0; trial < 2000; ++trial) {
    const float mag = std::ldexp(1.0f, exp(rng));
    for (float& v : x) v = normal(rng) * mag;
    if (trial % 5 == 0) x[trial % kMxBlock] = 0.0f;
    if (trial % 7 == 0) x[(trial / 7) % kMxBlock] *= 64.0f;  // an outlier dominates the scale
    check_block(x, "random block");
    if (HasFatalFailure()) return;
  }
}

TEST(Formats, MxBlockNonFiniteGivesNanScale) {
  std::array<float, kMxBlock> x{};
  std::array<uint8_t, kMxBlock / 2> codes{};
  uint8_t scale = 0;
  x[0] = 1.0f;
  x[9] = NAN;
  quantize_mxfp4_block(x, codes, scale);
  EXPECT_EQ(scale, 0xFF);
  EXPECT_TRUE(std::isnan(mxfp4_at(codes.data(), &scale, 0)));
  x[9] = -INFINITY;
  quantize_mxfp4_block(x, codes, scale);
  EXPECT_EQ(scale, 0xFF);
  EXPECT_TRUE(std::isnan(mxfp4_at(codes.data(), &scale, 9)));
}

TEST(Formats, MxfpAtTwoBlocks) {
  std::array<uint8_t, kMxBlock> codes{};
  std::array<uint8_t, 2> scales = {126, 130};  // 2^-1 and 2^3
  codes[0] = 0x2F;   // element 0: -6, element 1: 1
  codes[16] = 0x95;  // element 32: 3, element 33: -0.5
  EXPECT_EQ(mxfp4_at(codes.data(), scales.data(), 0), -3.0f);
  EXPECT_EQ(mxfp4_at(codes.data(), scales.data(), 1), 0.5f);
  EXPECT_EQ(mxfp4_at(codes.data(), scales.data(), 32), 24.0f);
  EXPECT_EQ(mxfp4_at(codes.data(), scales.data(), 33), -4.0f);
}

}  // namespace
}  // namespace mla
