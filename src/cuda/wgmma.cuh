#pragma once
// Hopper warpgroup MMA (wgmma, sm_90a) for issue 5's attend: shared-memory matrix descriptors, the
// fences around the asynchronous MMA, and q.k on the fp8 tensor cores (QGMMA m64n64k32 e4m3).
// mma.sync with e4m3 operands is emulated on sm_90 (docs/attention.md, v4): only wgmma reaches the
// fp8 tensor cores. tests/gpu/test_wgmma.cpp checks the layout and the fp8 accumulator's precision
// on the GPU (H200, session 3: layout right; one chain over K = 576 loses ~4.6e-4 relative).
#include <cstdint>

namespace mla::cuda::wgmma {

// K-major operand tiles without swizzle are made of core matrices of 8 rows x 16 bytes (128
// contiguous bytes). Our 64-row tiles keep the core matrices of one 16-byte K chunk together:
// row r, chunk k at k * kChunkStride + (r / 8) * 128 + (r % 8) * 16. A k32 (fp8) step reads two
// chunks: the descriptor's leading byte offset (along K) is kChunkStride, its stride byte offset
// (between 8-row groups) 128, and the start address advances 2 * kChunkStride a step.
constexpr int kTileRows = 64;
constexpr int kChunkStride = kTileRows / 8 * 128;  // 1024 bytes
__host__ __device__ constexpr int kmajor_offset(int row, int chunk) {
  return chunk * kChunkStride + (row / 8) * 128 + (row % 8) * 16;
}

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading
// and stride byte offsets (all >> 4, 14 bits each), base offset 0, swizzle mode 0 (none).
__device__ __forceinline__ uint64_t descriptor(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return uint64_t((smem_addr >> 4) & 0x3FFF) | uint64_t((leading_bytes >> 4) & 0x3FFF) << 16 |
         uint64_t((stride_bytes >> 4) & 0x3FFF) << 32;
}

// The same for K-major tiles in the 128-byte swizzle TMA writes (atoms of 8 rows x 128 bytes, 16-byte
// chunk c of row r at chunk c ^ (r % 8), atoms 1024 bytes apart along the rows): the leading offset
// is unused inside an atom (1), the stride offset 1024, layout type 1 (bits 62-63); a k32 step
// inside an atom advances the start address by 32 bytes (checked on the H200 by
// tests/gpu/test_wgmma.cpp, Wgmma.TmaSwizzledQgmmaMatchesFloat64).
__device__ __forceinline__ uint64_t descriptor_sw128(uint32_t smem_addr) {
  return uint64_t((smem_addr >> 4) & 0x3FFF) | uint64_t(1) << 16 | uint64_t(1024 >> 4) << 32 | uint64_t(1) << 62;
}

// The descriptor of the same layout `bytes` further on: the start address is the low 14 bits (>> 4)
// and shared memory ends below 2^18 bytes, so the add never carries out of the field.
__device__ __forceinline__ uint64_t advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = uint32_t(desc) + (bytes >> 4), hi = uint32_t(desc >> 32);
  return uint64_t(hi) << 32 | lo;
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Ordinary stores (st.shared, cp.async) that a wgmma reads next: each writing thread, before the
// barrier that publishes them (the tensor cores read through the async proxy).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The 32 accumulator operands of an m64n64 wgmma (inline asm outputs %0 .. %31).
#define MLA_WGMMA_D32(d)                                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),     \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),    \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// The 16 of an m64n32 wgmma (%0 .. %15).
#define MLA_WGMMA_D16(d)                                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])

// d (64 x 64 f32, this thread's 32 values) (+)= A (64 x 32 e4m3, K-major) * B (64 x 32 e4m3,
// K-major)^T. Thread t of the warpgroup holds, for n8 block j and r in 0..3, d[4j + r] =
// D[16 (t / 32) + (t % 32) / 4 + 8 (r / 2)][8 j + 2 (t % 4) + r % 2] (the mma.sync C layout per
// warp and n8 block). accumulate = false overwrites d.
__device__ __forceinline__ void mma_m64n64k32_e4m3(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_D32(d)
      : "l"(a), "l"(b), "r"(int32_t(accumulate)));
}

// Keeps the compiler from moving reads or writes of accumulator registers across the asynchronous
// MMA that owns them (CUTLASS warpgroup_fence_operand): after wait<>(), before the values are used.
template <int n>
__device__ __forceinline__ void fence_operand(float (&r)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// d (64 x 32 f32, 16 a thread, the layout above with n8 blocks j < 4) (+)= A (64 x 32 e4m3, K-major,
// smem) * B (32 x 32 e4m3, K-major, smem)^T: the many-rows kernel's q.k (attend_rows.cu).
__device__ __forceinline__ void mma_m64n32k32_e4m3(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_D16(d)
      : "l"(a), "l"(b), "r"(int32_t(accumulate)));
}

// The 12 of an m64n24 wgmma (%0 .. %11) and the 24 of an m64n48 one (%0 .. %23).
#define MLA_WGMMA_D12(d)                                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
#define MLA_WGMMA_D24(d)                                                                                    \
  MLA_WGMMA_D12(d), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),  \
      "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])

// The same at N = 24 (12 a thread, n8 blocks j < 3): the 48-row many-rows kernel's q.k.
__device__ __forceinline__ void mma_m64n24k32_e4m3(float (&d)[12], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %14, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n24k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, %12, %13, p, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_D12(d)
      : "l"(a), "l"(b), "r"(int32_t(accumulate)));
}

