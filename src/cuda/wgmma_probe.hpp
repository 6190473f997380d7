#pragma once
// A single-warpgroup probe of the wgmma building blocks (src/cuda/wgmma.cuh) for the GPU tests:
// S = Q K^T for one 64-key tile with K = 576, on the fp8 tensor cores, from row-major device
// buffers re-laid into the K-major core-matrix tiles attend will use. Not part of any step.
#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

// q: [64, 576] e4m3 (row stride q_stride bytes), k: [64, 576] e4m3 (row stride k_stride bytes),
// s: [64, 64] f32 row-major. leading_bytes / stride_bytes: the descriptors' byte offsets (along
// K / between 8-row groups): the layout's are 1024 / 128; the test also tries them swapped.
void qgmma_qk_probe(const uint8_t* q, int64_t q_stride, const uint8_t* k, int64_t k_stride, float* s,
                    uint32_t leading_bytes, uint32_t stride_bytes, cudaStream_t stream);

}  // namespace mla::cuda
