#include "mla/formats.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace mla {

namespace {

// Rounds |x| (float bits u, finite, above the format's underflow threshold and at or below its
// largest value after rounding) to the code of a small float format with kManBits mantissa bits
// and exponent bias kBias, round to nearest even. The implicit bit is kept in the significand, so
// a normal's exponent field is (e - emin) + 1 and the carry of a round-up walks into the exponent
// (and from the largest subnormal into the smallest normal) by plain integer addition.
// This is the algorithm of cuda_fp8.hpp / cuda_fp4.hpp's __nv_cvt_double_to_fp8/fp4 on a float
// input (float -> double is exact, so the double detour changes nothing).
template <int kManBits, int kBias>
uint32_t encode_rne(uint32_t u) {
  constexpr int kEmin = 1 - kBias;  // exponent of the smallest normal
  const int e = int((u >> 23) & 0xFF) - 127;
  const uint32_t sig = (u & 0x7FFFFFu) | 0x800000u;
  const int below = std::max(kEmin - e, 0);  // extra shift in the subnormal range
  const int shift = 23 - kManBits + below;   // <= 24 for inputs above the underflow threshold
  uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  const uint32_t exp_base = uint32_t(std::max(e - kEmin, 0)) << kManBits;
  return exp_base + q;
}

}  // namespace

uint8_t float_to_fp8e4m3(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;  // NaN: canonical, sign dropped
  const uint8_t sign = uint8_t((u >> 31) << 7);
  // |x| <= 2^-10 (half the smallest subnormal 2^-9, the tie rounding to even 0) -> signed zero.
  if (a <= 0x3A800000u) return sign;
  // |x| >= 464 = 448 + half an ulp: 464 itself ties to the even 448, anything above saturates.
  if (a >= 0x43E80000u) return sign | 0x7E;
  return uint8_t(sign | encode_rne<3, 7>(a));
}

uint8_t float_to_e2m1(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7;  // NaN -> +6, as cuda_fp4.h does
  const uint8_t sign = uint8_t((u >> 31) << 3);
  if (a <= 0x3E800000u) return sign;        // |x| <= 0.25: the tie at 0.25 rounds to even 0
  if (a > 0x40C00000u) return sign | 0x7;   // |x| > 6 and inf saturate
  return uint8_t(sign | encode_rne<1, 1>(a));
}

uint8_t mxfp4_scale_for_amax(float amax) {
  const uint32_t a = std::bit_cast<uint32_t>(amax) & 0x7FFFFFFFu;
  const int exp_field = int(a >> 23);  // biased exponent; 0 for zero and float subnormals
  if (exp_field == 0xFF) return 0xFF;
  // floor(log2(amax)) - 2 + 127 = exp_field - 2 for a normal amax; a float subnormal amax
  // (< 2^-126) lies below the E8M0 range and clamps to 0 like zero does. The largest finite
  // amax gives 252, so the upper clamp (254) is never reached.
  return uint8_t(std::max(exp_field - 2, 0));
}

void quantize_mxfp4_block(std::span<const float, kMxBlock> x, std::span<uint8_t, kMxBlock / 2> codes,
                          uint8_t& scale) {
  float amax = 0.0f;
  bool finite = true;
  for (float v : x) {
    finite = finite && std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  scale = finite ? mxfp4_scale_for_amax(amax) : uint8_t(0xFF);
  if (scale == 0xFF) {
    // The block decodes to NaN through its scale; the codes are those cuda_fp4.h gives NaN.
    std::fill(codes.begin(), codes.end(), uint8_t(0x77));
    return;
  }
  // x / 2^(scale-127) as a multiplication by 2^(127-scale): scale <= 252 keeps that factor a
  // normal float, and multiplying by a power of two is exact (a result that underflows is far
  // below E2M1's smallest step and encodes to zero either way).
  const float inv_scale = std::bit_cast<float>(uint32_t(254 - scale) << 23);
  for (int i = 0; i < kMxBlock / 2; ++i) {
    const uint8_t lo = float_to_e2m1(x[2 * i] * inv_scale);
    const uint8_t hi = float_to_e2m1(x[2 * i + 1] * inv_scale);
    codes[i] = uint8_t(lo | (hi << 4));
  }
}

}  // namespace mla