// The same at N = 48 (24 a thread, n8 blocks j < 6): the 48-row many-rows kernel's q.k split by tile
// (attend_rows.cu, kSplitQk).
__device__ __forceinline__ void mma_m64n48k32_e4m3(float (&d)[24], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23}, %24, %25, p, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_D24(d)
      : "l"(a), "l"(b), "r"(int32_t(accumulate)));
}

// d (64 x 16 f32, 8 a thread) (+)= A (64 x 32 e4m3, K-major, smem) * B (16 x 32 e4m3, K-major,
// smem)^T. Thread t: d[4j + r] = D[16 (t / 32) + (t % 32) / 4 + 8 (r / 2)][8 j + 2 (t % 4) + r % 2].
__device__ __forceinline__ void mma_m64n16k32_e4m3(float (&d)[8], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(int32_t(accumulate)));
}

// The same with A from registers (Tiles::kRows: key rows wgmma cannot read from shared memory):
// each warp its 16 rows of 32 bytes in the mma.sync m16n8k32 A layout, a[0..3] (lane (g, c): rows g
// and g + 8, bytes 4c .. 4c + 3 and 16 + 4c .. 16 + 4c + 3; what ldmatrix.x4 gives for the 8 x 16-byte
// blocks (rows 0-7, bytes 0-15), (8-15, 0-15), (0-7, 16-31), (8-15, 16-31)).
__device__ __forceinline__ void mma_m64n16k32_e4m3_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t b,
                                                      bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int32_t(accumulate)));
}

// d (64 x 16 f32) += A (64 x 16 f16 from registers: each warp its 16 rows in the mma.sync m16n8k16
// A layout, a[0..3]) * B (16 x 16 f16, K-major, smem)^T.
__device__ __forceinline__ void mma_m64n16k16_f16_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d (64 x 64 f32, 32 a thread, the m64n64 layout above) += A (64 x 16 f16 from registers, each warp
// its 16 rows in the mma.sync m16n8k16 A layout) * B (64 N x 16 K f16 in shared memory): K-major
// (kTransB = false: the many-rows kernel's p.v, attend_rows.cu, A = V^T, B = P^T) or MN-major (the
// 64 N values of a K row contiguous, imm-trans-b = 1: Wgmma.HgmmaMnMajorPvMatchesFloat64's V).
template <bool kTransB = false>
__device__ __forceinline__ void mma_m64n64k16_f16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n"
      "}\n"
      : MLA_WGMMA_D32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(kTransB)));
}

// The same at N = 48 (24 a thread, K-major B): the 48-row many-rows kernel's p.v.
__device__ __forceinline__ void mma_m64n48k16_f16_rs(float (&d)[24], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23}, "
      "{%24, %25, %26, %27}, %28, p, 1, 1, 0;\n"
      "}\n"
      : MLA_WGMMA_D24(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The same at N = 32 (16 a thread): the 32-row many-rows kernel's p.v.
__device__ __forceinline__ void mma_m64n32k16_f16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : MLA_WGMMA_D16(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// q.k of a many-rows warpgroup's kN rows (attend_rows.cu: half of a 64-, 48- or 32-row CTA, or all
// of a 48- or 32-row one where the warpgroups split q.k by tile).
template <int kN>
__device__ __forceinline__ void mma_qk_e4m3(float (&d)[kN / 2], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(kN == 48 || kN == 32 || kN == 24 || kN == 16, "q.k: N = 48, 32, 24 or 16");
  if constexpr (kN == 48) mma_m64n48k32_e4m3(d, a, b, accumulate);
  else if constexpr (kN == 32) mma_m64n32k32_e4m3(d, a, b, accumulate);
  else if constexpr (kN == 24) mma_m64n24k32_e4m3(d, a, b, accumulate);
  else mma_m64n16k32_e4m3(d, a, b, accumulate);
}

// The many-rows q.k with A (the 64 keys) from registers (attend_rows.cu's bulk row copies: rows
// wgmma cannot read from shared memory), in mma_m64n16k32_e4m3_rs's A layout, at N = 48 and 32 (the
// 48- and 32-row CTAs' q.k split by tile).
__device__ __forceinline__ void mma_m64n48k32_e4m3_rs(float (&d)[24], const uint32_t (&a)[4], uint64_t b,
                                                      bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %29, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_D24(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int32_t(accumulate)));
}
__device__ __forceinline__ void mma_m64n32k32_e4m3_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b,
                                                      bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_D16(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int32_t(accumulate)));
}
template <int kN>
__device__ __forceinline__ void mma_qk_e4m3_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  static_assert(kN == 48 || kN == 32, "q.k from registers: N = 48 or 32");
  if constexpr (kN == 48) mma_m64n48k32_e4m3_rs(d, a, b, accumulate);
  else mma_m64n32k32_e4m3_rs(d, a, b, accumulate);
}

// p.v of a many-rows CTA's kN rows (attend_rows.cu: 64, 48 or 32), K-major P^T.
template <int kN>
__device__ __forceinline__ void mma_pv_f16_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b) {
  static_assert(kN == 64 || kN == 48 || kN == 32, "p.v: N = 64, 48 or 32");
  if constexpr (kN == 64) mma_m64n64k16_f16_rs(d, a, b);
  else if constexpr (kN == 48) mma_m64n48k16_f16_rs(d, a, b);
  else mma_m64n32k16_f16_rs(d, a, b);
}

}  // namespace mla::cuda::wgmma
