// The AVX2 + FMA + F16C kernels of the CPU attend stage (attend_kernels.hpp). fp32 throughout;
// 16 ymm registers shape the tiles: 4 query rows x 3 keys for the scores, 6 rows x 16 columns for P.V.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "cpu/attend_kernels.hpp"
#include "mla/formats.hpp"

#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "src/cpu/attend_avx2.cpp needs AVX2, FMA and F16C (MLA_CPU_FLAGS)"
#endif

namespace mla::cpu {
namespace {

// fp8 e4m3fn -> fp32 for 16 codes: the code's bits moved into an fp16 (sign to bit 15, exponent
// and mantissa to bits 13..7) are exactly the value times 2^-8 for normals and subnormals alike,
// so one F16C conversion and a multiply by 256*scale decode it. NaN codes (S.1111.111) get an
// all-ones fp16 exponent so they stay NaN.
inline void dequant_fp8_16(const uint8_t* src, __m256 scale256, float* dst) {
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi16(0x7F));
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8);
  __m256i h = _mm256_or_si256(sign, _mm256_slli_epi16(mag, 7));
  const __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F));
  h = _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7C00)));
  _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale256));
  _mm256_storeu_ps(dst + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), scale256));
}

inline void dequant_bf16_8(const uint16_t* src, float* dst) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  _mm256_storeu_ps(dst, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
}

