// The AVX-512 kernels of the CPU attend stage (attend_kernels.hpp), for CPUs that have
// AVX-512 F/BW/VL/DQ (chosen at run time; the rest of the library stays at the AVX2 floor, so
// every function here carries the target attribute instead of the file being compiled with it).
// fp32 arithmetic, like the AVX2 set; 32 zmm registers allow wider tiles: 4 query rows x 6 keys
// for the scores (24 accumulators), 6 rows x 64 columns for P.V (24 accumulators). With
// AVX512-BF16 the keys stay raw bf16 values (exact for fp8 and bf16 caches): the scores take them
// with vdpbf16ps, P.V widens them to fp32 in registers (fp32 FMAs, as without BF16).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/attend_kernels.hpp"
#include "mla/formats.hpp"

// GCC 12 warns that the intrinsics' own _mm512_undefined_* placeholders are uninitialized once they
// are inlined into target-attribute functions (GCC bug 105593, fixed in GCC 13): not our variables.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define MLA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define MLA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

namespace mla::cpu {
namespace {

// fp8 e4m3fn -> fp32 for 32 codes, the bit move of attend_avx2.cpp's dequant_fp8_16 (the code as
// an fp16 is the value times 2^-8; NaN codes get an all-ones exponent).
MLA_AVX512 inline void dequant_fp8_32(const uint8_t* src, __m512 scale256, float* dst) {
  const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi16(0x7F));
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0x80)), 8);
  __m512i h = _mm512_or_si512(sign, _mm512_slli_epi16(mag, 7));
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7F));
  h = _mm512_mask_mov_epi16(h, nan, _mm512_or_si512(h, _mm512_set1_epi16(0x7C00)));
  _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), scale256));
  _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), scale256));
}

// 16 values of a row as fp32: fp32 as they are, raw bf16 widened exactly (the bits to the top half).
MLA_AVX512 inline __m512 load16(const float* src) { return _mm512_loadu_ps(src); }
MLA_AVX512 inline __m512 load16(const uint16_t* src) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

MLA_AVX512 void dequant_row(DType dtype, const void* row, int64_t stride, int width, float scale, float* dst) {
  if (dtype == DType::fp8_e4m3) {
    const uint8_t* src = static_cast<const uint8_t*>(row);
    if (stride == 1 && width % 32 == 0) {
      const __m512 scale256 = _mm512_set1_ps(scale * 256.0f);
      for (int c = 0; c < width; c += 32) dequant_fp8_32(src + c, scale256, dst + c);
    } else {
      for (int c = 0; c < width; ++c) dst[c] = fp8e4m3_to_float(src[c * stride]) * scale;
    }
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(row);
    if (stride == 1 && width % 16 == 0) {
      for (int c = 0; c < width; c += 16) _mm512_storeu_ps(dst + c, load16(src + c));
    } else {
      for (int c = 0; c < width; ++c) dst[c] = bf16_to_float(src[c * stride]);
    }
  }
}

// s[r][k] = q[r] . key[k] for an NR x NK tile over n dims (n % 16 == 0); unrolled by pragmas so
// the accumulators stay in registers.
template <int NR, int NK>
MLA_AVX512 void score_tile(const float* q, int64_t q_ld, const float* key, int64_t k_ld, int n, float* s,
                           int64_t s_ld) {
  __m512 acc[NR][NK];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < NK; ++k) acc[r][k] = _mm512_setzero_ps();
  for (int d = 0; d < n; d += 16) {
    __m512 kv[NK];
#pragma GCC unroll 8
    for (int k = 0; k < NK; ++k) kv[k] = _mm512_loadu_ps(key + k * k_ld + d);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512 qv = _mm512_loadu_ps(q + r * q_ld + d);
#pragma GCC unroll 8
      for (int k = 0; k < NK; ++k) acc[r][k] = _mm512_fmadd_ps(qv, kv[k], acc[r][k]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < NK; ++k) s[r * s_ld + k] = _mm512_reduce_add_ps(acc[r][k]);
}

using ScoreTile = void (*)(const float*, int64_t, const float*, int64_t, int, float*, int64_t);
template <int NR>
constexpr ScoreTile kScoreRow[6] = {score_tile<NR, 1>, score_tile<NR, 2>, score_tile<NR, 3>,
                                    score_tile<NR, 4>, score_tile<NR, 5>, score_tile<NR, 6>};
constexpr const ScoreTile* kScoreTiles[4] = {kScoreRow<1>, kScoreRow<2>, kScoreRow<3>, kScoreRow<4>};

void scores(const float* q, int64_t q_ld, int rows, const float* key, int64_t k_ld, int keys, int n, float* s,
            int64_t s_ld) {
  for (int r = 0; r < rows; r += 4) {
    const int nr = std::min(4, rows - r);
    for (int k = 0; k < keys; k += 6) {
      const int nk = std::min(6, keys - k);
      kScoreTiles[nr - 1][nk - 1](q + r * q_ld, q_ld, key + k * k_ld, k_ld, n, s + r * s_ld + k, s_ld);
    }
  }
}

