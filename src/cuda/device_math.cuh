#pragma once
// Device conversions shared by the kernels: bf16, fp8 e4m3 (cuda_fp8.h's satfinite RNE, which
// the host conversions in formats.cpp match bit for bit), MXFP4 E2M1 + E8M0.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace mla::cuda {

// v (the same in every lane of the warp: a warp or warpgroup index) through a shuffle from lane 0,
// so ptxas knows it is warp-uniform: a branch on it around wgmma is not divergent (else ptxas
// serializes every wgmma of the kernel, C7520), and what derives from it (descriptors) stays in
// uniform registers (the many-rows kernels: R2UR 110 -> 22 a pair at 64 rows, D 1.8-3.1% faster, s17d, s17e).
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }
// The same for a pointer (TmaTiles::issue's tensor map: kept in uniform registers across its box loop).
template <class T>
__device__ __forceinline__ T* warp_uniform(T* ptr) {
  const uint64_t a = reinterpret_cast<uint64_t>(ptr);
  return reinterpret_cast<T*>(uint64_t(uint32_t(warp_uniform(int(uint32_t(a))))) |
                              uint64_t(uint32_t(warp_uniform(int(uint32_t(a >> 32))))) << 32);
}

// 2^x by one MUFU.EX2, subnormal results flushed to zero. exp2f (without -ftz) wraps the same
// instruction in a subnormal fix-up (a compare and two multiplies): softmax weights below 2^-126
// are nothing beside the row's largest (>= 2^-8 with the lazy rescale) and its sum; they round to 0
// in an f16 P anyway (a bf16 P, attend_rows_bf16.cu, would keep them, at ~2^-118 of the sum).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// A weight load that is used once (the projections' weight streams): read-only path, not kept in L1.
__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ float bf16_to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }
__device__ __forceinline__ uint16_t float_to_bf16(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

__device__ __forceinline__ uint8_t float_to_fp8(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float fp8_to_float(uint8_t bits) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3)));
}

// E2M1 magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, sign in bit 3.
__device__ __forceinline__ float e2m1_to_float(uint32_t nibble) {
  const uint32_t mag = nibble & 7u;
  // 2 * value is an integer {0, 1, 2, 3, 4, 6, 8, 12}: a nibble each, packed in one word.
  const float twice = float((0xC8643210u >> (4u * mag)) & 0xFu);
  return (nibble & 8u) ? -0.5f * twice : 0.5f * twice;
}
// 2^(e - 127); e = 0 is the subnormal 2^-127, 0xFF is NaN.
__device__ __forceinline__ float e8m0_to_float(uint32_t e) {
  if (e == 0xFFu) return __uint_as_float(0x7FC00000u);
  if (e == 0u) return __uint_as_float(0x00400000u);
  return __uint_as_float(e << 23);
}

// Global position of local cache index j on DCP rank r (SPEC.md, DCP).
__device__ __forceinline__ int64_t dcp_global_position(int64_t j, int size, int rank, int interleave) {
  return (j / interleave) * int64_t(size) * interleave + int64_t(rank) * interleave + j % interleave;
}
// Local length on rank r of a request whose global length is lg.
__device__ __forceinline__ int64_t dcp_local_length(int64_t lg, int size, int rank, int interleave) {
  // Without DCP every key is local: no 64-bit division between the length's load and the key range.
  if (size == 1) return lg;
  const int64_t base = (lg / (int64_t(interleave) * size)) * interleave;
  const int64_t rest = lg - base * size - int64_t(rank) * interleave;
  return base + (rest < 0 ? 0 : (rest > interleave ? interleave : rest));
}

}  // namespace mla::cuda
