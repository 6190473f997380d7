// The MXFP4 decode of the step's tensor-core products (src/cuda/mxfp4_bits.hpp: prmt tables for the
// magnitudes' bf16 bytes, a multiply for the signs, the E8M0 scale as bf16), the same functions
// mxfp4_mma.cuh's b_fragments runs, checked on the host (no GPU needed) bit for bit against the
// CPU backend's decode (mla/formats.hpp) for every 16-bit half of a code word and every scale.
// The device's bf16x2 product by the scale is emulated here as the exact float product (bf16 x a
// power of two); the kernels themselves are checked against the CPU by the GPU tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "cuda/mxfp4_bits.hpp"
#include "mla/formats.hpp"

namespace mla {
namespace {

namespace mx = cuda::mxfp4;

// The 8 values of `word` (value e at bits 4e) as the decode gives them: unscaled bf16 bits and the
// scale's bf16 bits (the same in both halves, checked).
struct Decoded {
  uint16_t value[8];
  uint16_t scale;
};
Decoded decode(uint32_t word, uint32_t scale_bits) {
  Decoded d{};
  mx::word_bf16x2(word, scale_bits, [&](int k, uint32_t pair, uint32_t scale) {
    d.value[2 * k] = uint16_t(pair & 0xFFFFu);
    d.value[2 * k + 1] = uint16_t(pair >> 16);
    EXPECT_EQ(scale & 0xFFFFu, scale >> 16) << "the scale's halves";
    d.scale = uint16_t(scale & 0xFFFFu);
  });
  return d;
}

TEST(Mxfp4Bits, BytePermIsPrmtsDefaultMode) {
  const uint32_t x = 0x33221100u, y = 0x77665544u;
  EXPECT_EQ(mx::byte_perm(x, y, 0x3210), x);
  EXPECT_EQ(mx::byte_perm(x, y, 0x7654), y);
  EXPECT_EQ(mx::byte_perm(x, y, 0x5140), 0x55114400u);
  EXPECT_EQ(mx::byte_perm(x, y, 0x0123), 0x00112233u);
  EXPECT_EQ(mx::byte_perm(x, y, 0x7362), 0x77336622u);
}

// Every 16-bit half word (4 values) in both halves of a word, with random other halves: the
// unscaled values are the bf16 of the CPU's e2m1 values, -0 included.
TEST(Mxfp4Bits, EveryHalfWordDecodesToTheCpuValues) {
  std::mt19937 rng(7);
  for (uint32_t half = 0; half < 65536; ++half) {
    for (const bool upper : {false, true}) {
      const uint32_t other = rng() & 0xFFFFu;
      const uint32_t word = upper ? half << 16 | other : other << 16 | half;
      const Decoded d = decode(word, 127);
      for (int e = 0; e < 8; ++e) {
        const uint8_t nibble = uint8_t((word >> (4 * e)) & 0xF);
        ASSERT_EQ(d.value[e], float_to_bf16(e2m1_to_float(nibble))) << "word " << std::hex << word << " value " << e;
      }
    }
  }
}

// Every E8M0 scale times every value: the product (exact in bf16: a power of two times a value of
// two significant bits) is the CPU's e2m1 x 2^(E - 127), rounded to bf16 as the CPU's product is
// before an MMA; E = 255 is NaN on both sides.
TEST(Mxfp4Bits, EveryScaleTimesEveryValueIsTheCpuProduct) {
  for (uint32_t e = 0; e < 256; ++e) {
    for (uint32_t nibble = 0; nibble < 16; ++nibble) {
      const uint32_t word = nibble * 0x11111111u;  // the nibble in all 8 places
      const Decoded d = decode(word, e);
      const float want = e2m1_to_float(uint8_t(nibble)) * e8m0_to_float(uint8_t(e));
      for (int v = 0; v < 8; ++v) {
        const float got = bf16_to_float(d.value[v]) * bf16_to_float(d.scale);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got)) << "E " << e << " nibble " << nibble;
        } else {
          ASSERT_EQ(float_to_bf16(got), float_to_bf16(want)) << "E " << e << " nibble " << nibble;
          ASSERT_EQ(got, bf16_to_float(float_to_bf16(got))) << "the product is exact in bf16: E " << e;
        }
      }
    }
  }
}

}  // namespace
}  // namespace mla
