#pragma once
// A single-warpgroup probe of the wgmma building blocks (src/cuda/wgmma.cuh) for the GPU tests:
// S = Q K^T for one 64-key tile with K = 576, on the fp8 tensor cores, from row-major device
// buffers re-laid into the K-major core-matrix tiles attend will use. Not part of any step.
#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

// q: [64, 576] e4m3 (row stride q_stride bytes), k: [64, 576] e4m3 (row stride k_stride bytes),
// s: [64, 64] f32 row-major. steps_per_group: k32 steps accumulated in the tensor core before the
// partial is added to an f32 total in registers (18 = one chain; the fp8 tensor-core accumulator
// is narrower than f32, see tests/gpu/test_wgmma.cpp).
void qgmma_qk_probe(const uint8_t* q, int64_t q_stride, const uint8_t* k, int64_t k_stride, float* s,
                    int steps_per_group, cudaStream_t stream);

}  // namespace mla::cuda
