#pragma once
// MXFP4 code words as bf16 bits without floating point: the arithmetic of mxfp4_mma.cuh's
// b_fragments (session 27), in functions the host compiles too, so a host test checks them bit for
// bit against the float decode (tests/gpu/test_mxfp4_bits.cpp, no GPU needed). A code word holds 8
// values, value e at bits 4e .. 4e + 3 (E2M1: sign in bit 3, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}).
#include <cstdint>

#include "mla/host_device.hpp"

namespace mla::cuda::mxfp4 {

// prmt's default mode for selectors whose nibbles are all below 8: byte i of the result is byte
// (s >> 4i) & 7 of y:x (x the low word). (A set bit 3 would replicate the byte's sign instead.)
MLA_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = uint64_t(y) << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}

// An E8M0 scale 2^(E - 127) as bf16 bits in both halves: E = 0 is bf16's subnormal 2^-127, 255 NaN
// (as e8m0_to_float); a bf16 product by it is exact.
MLA_HD uint32_t scale_bf16x2(uint32_t e) {
  const uint32_t bits = e == 0xFFu ? 0x7FC0u : e == 0u ? 0x0040u : e << 7;
  return bits | bits << 16;
}

// The word's values as bf16 bits, unscaled, in pairs: emit(k, pair, scale) gets values 2k (low
// half) and 2k + 1 for k = 0..3, and the scale's scale_bf16x2 (the device multiplies the two, the
// host test checks both). The magnitudes' high and low bytes come from two 8-entry tables by prmt
// (4 values an instruction); a pair's two signs (bits 3 and 7 of its byte) land on bits 15 and 31
// by one multiply of the masked word (two set bits, no carries). (One function with the product
// at each pair, in the order the kernels measured in session 27 were compiled from.)
template <class Emit>
MLA_HD void word_bf16x2(uint32_t word, uint32_t scale_bits, Emit&& emit) {
  // bf16 of {0, 0.5, 1, 1.5, 2, 3, 4, 6}: high bytes 00 3F 3F 3F 40 40 40 40, low 00 00 80 C0 00 40 80 C0
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u, kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
  const uint32_t top = word >> 16;
  const uint32_t sel0 = word & 0x7777u, sel1 = top & 0x7777u;  // the magnitudes
  const uint32_t hi0 = byte_perm(kHi0, kHi1, sel0), lo0 = byte_perm(kLo0, kLo1, sel0);  // values 0..3
  const uint32_t hi1 = byte_perm(kHi0, kHi1, sel1), lo1 = byte_perm(kLo0, kLo1, sel1);  // values 4..7
  // (bits 3, 7 of a half word to 15, 31; bits 11, 15 likewise)
  auto sign01 = [](uint32_t w) { return ((w & 0x88u) * 0x01001000u) & 0x80008000u; };
  auto sign23 = [](uint32_t w) { return ((w & 0x8800u) * 0x00010010u) & 0x80008000u; };
  const uint32_t scale = scale_bf16x2(scale_bits);
  emit(0, byte_perm(lo0, hi0, 0x5140) | sign01(word), scale);
  emit(1, byte_perm(lo0, hi0, 0x7362) | sign23(word), scale);
  emit(2, byte_perm(lo1, hi1, 0x5140) | sign01(top), scale);
  emit(3, byte_perm(lo1, hi1, 0x7362) | sign23(top), scale);
}

}  // namespace mla::cuda::mxfp4
