#pragma once
// MXFP4 weight products on the tensor cores (mma.sync m16n8k16, bf16 in, f32 sums) for pre's W_UK
// and post's W_UV at 16+ tokens, where the CUDA-core kernels (query_kernel, post_kernel: a weight
// row decoded for at most 8 tokens, FMAs fed from shared memory) fall far behind: at 64 tokens x
// 128 heads 124 and 388 us against ~5-10 for the weights' and partials' bytes (ncu, H200, session 26).
//
// Products are tokens (M = 16) x weight rows (N = 8 a tile) over the weight row's dim (K). A
// weight row is stored as 32-value blocks, four code words of 8 nibbles each (element e of word w
// at bits 4e: value 8w + e) and one E8M0 scale. Since a product sums over K in any order, the two
// k16 steps of a block take its values in the order that lets lane (g, c) of the MMA decode one
// code word (word c) into both steps' B fragments:
//   step s, B slots 2c, 2c + 1  <- values 8c + 4s, 8c + 4s + 1
//   step s, B slots 2c + 8, 2c + 9 <- values 8c + 4s + 2, 8c + 4s + 3
// and the A fragments (activations, row-major, token rows g and g + 8) follow the same order:
// lane (g, c) needs values 8c .. 8c + 7 of the block from both of its rows.
// A weight value e2m1 x 2^(E - 127) is exact in bf16 (one mantissa bit, bf16's exponent range
// but for E8M0 scales below 2^-126, far from any trained weight); bf16 x bf16 products are exact in
// f32, so only the f32 summation order differs from the CPU's (and, for post, the activations' hi
// + lo split below).
#include <cstdint>

#include "cuda/device_math.cuh"
#include "cuda/mxfp4_bits.hpp"
#include "cuda/ptx.cuh"

namespace mla::cuda::mxfp4 {

constexpr int kBlock = 32;  // values a scale covers: two k16 steps

// Code word c of a block and the block's scale as both steps' B fragments (b[s][0], b[s][1]), in
// bf16 bits without floats (mxfp4_bits.hpp: ~30 instructions a word; through e2m1_to_float and f32
// products ~60, most of a warp's work a block at D, ncu in session 27), then one exact bf16x2
// product by the scale.
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ void b_fragments(uint32_t word, uint32_t scale_bits, uint32_t (&b)[2][2]) {
  word_bf16x2(word, scale_bits,
              [&](int k, uint32_t pair, uint32_t scale) { b[k >> 1][k & 1] = bf16x2_mul(pair, scale); });
}

// Lane (g, c)'s A fragments of a block's two steps from its rows' 8 values (x0: row g, x1: row
// g + 8; values 8c .. 8c + 7 of the block), as bf16 (a[s][0..3] in mma.sync's order).
__device__ __forceinline__ void a_fragments(const float (&x0)[8], const float (&x1)[8], uint32_t (&a)[2][4]) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    a[s][0] = ptx::pack_bf16x2(x0[4 * s], x0[4 * s + 1]);
    a[s][1] = ptx::pack_bf16x2(x1[4 * s], x1[4 * s + 1]);
    a[s][2] = ptx::pack_bf16x2(x0[4 * s + 2], x0[4 * s + 3]);
    a[s][3] = ptx::pack_bf16x2(x1[4 * s + 2], x1[4 * s + 3]);
  }
}

// f32 activations as hi + lo bf16 pairs (x - hi rounded again): two MMAs a step keep ~16 of f32's
// 24 mantissa bits, where one bf16 rounding (8 bits) would put ~2e-3 into post's out. (lo of an
// infinity is 0, so it stays an infinity rather than inf - inf = NaN.)
__device__ __forceinline__ void split_hi_lo(const float (&x)[8], float (&hi)[8], float (&lo)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    hi[e] = round_bf16(x[e]);
    lo[e] = fabsf(x[e]) < INFINITY ? x[e] - hi[e] : 0.0f;
  }
}

// The 8 floats at p (16-byte aligned shared memory) into x.
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 u = *reinterpret_cast<const float4*>(p), v = *reinterpret_cast<const float4*>(p + 4);
  x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w, x[4] = v.x, x[5] = v.y, x[6] = v.z, x[7] = v.w;
}

}  // namespace mla::cuda::mxfp4
