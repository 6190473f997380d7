#pragma once
// 2^x without the MUFU unit (FlashAttention-4's softmax trick), for kernels whose softmax issues more ex2 than
// MUFU.EX2 serves: that unit takes a warp's ex2 once every 8 cycles of an SM sub-partition, the FMA and integer pipes
// an instruction about every cycle, so a share of a tile's exponentials moved here runs beside the rest.
//   x clamped below at -127 (NaN stays NaN: the clamp is max.NaN on the device), n = floor(x), f = x - n in [0, 1),
//   2^f by a cubic with p(0) = 1 (relative error < 8.6e-5, a fiftieth of a bf16 P's rounding, 2^-9), and n added to
//   p's exponent field. -inf (a masked score) gives +0 exactly: n = -127 and p(0) = 1 make every bit zero.
// Domain x <= 127 (the softmax weights' x <= 8, kLazyRescale); a subnormal result for x in (-127, -126), where
// MUFU's ftz form gives 0: nothing beside the row's largest weight (>= 2^-8). Header-only, MLA_HD: the device's form
// floors by one add rounded down against 1.5 * 2^23 (FADD.RM, full rate), the host's by floorf (the unit test).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mla/host_device.hpp"

namespace mla {

// p(f) = 1 + f (c1 + f (c2 + f c3)) ~ 2^f on [0, 1): relative-error fit (session 54; float32 Horner max 8.59e-5).
constexpr float kExp2PolyC1 = 0.695115864276886f;
constexpr float kExp2PolyC2 = 0.22764916718006134f;
constexpr float kExp2PolyC3 = 0.07706321775913239f;

MLA_HD float exp2_poly(float x) {
#if defined(__CUDA_ARCH__)
  float xc, t;
  asm("max.NaN.f32 %0, %1, 0fC2FE0000;" : "=f"(xc) : "f"(x));  // max(x, -127), NaN kept
  t = __fadd_rd(xc, 12582912.0f);                                // 1.5 * 2^23 + floor(x) (exact below 2^22)
  const float n = t - 12582912.0f;
  const int32_t nbits = __float_as_int(t) - 0x4B400000;          // floor(x) as an integer
#else
  const float xc = x != x ? x : (x < -127.0f ? -127.0f : x);
  const float n = floorf(xc);
  const int32_t nbits = n != n ? 0 : int32_t(n);
#endif
  const float f = xc - n;
  const float p = fmaf(f, fmaf(f, fmaf(f, kExp2PolyC3, kExp2PolyC2), kExp2PolyC1), 1.0f);
#if defined(__CUDA_ARCH__)
  return __int_as_float(__float_as_int(p) + int32_t(uint32_t(nbits) << 23));
#else
  int32_t bits;
  memcpy(&bits, &p, sizeof bits);
  bits += int32_t(uint32_t(nbits) << 23);
  float y;
  memcpy(&y, &bits, sizeof y);
  return y;
#endif
}

}  // namespace mla
