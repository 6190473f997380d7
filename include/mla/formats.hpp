#pragma once
// Host conversions of the number formats, bit-exact with cuda_fp8.h / cuda_fp4.h / cuda_bf16.h.
//   bf16: round to nearest even from fp32, NaN -> canonical quiet NaN.
//   fp8 e4m3fn: round to nearest even, saturate to +-448, NaN stays NaN.
//   MXFP4 (OCP MX v1.0): blocks of 32 E2M1 elements sharing an E8M0 scale 2^(e-127).
#include <cstdint>
#include <span>

namespace mla {

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float x);
inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

float fp8e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8e4m3(float x);  // saturating (satfinite)

float e2m1_to_float(uint8_t nibble);  // low 4 bits used
uint8_t float_to_e2m1(float x);       // RNE, saturating to +-6
float e8m0_to_float(uint8_t e);       // 2^(e-127); 0xFF is NaN

inline constexpr int kMxBlock = 32;
// Scale exponent of a block: floor(log2(amax)) - 2 clamped to E8M0; all-zero -> smallest scale.
uint8_t mxfp4_scale_for_amax(float amax);
// Quantizes one block of 32 values: 16 bytes of codes (first element in the low nibble), 1 scale.
void quantize_mxfp4_block(std::span<const float, kMxBlock> x, std::span<uint8_t, kMxBlock / 2> codes,
                          uint8_t& scale);
// Dequantizes element i of a packed row.
inline float mxfp4_at(const uint8_t* codes, const uint8_t* scales, int64_t i) {
  const uint8_t byte = codes[i >> 1];
  return e2m1_to_float((i & 1) ? (byte >> 4) : (byte & 0xF)) * e8m0_to_float(scales[i / kMxBlock]);
}

}  // namespace mla