// One cache row of `width` values (inner stride `stride`) -> fp32 dst.
void dequant_row(DType dtype, const void* row, int64_t stride, int width, float scale, float* dst) {
  if (dtype == DType::fp8_e4m3) {
    const uint8_t* src = static_cast<const uint8_t*>(row);
    if (stride == 1 && width % 16 == 0) {
      const __m256 scale256 = _mm256_set1_ps(scale * 256.0f);
      for (int c = 0; c < width; c += 16) dequant_fp8_16(src + c, scale256, dst + c);
    } else {
      for (int c = 0; c < width; ++c) dst[c] = fp8e4m3_to_float(src[c * stride]) * scale;
    }
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(row);
    if (stride == 1 && width % 8 == 0) {
      for (int c = 0; c < width; c += 8) dequant_bf16_8(src + c, dst + c);
    } else {
      for (int c = 0; c < width; ++c) dst[c] = bf16_to_float(src[c * stride]);
    }
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// scores[r][k] = q[r] . key[k] over n dims (n % 8 == 0) for an NR x NK tile: 12 accumulators at
// 4 x 3, 7 loads per 12 FMAs.
template <int NR, int NK>
void score_tile(const float* q, int64_t q_ld, const float* key, int64_t k_ld, int n, float* s, int64_t s_ld) {
  __m256 acc[NR][NK];
  // Fully unrolled (pragmas) so that GCC keeps acc in registers instead of a stack array.
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int k = 0; k < NK; ++k) acc[r][k] = _mm256_setzero_ps();
  for (int d = 0; d < n; d += 8) {
    __m256 kv[NK];
#pragma GCC unroll 4
    for (int k = 0; k < NK; ++k) kv[k] = _mm256_loadu_ps(key + k * k_ld + d);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m256 qv = _mm256_loadu_ps(q + r * q_ld + d);
#pragma GCC unroll 4
      for (int k = 0; k < NK; ++k) acc[r][k] = _mm256_fmadd_ps(qv, kv[k], acc[r][k]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int k = 0; k < NK; ++k) s[r * s_ld + k] = hsum(acc[r][k]);
}

using ScoreTile = void (*)(const float*, int64_t, const float*, int64_t, int, float*, int64_t);
template <int NR>
constexpr ScoreTile kScoreRow[3] = {score_tile<NR, 1>, score_tile<NR, 2>, score_tile<NR, 3>};
constexpr const ScoreTile* kScoreTiles[4] = {kScoreRow<1>, kScoreRow<2>, kScoreRow<3>, kScoreRow<4>};

void scores(const float* q, int64_t q_ld, int rows, const float* key, int64_t k_ld, int keys, int n,
            float* s, int64_t s_ld) {
  for (int r = 0; r < rows; r += 4) {
    const int nr = std::min(4, rows - r);
    for (int k = 0; k < keys; k += 3) {
      const int nk = std::min(3, keys - k);
      kScoreTiles[nr - 1][nk - 1](q + r * q_ld, q_ld, key + k * k_ld, k_ld, n, s + r * s_ld + k, s_ld);
    }
  }
}

// acc[r][0:16] += sum_k p[r][k] * v[k][0:16] for NR rows: 12 accumulators at 6 rows, 8 loads per
// 12 FMAs.
template <int NR>
void pv_tile(const float* p, int64_t p_ld, const float* v, int64_t v_ld, int keys, float* acc, int64_t a_ld) {
  __m256 a[NR][2];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    a[r][0] = _mm256_loadu_ps(acc + r * a_ld);
    a[r][1] = _mm256_loadu_ps(acc + r * a_ld + 8);
  }
  for (int k = 0; k < keys; ++k) {
    const __m256 v0 = _mm256_loadu_ps(v + k * v_ld), v1 = _mm256_loadu_ps(v + k * v_ld + 8);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r * p_ld + k);
      a[r][0] = _mm256_fmadd_ps(pr, v0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(pr, v1, a[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    _mm256_storeu_ps(acc + r * a_ld, a[r][0]);
    _mm256_storeu_ps(acc + r * a_ld + 8, a[r][1]);
  }
}

using PvTile = void (*)(const float*, int64_t, const float*, int64_t, int, float*, int64_t);
constexpr PvTile kPvTiles[6] = {pv_tile<1>, pv_tile<2>, pv_tile<3>, pv_tile<4>, pv_tile<5>, pv_tile<6>};

void pv(const float* p, int64_t p_ld, int rows, const float* v, int64_t v_ld, int keys, int width,
        float* acc, int64_t a_ld) {
  for (int r = 0; r < rows; r += 6) {
    const int nr = std::min(6, rows - r);
    for (int c = 0; c < width; c += 16)
      kPvTiles[nr - 1](p + r * p_ld, p_ld, v + c, v_ld, keys, acc + r * a_ld + c, a_ld);
  }
}

// exp(x) for 8 lanes (Cephes expf: range reduction by ln 2, degree-6 polynomial; ~1 ulp), 0 for
// x below the float range, -inf included (the padding of a score row).
inline __m256 exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, y);
}

// Folds one row's block of scores s[0, keys) (padded with -inf to a multiple of 8) into its
// state; turns s into the weights exp(s - m) and rescales the row's accumulator when m grows.
void softmax_block(float* s, int keys, SoftmaxState& st, float* acc, int width) {
  const int padded = (keys + 7) & ~7;
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (int k = 0; k < padded; k += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + k));
  float block_max = -INFINITY;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  for (float x : lanes) block_max = std::max(block_max, x);

  const float alpha = st.rescale(block_max);
  if (alpha != 1.0f) {
    const __m256 a = _mm256_set1_ps(alpha);
    for (int c = 0; c < width; c += 8) _mm256_storeu_ps(acc + c, _mm256_mul_ps(a, _mm256_loadu_ps(acc + c)));
  }
  const __m256 m = _mm256_set1_ps(st.m);
  __m256 sum = _mm256_setzero_ps();
  for (int k = 0; k < padded; k += 8) {
    const __m256 w = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + k), m));
    _mm256_storeu_ps(s + k, w);
    sum = _mm256_add_ps(sum, w);
  }
  st.add(hsum(sum));
}

}  // namespace

const AttendKernels& attend_kernels_avx2() {
  static const AttendKernels k{.name = "avx2",
                               .dequant_row = dequant_row,
                               .scores = scores,
                               .softmax_block = softmax_block,
                               .pv = pv};
  return k;
}

}  // namespace mla::cpu
