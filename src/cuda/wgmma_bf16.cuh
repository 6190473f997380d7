#pragma once
// The bf16 HGMMA forms of the bf16 many-rows attend kernel (attend_rows_bf16.cu): q.k as
// S [64 rows x 64 keys] (m64n64k16, the query from shared memory or, for its rope dims, registers)
// and p.v as O [64 rows x 256 dims] (m64n256k16, V MN-major: the cache rows as TMA wrote them).
#include <cstdint>

#include "cuda/wgmma.cuh"

namespace mla::cuda::wgmma {

// The same 128-byte swizzle as descriptor_sw128, read MN-major (imm-trans = 1): a K row (a key) is
// 64 contiguous N values (128 bytes: dims of one slab); 8-row groups along K are 1024 bytes apart
// (stride offset) and 64-value atoms along N `atom_stride` bytes apart (leading offset: the slabs).
// (CUTLASS's canonical MN-major SW128 layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)).)
__device__ __forceinline__ uint64_t descriptor_sw128_mn(uint32_t smem_addr, uint32_t atom_stride) {
  return uint64_t((smem_addr >> 4) & 0x3FFF) | uint64_t((atom_stride >> 4) & 0x3FFF) << 16 |
         uint64_t(1024 >> 4) << 32 | uint64_t(1) << 62;
}

// d (64 x 64 f32, 32 a thread: d[4j + r] = D[16 (t / 32) + (t % 32) / 4 + 8 (r / 2)][8 j + 2 (t % 4) + r % 2])
// (+)= A (64 x 16 bf16, K-major, smem) * B (64 N x 16 K bf16, K-major, smem)^T.
__device__ __forceinline__ void mma_m64n64k16_bf16(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : MLA_WGMMA_D32(d)
      : "l"(a), "l"(b), "r"(int32_t(accumulate)));
}

// The same with A from registers (each warp its 16 rows in the mma.sync m16n8k16 A layout), accumulating.
__device__ __forceinline__ void mma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : MLA_WGMMA_D32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The 16-row kernel's forms for a bf16 cache (attend_wgmma_kernel.cuh, kBf16): d (64 x 16 f32, 8 a
// thread, mma_m64n16k32_e4m3's layout) (+)= A (64 x 16 bf16) * B (16 N x 16 K bf16, K-major, smem),
// A from shared memory K-major (q.k: the keys as TMA wrote them) ...
__device__ __forceinline__ void mma_m64n16k16_bf16(float (&d)[8], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(int32_t(accumulate)));
}
// ... or MN-major (imm-trans-a = 1: p.v's V^T, 64 dims of a key row contiguous, descriptor_sw128_mn),
// accumulating.
__device__ __forceinline__ void mma_m64n16k16_bf16_ta(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b));
}

// The 128 accumulator operands of an m64n256 wgmma (inline asm outputs %0 .. %127).
#define MLA_WGMMA_D128(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), \
      "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), \
      "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), \
      "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), \
      "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), \
      "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), \
      "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), \
      "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), \
      "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// The 128 accumulator operands of an m64n256 wgmma in the instruction text ("{%0, ..., %127}, ").
#define MLA_WGMMA_D128_TEXT \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, " \
  "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, " \
  "%58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, " \
  "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, " \
  "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, " \
  "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, " \
  "%122, %123, %124, %125, %126, %127}, "

// Both forms below: an accumulating (scale-d = 1) m64n256k16 bf16 HGMMA up to its A operand.
#define MLA_HGMMA_M64N256_BF16                                 \
  "{\n"                                                        \
  ".reg .pred p;\n"                                            \
  "setp.ne.b32 p, 1, 0;\n"                                     \
  "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MLA_WGMMA_D128_TEXT

// d (64 x 256 f32, 128 a thread: d[4j + r] = D[16 (t / 32) + (t % 32) / 4 + 8 (r / 2)][8 j + 2 (t % 4) + r % 2])
// += A (64 x 16 bf16) * B (16 K x 256 N bf16, MN-major, smem: descriptor_sw128_mn), A from registers
// (each warp its 16 rows in the mma.sync m16n8k16 A layout) ...
__device__ __forceinline__ void mma_m64n256k16_bf16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      MLA_HGMMA_M64N256_BF16
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_D128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
// ... or from shared memory (K-major).
__device__ __forceinline__ void mma_m64n256k16_bf16_ss(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      MLA_HGMMA_M64N256_BF16
      "%128, %129, p, 1, 1, 0, 1;\n"
      "}\n"
      : MLA_WGMMA_D128(d)
      : "l"(a), "l"(b));
}

}  // namespace mla::cuda::wgmma
