#pragma once
// A bf16 query on the fp8 tensor cores (kQSplit in attend_wgmma_kernel.cuh, instances in
// attend_wgmma_q_split.cu; MLA_ATTEND_Q_SPLIT=1): each query
// row v (576 bf16 values) is scaled by a power of two 2^e that puts its largest magnitude in
// [128, 256), and each x = v 2^e is split into two e4m3 codes with x = hi + lo / 16, so that
//   q . k = 2^-e (hi . k + (lo . k) / 16)
// takes two fp8 products (wgmma N = 32 for the 16 rows: the hi rows, then the lo rows) and the
// scores stay those of the bf16 query. The split is exact: x has bf16's 8 significant bits, hi is
// x rounded to e4m3's 4, so x - hi is at most 8 units of x's last bit (4 significant bits), which
// 16 (x - hi) holds in e4m3 exactly while |x| >= 2^-6 (e4m3's smallest normal; below it, 2^-13 of
// the row's largest value or less, both codes round: |hi + lo / 16 - x| <= 2^-14, session 33's
// exhaustive check of every bf16 value at every scale; hi alone is within 2^-10).
// Header-only, host and device (MLA_HD): tests/test_query_split.cpp checks every bf16 value on the
// host through formats.hpp's conversions, which are bit-exact with cuda_fp8.h's used on the device.
#include <stdint.h>
#include <string.h>

#include "mla/host_device.hpp"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif
#if !defined(__CUDA_ARCH__)
#include "mla/formats.hpp"
#endif

namespace mla {

// 2^e as a float, for e in [-126, 127].
MLA_HD float pow2_float(int e) {
  const uint32_t bits = uint32_t(e + 127) << 23;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// The exponent e of a query row whose largest magnitude is amax: amax 2^e in [128, 256) (a zero row,
// or inf / NaN: 0). Within [-120, 126], so 2^e and 2^-e are normal floats.
MLA_HD int query_split_exponent(float amax) {
#if defined(__CUDA_ARCH__)
  const uint32_t bits = __float_as_uint(amax);
#else
  uint32_t bits;
  memcpy(&bits, &amax, sizeof bits);
#endif
  const int biased = int((bits >> 23) & 0xFFu);
  if ((bits & 0x7FFFFFFFu) == 0 || biased == 0xFF) return 0;
  const int e = 7 - ((biased == 0 ? 1 : biased) - 127);  // a subnormal amax as 2^-126
  return e > 126 ? 126 : e;
}

// The exponent SplitQueryTile stores for a row holding an infinity (split with e = 0, where the
// infinities saturate to 448): its scores' factor 2^-e is then +inf, so they and the row's outputs
// come out non-finite rather than finite values of a saturated query (the infinite scores' signs
// follow the saturated dot products, so not necessarily the CPU's: garbage in, no finite garbage out).
inline constexpr int kQuerySplitInfRow = -128;

struct E4m3Split {
  uint8_t hi, lo;
};
// x (a bf16 value times 2^e) as hi + lo / 16 (satfinite RNE, as the fp8 query's quantization).
MLA_HD E4m3Split split_e4m3(float x) {
#if defined(__CUDA_ARCH__)
  const uint8_t hi = uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  const float hf = __half2float(__half(__nv_cvt_fp8_to_halfraw(hi, __NV_E4M3)));
  return {hi, uint8_t(__nv_cvt_float_to_fp8(16.0f * (x - hf), __NV_SATFINITE, __NV_E4M3))};
#else
  const uint8_t hi = float_to_fp8e4m3(x);
  return {hi, float_to_fp8e4m3(16.0f * (x - fp8e4m3_to_float(hi)))};
#endif
}

// Four bf16 values (w0: dims 0 and 1, w1: dims 2 and 3, each word's first in its low half) times
// scale, split as split_e4m3 does: dim i's codes in byte i of hi and of lo (SplitQueryTile's
// 16-byte query chunks; on the device two values a conversion).
MLA_HD void split_e4m3_x4(uint32_t w0, uint32_t w1, float scale, uint32_t& hi, uint32_t& lo) {
  const uint32_t bits[4] = {w0 << 16, w0 & 0xFFFF0000u, w1 << 16, w1 & 0xFFFF0000u};
  float x[4];
  for (int i = 0; i < 4; ++i) {
#if defined(__CUDA_ARCH__)
    x[i] = __uint_as_float(bits[i]) * scale;
#else
    memcpy(&x[i], &bits[i], sizeof(float));
    x[i] *= scale;
#endif
  }
#if defined(__CUDA_ARCH__)
  uint32_t h[2], l[2];
  for (int k = 0; k < 2; ++k) {  // (the first of a pair in the low byte)
    h[k] = __nv_cvt_float2_to_fp8x2(make_float2(x[2 * k], x[2 * k + 1]), __NV_SATFINITE, __NV_E4M3);
    const float2 back =
        __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(h[k]), __NV_E4M3)));
    l[k] = __nv_cvt_float2_to_fp8x2(make_float2(16.0f * (x[2 * k] - back.x), 16.0f * (x[2 * k + 1] - back.y)),
                                    __NV_SATFINITE, __NV_E4M3);
  }
  hi = h[0] | h[1] << 16;
  lo = l[0] | l[1] << 16;
#else
  hi = lo = 0;
  for (int i = 0; i < 4; ++i) {
    const E4m3Split s = split_e4m3(x[i]);
    hi |= uint32_t(s.hi) << (8 * i);
    lo |= uint32_t(s.lo) << (8 * i);
  }
#endif
}

}  // namespace mla
