#pragma once
// The inner kernels of the CPU attend stage (attend.cpp), one set per instruction set: AVX2 + FMA
// (attend_avx2.cpp, the x86-64 floor of this project) and AVX-512 (attend_avx512.cpp, compiled
// with function target attributes and chosen at run time where the CPU has it). Every set computes
// the same thing in fp32; they differ only in the order of the additions.
#include <cstdint>

#include "core/softmax_state.hpp"
#include "mla/tensor.hpp"

namespace mla::cpu {

// Keys of a block padded to this multiple with -inf before softmax_block (the widest vector).
inline constexpr int kScorePad = 16;

struct AttendKernels {
  const char* name;
  // One cache row of `width` values (fp8_e4m3 or bf16, inner stride `stride`) -> fp32 dst,
  // times scale (k_scale for fp8, 1 for bf16).
  void (*dequant_row)(DType dtype, const void* row, int64_t stride, int width, float scale, float* dst);
  // s[r][k] = q[r] . key[k] over n dims, r < rows, k < keys (n % 16 == 0).
  void (*scores)(const float* q, int64_t q_ld, int rows, const float* key, int64_t k_ld, int keys, int n,
                 float* s, int64_t s_ld);
  // Folds one row's scores s[0, keys) (padded with -inf to a multiple of kScorePad) into its state:
  // s becomes the weights exp(s - m) and acc [width] is rescaled when the max grows.
  void (*softmax_block)(float* s, int keys, SoftmaxState& st, float* acc, int width);
  // acc[r][0, width) += sum_k p[r][k] * v[k][0, width), r < rows, k < keys (width % 64 == 0).
  void (*pv)(const float* p, int64_t p_ld, int rows, const float* v, int64_t v_ld, int keys, int width,
             float* acc, int64_t a_ld);

  // Optional trio (null where the CPU lacks AVX512-BF16), used together in place of dequant_row,
  // scores and pv. fp8 codes and bf16 values are exact in bf16, so a block of keys is kept once as
  // raw bf16 values (fp8: the code's value, unscaled): the scores take them with bf16 dot products
  // (fp32 accumulation, products exact) at twice the fp32 rate, P.V widens them to fp32 exactly,
  // and the caller applies the scales afterwards (scores: q_mul * k_scale; o: k_scale):
  //   bf16_row:    row -> k [width] raw bf16 values;
  //   scores_bf16: s[r][k] = q[r] . key[k] on raw bf16 values (n % 32 == 0);
  //   pv_bf16:     as pv, v in raw bf16 values.
  void (*bf16_row)(DType dtype, const void* row, int64_t stride, int width, uint16_t* k) = nullptr;
  void (*scores_bf16)(const uint16_t* q, int64_t q_ld, int rows, const uint16_t* key, int64_t k_ld, int keys,
                      int n, float* s, int64_t s_ld) = nullptr;
  void (*pv_bf16)(const float* p, int64_t p_ld, int rows, const uint16_t* v, int64_t v_ld, int keys, int width,
                  float* acc, int64_t a_ld) = nullptr;
};

const AttendKernels& attend_kernels_avx2();
// Null where the CPU lacks AVX-512 F/BW/VL/DQ (and AVX512-BF16 for the second, the set with the
// bf16 score pair).
const AttendKernels* attend_kernels_avx512();
const AttendKernels* attend_kernels_avx512_bf16();
// The widest set this CPU runs, unless a test forced one with set_attend_kernels_for_testing.
const AttendKernels& attend_kernels();
// Tests: run every later attend with `k` (null: back to the automatic choice). Not thread-safe.
void set_attend_kernels_for_testing(const AttendKernels* k);

}  // namespace mla::cpu
