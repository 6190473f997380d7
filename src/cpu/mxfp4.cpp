#include "cpu/mxfp4.hpp"

#include <algorithm>

#include "mla/formats.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MLA_MXFP4_AVX2 1
#endif

namespace mla::cpu {

namespace {

#ifdef MLA_MXFP4_AVX2
// Half the E8M0 scale: the lookup below yields twice the E2M1 value as an int8.
inline float half_scale(uint8_t e) { return e8m0_to_float(e) * 0.5f; }

// Decodes one block of 32 elements (16 bytes of codes) into w[0..3], 8 floats each, in order.
inline void decode_block(const uint8_t* codes, float half_scale, __m256 w[4]) {
  // 2 * E2M1 for codes 0..15: {0, 0.5, 1, 1.5, 2, 3, 4, 6} doubled, then the negatives.
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i nibble = _mm_set1_epi8(0x0F);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(bytes, nibble));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
  const __m128i e0 = _mm_unpacklo_epi8(lo, hi);  // elements 0..15 (low nibble first)
  const __m128i e1 = _mm_unpackhi_epi8(lo, hi);  // elements 16..31
  const __m256 s = _mm256_set1_ps(half_scale);
  w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), s);
  w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), s);
  w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), s);
  w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), s);
}

inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// NT tokens at once: their accumulators stay in registers while the row streams by.
template <int NT>
void row_dots_tile(const uint8_t* codes, const uint8_t* scales, int cols, const float* x, int64_t x_stride,
                   float* dots, int64_t dots_stride) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int b = 0; b < cols / kMxBlock; ++b) {
    __m256 w[4];
    decode_block(codes + b * (kMxBlock / 2), half_scale(scales[b]), w);
    for (int t = 0; t < NT; ++t) {
      const float* xt = x + t * x_stride + b * kMxBlock;
      acc[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xt), acc[t]);
      acc[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), acc[t]);
      acc[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), acc[t]);
      acc[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) dots[t * dots_stride] = hsum(acc[t]);
}
#endif

}  // namespace

void mxfp4_row_dots(const uint8_t* codes, const uint8_t* scales, int cols, const float* x, int64_t x_stride,
                    int tokens, float* dots, int64_t dots_stride) {
#ifdef MLA_MXFP4_AVX2
  constexpr int kTile = 8;
  for (int t0 = 0; t0 < tokens; t0 += kTile) {
    const float* xt = x + t0 * x_stride;
    float* dt = dots + t0 * dots_stride;
    switch (std::min(kTile, tokens - t0)) {
      case 1: row_dots_tile<1>(codes, scales, cols, xt, x_stride, dt, dots_stride); break;
      case 2: row_dots_tile<2>(codes, scales, cols, xt, x_stride, dt, dots_stride); break;
      case 3: row_dots_tile<3>(codes, scales, cols, xt, x_stride, dt, dots_stride); break;
      case 4: row_dots_tile<4>(codes, scales, cols, xt, x_stride, dt, dots_stride); break;
      case 5: row_dots_tile<5>(codes, scales, cols, xt, x_stride, dt, dots_stride); break;
      case 6: row_dots_tile<6>(codes, scales, cols, xt, x_stride, dt, dots_stride); break;
      case 7: row_dots_tile<7>(codes, scales, cols, xt, x_stride, dt, dots_stride); break;
      default: row_dots_tile<8>(codes, scales, cols, xt, x_stride, dt, dots_stride); break;
    }
  }
#else
  // Portable path: the same products, one token at a time.
  for (int t = 0; t < tokens; ++t) {
    float acc = 0.0f;
    for (int c = 0; c < cols; ++c) {
      const uint8_t byte = codes[c >> 1];
      const float e = e2m1_to_float((c & 1) ? (byte >> 4) : (byte & 0xF));
      acc += e * e8m0_to_float(scales[c / kMxBlock]) * x[t * x_stride + c];
    }
    dots[t * dots_stride] = acc;
  }
#endif
}

}  // namespace mla::cpu