// acc[r][0, 16*NV) += sum_k p[r][k] * v[k][0, 16*NV) for NR rows; v in fp32, or in raw bf16 values
// (widened exactly: the pv_bf16 of the AVX512-BF16 set).
template <int NR, int NV, typename V>
MLA_AVX512 void pv_tile(const float* p, int64_t p_ld, const V* v, int64_t v_ld, int keys, float* acc,
                        int64_t a_ld) {
  __m512 a[NR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) a[r][j] = _mm512_loadu_ps(acc + r * a_ld + 16 * j);
  for (int k = 0; k < keys; ++k) {
    __m512 vv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) vv[j] = load16(v + k * v_ld + 16 * j);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * p_ld + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) a[r][j] = _mm512_fmadd_ps(pr, vv[j], a[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(acc + r * a_ld + 16 * j, a[r][j]);
}

template <typename V>
using PvTile = void (*)(const float*, int64_t, const V*, int64_t, int, float*, int64_t);
template <typename V>
constexpr PvTile<V> kPvWide[6] = {pv_tile<1, 4, V>, pv_tile<2, 4, V>, pv_tile<3, 4, V>,
                                  pv_tile<4, 4, V>, pv_tile<5, 4, V>, pv_tile<6, 4, V>};
template <typename V>
constexpr PvTile<V> kPvNarrow[6] = {pv_tile<1, 1, V>, pv_tile<2, 1, V>, pv_tile<3, 1, V>,
                                    pv_tile<4, 1, V>, pv_tile<5, 1, V>, pv_tile<6, 1, V>};

// AttendKernels::pv (V = float) and pv_bf16 (V = uint16_t).
template <typename V>
void pv(const float* p, int64_t p_ld, int rows, const V* v, int64_t v_ld, int keys, int width, float* acc,
        int64_t a_ld) {
  for (int r = 0; r < rows; r += 6) {
    const int nr = std::min(6, rows - r);
    int c = 0;
    for (; c + 64 <= width; c += 64)
      kPvWide<V>[nr - 1](p + r * p_ld, p_ld, v + c, v_ld, keys, acc + r * a_ld + c, a_ld);
    for (; c < width; c += 16) kPvNarrow<V>[nr - 1](p + r * p_ld, p_ld, v + c, v_ld, keys, acc + r * a_ld + c, a_ld);
  }
}

// exp(x) for 16 lanes: the Cephes expf of attend_avx2.cpp's exp8; 0 below the float range
// (-inf, the padding of a score row, included).
MLA_AVX512 inline __m512 exp16(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
  return _mm512_maskz_mov_ps(__mmask16(~underflow), y);
}

MLA_AVX512 void softmax_block(float* s, int keys, SoftmaxState& st, float* acc, int width) {
  const int padded = (keys + 15) & ~15;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int k = 0; k < padded; k += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + k));
  const float alpha = st.rescale(_mm512_reduce_max_ps(mx));
  if (alpha != 1.0f) {
    const __m512 a = _mm512_set1_ps(alpha);
    int c = 0;
    for (; c + 16 <= width; c += 16) _mm512_storeu_ps(acc + c, _mm512_mul_ps(a, _mm512_loadu_ps(acc + c)));
    for (; c < width; ++c) acc[c] *= alpha;
  }
  const __m512 m = _mm512_set1_ps(st.m);
  __m512 sum = _mm512_setzero_ps();
  for (int k = 0; k < padded; k += 16) {
    const __m512 w = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + k), m));
    _mm512_storeu_ps(s + k, w);
    sum = _mm512_add_ps(sum, w);
  }
  st.add(_mm512_reduce_add_ps(sum));
}

// ---- bf16 scores (AVX512-BF16) ----------------------------------------------------------------

// fp8 e4m3fn -> bf16 for 32 codes, exact: the 128 magnitudes' bf16 bits (NaN for 0x7F) from a
// table in four registers, two 64-entry vpermt2w selected by bit 6, then the code's sign to bit 15.
struct Fp8Bf16Table {
  alignas(64) uint16_t bits[128];
  Fp8Bf16Table() {
    for (int c = 0; c < 128; ++c) bits[c] = uint16_t(__builtin_bit_cast(uint32_t, fp8e4m3_to_float(uint8_t(c))) >> 16);
  }
};
const Fp8Bf16Table kFp8Bf16;

