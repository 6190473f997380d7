#pragma once
// Host conversions of the number formats, bit-exact with cuda_fp8.h / cuda_fp4.h / cuda_bf16.h.
//   bf16: round to nearest even from fp32, NaN -> canonical quiet NaN.
//   fp8 e4m3fn: round to nearest even, saturate to +-448, NaN stays NaN.
//   MXFP4 (OCP MX v1.0): blocks of 32 E2M1 elements sharing an E8M0 scale 2^(e-127).
// The decodes are inline table lookups or bit moves (they sit in the CPU stages' inner loops);
// the tables are built at compile time, so they are valid during static initialization too.
#include <array>
#include <bit>
#include <cstdint>
#include <span>

namespace mla {

namespace detail {
// fp8 e4m3fn code -> float. 0x7F / 0xFF (NaN) decode to the bits that cuda_fp8.h's host path gives
// through its half result (canonical half NaN 0x7FFF, sign dropped; __half2float makes 0x7FFFFFFF).
constexpr std::array<float, 256> make_fp8e4m3_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int exp = (c >> 3) & 0xF, man = c & 7;
    float mag;
    if ((c & 0x7F) == 0x7F) {
      t[c] = std::bit_cast<float>(0x7FFFFFFFu);
      continue;
    } else if (exp == 0) {
      mag = float(man) * (1.0f / 512.0f);  // subnormal: man * 2^-9
    } else {
      mag = float(8 + man) * std::bit_cast<float>(uint32_t(exp - 7 - 3 + 127) << 23);
    }
    t[c] = (c & 0x80) ? -mag : mag;
  }
  return t;
}
// E2M1 code (4 bits) -> float; code 8 is -0.
inline constexpr std::array<float, 16> kE2m1Table = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline constexpr std::array<float, 256> kFp8e4m3Table = make_fp8e4m3_table();
}  // namespace detail

inline float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }
// RNE; every NaN becomes 0x7FFF (cuda_bf16.h's host path); overflow rounds to +-inf.
inline uint16_t float_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

inline float fp8e4m3_to_float(uint8_t bits) { return detail::kFp8e4m3Table[bits]; }
// Saturating (satfinite): +-inf -> +-448; every NaN -> 0x7F (sign dropped, as cuda_fp8.h does);
// values that underflow keep their sign (-tiny -> 0x80).
uint8_t float_to_fp8e4m3(float x);

inline float e2m1_to_float(uint8_t nibble) { return detail::kE2m1Table[nibble & 0xF]; }  // low 4 bits used
// RNE, saturating to +-6 (inf too); NaN -> 0x7 (+6) as cuda_fp4.h does; underflow keeps the sign.
uint8_t float_to_e2m1(float x);
// 2^(e-127); e = 0 is 2^-127 (a float subnormal); 0xFF is NaN (0x7FFF0000, cuda_fp8.h's bf16 NaN).
inline float e8m0_to_float(uint8_t e) {
  if (e == 0) return std::bit_cast<float>(0x00400000u);
  if (e == 0xFF) return std::bit_cast<float>(0x7FFF0000u);
  return std::bit_cast<float>(uint32_t(e) << 23);
}

inline constexpr int kMxBlock = 32;
// Scale exponent of a block: floor(log2(amax)) - 2 clamped to E8M0; all-zero -> smallest scale
// (code 0). A non-finite amax gives the NaN scale 0xFF, so a block holding inf or NaN decodes
// to NaN rather than to a silently saturated finite value.
uint8_t mxfp4_scale_for_amax(float amax);
// Quantizes one block of 32 values: 16 bytes of codes (first element in the low nibble), 1 scale.
// Element i = float_to_e2m1(x[i] / 2^(scale-127)).
void quantize_mxfp4_block(std::span<const float, kMxBlock> x, std::span<uint8_t, kMxBlock / 2> codes,
                          uint8_t& scale);
// Dequantizes element i of a packed row.
inline float mxfp4_at(const uint8_t* codes, const uint8_t* scales, int64_t i) {
  const uint8_t byte = codes[i >> 1];
  return e2m1_to_float((i & 1) ? (byte >> 4) : (byte & 0xF)) * e8m0_to_float(scales[i / kMxBlock]);
}

}  // namespace mla