MLA_AVX512_BF16 inline __m512i fp8_to_bf16_32(const uint8_t* src, const __m512i t[4]) {
  const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  const __m512i lo = _mm512_permutex2var_epi16(t[0], v, t[1]);  // index bits 5..0
  const __m512i hi = _mm512_permutex2var_epi16(t[2], v, t[3]);
  const __m512i h = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(v, _mm512_set1_epi16(0x40)), lo, hi);
  // h | (v << 8 & 0x8000): the code's sign bit to bit 15.
  return _mm512_ternarylogic_epi32(h, _mm512_slli_epi16(v, 8), _mm512_set1_epi16(int16_t(0x8000)), 0xF8);
}

MLA_AVX512_BF16 void bf16_row(DType dtype, const void* row, int64_t stride, int width, uint16_t* k) {
  if (dtype == DType::fp8_e4m3) {
    const uint8_t* src = static_cast<const uint8_t*>(row);
    if (stride == 1 && width % 32 == 0) {
      const __m512i t[4] = {_mm512_load_si512(kFp8Bf16.bits), _mm512_load_si512(kFp8Bf16.bits + 32),
                            _mm512_load_si512(kFp8Bf16.bits + 64), _mm512_load_si512(kFp8Bf16.bits + 96)};
      for (int c = 0; c < width; c += 32) _mm512_storeu_si512(k + c, fp8_to_bf16_32(src + c, t));
      return;
    }
    for (int c = 0; c < width; ++c) {
      const float x = fp8e4m3_to_float(src[c * stride]);
      k[c] = uint16_t(__builtin_bit_cast(uint32_t, x) >> 16);  // exact: an fp8 value has 4 significant bits
    }
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(row);
  if (stride == 1) std::memcpy(k, src, sizeof(uint16_t) * size_t(width));
  else for (int c = 0; c < width; ++c) k[c] = src[c * stride];
}

template <int NR, int NK>
MLA_AVX512_BF16 void score_tile_bf16(const uint16_t* q, int64_t q_ld, const uint16_t* key, int64_t k_ld, int n,
                                     float* s, int64_t s_ld) {
  __m512 acc[NR][NK];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < NK; ++k) acc[r][k] = _mm512_setzero_ps();
  for (int d = 0; d < n; d += 32) {
    __m512bh kv[NK];
#pragma GCC unroll 8
    for (int k = 0; k < NK; ++k) kv[k] = (__m512bh)_mm512_loadu_si512(key + k * k_ld + d);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + r * q_ld + d);
#pragma GCC unroll 8
      for (int k = 0; k < NK; ++k) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], qv, kv[k]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < NK; ++k) s[r * s_ld + k] = _mm512_reduce_add_ps(acc[r][k]);
}

using ScoreTileBf16 = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int, float*, int64_t);
template <int NR>
constexpr ScoreTileBf16 kScoreRowBf16[6] = {score_tile_bf16<NR, 1>, score_tile_bf16<NR, 2>, score_tile_bf16<NR, 3>,
                                            score_tile_bf16<NR, 4>, score_tile_bf16<NR, 5>, score_tile_bf16<NR, 6>};
constexpr const ScoreTileBf16* kScoreTilesBf16[4] = {kScoreRowBf16<1>, kScoreRowBf16<2>, kScoreRowBf16<3>,
                                                     kScoreRowBf16<4>};

void scores_bf16(const uint16_t* q, int64_t q_ld, int rows, const uint16_t* key, int64_t k_ld, int keys, int n,
                 float* s, int64_t s_ld) {
  // Keys in chunks of 18 (three tiles, 20 KiB of bf16 at n = 576) that every row tile takes from
  // L1, rather than each row tile streaming the whole block from L2.
  constexpr int kChunk = 18;
  for (int k0 = 0; k0 < keys; k0 += kChunk) {
    const int kend = std::min(keys, k0 + kChunk);
    for (int r = 0; r < rows; r += 4) {
      const int nr = std::min(4, rows - r);
      for (int k = k0; k < kend; k += 6) {
        const int nk = std::min(6, kend - k);
        kScoreTilesBf16[nr - 1][nk - 1](q + r * q_ld, q_ld, key + k * k_ld, k_ld, n, s + r * s_ld + k, s_ld);
      }
    }
  }
}

}  // namespace

namespace {
bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return yes;
}
}  // namespace

const AttendKernels* attend_kernels_avx512() {
  static const AttendKernels k{.name = "avx512",
                               .dequant_row = dequant_row,
                               .scores = scores,
                               .softmax_block = softmax_block,
                               .pv = pv<float>};
  return has_avx512() ? &k : nullptr;
}

const AttendKernels* attend_kernels_avx512_bf16() {
  static const AttendKernels k{.name = "avx512-bf16",
                               .dequant_row = dequant_row,
                               .scores = scores,
                               .softmax_block = softmax_block,
                               .pv = pv<float>,
                               .bf16_row = bf16_row,
                               .scores_bf16 = scores_bf16,
                               .pv_bf16 = pv<uint16_t>};
  return has_avx512() && __builtin_cpu_supports("avx512bf16") ? &k : nullptr;
}

}  // namespace mla::cpu
