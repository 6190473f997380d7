#pragma once
// A single-warpgroup probe of the wgmma building blocks (src/cuda/wgmma.cuh) for the GPU tests:
// S = Q K^T for one 64-key tile with K = 576, on the fp8 tensor cores, from row-major device
// buffers re-laid into the K-major core-matrix tiles attend will use. Not part of any step.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

// q: [64, 576] e4m3 (row stride q_stride bytes), k: [64, 576] e4m3 (row stride k_stride bytes),
// s: [64, 64] f32 row-major. steps_per_group: k32 steps accumulated in the tensor core before the
// partial is added to an f32 total in registers (18 = one chain; the fp8 tensor-core accumulator
// is narrower than f32, see tests/gpu/test_wgmma.cpp).
void qgmma_qk_probe(const uint8_t* q, int64_t q_stride, const uint8_t* k, int64_t k_stride, float* s,
                    int steps_per_group, cudaStream_t stream);

// The same product with both tiles brought by TMA in the 128-byte swizzle (tma.cuh) and QGMMA on
// swizzled descriptors: q_map / k_map are tensor maps over byte matrices with 576-byte rows and
// 64-row boxes (make_tensor_map_bytes_sw128); the tiles are rows q_row .. +63 and k_row .. +63.
// One chain over K = 576. *ok (device) is set to 0 if the loads did not complete (a hang otherwise).
// H200 (session 4): rel L2 4.5e-4, as the no-swizzle probe's one chain.
void qgmma_qk_probe_tma(const CUtensorMap& q_map, int q_row, const CUtensorMap& k_map, int k_row, float* s,
                        int* ok, cudaStream_t stream);

// The many-rows kernel's p.v (docs/attention.md, "Plan for the many-rows kernel"), NOT yet run on a
// GPU: O [64, 64] = P [64, 64] . V [64 keys, 64 dims] with P taken by each thread in the m64n64
// accumulator layout (as q.k leaves it), turned into f16 A fragments in registers, and V in f16 as
// an MN-major B operand (no swizzle: core matrices of 8 keys x 8 dims, 128 bytes; dim blocks 1024
// bytes apart, key blocks 128), four HGMMA m64n64k16 with imm-trans-b. `swap` = 1 puts the dim
// blocks' stride in the descriptor's leading-offset field and the key blocks' in the stride field
// (the other reading of the PTX ISA's MN-major fields). p: [64, 64] f32 row-major, v: [64, 64] f16
// (raw bits) row-major (keys x dims), o: [64, 64] f32 row-major.
void hgmma_pv_probe(const float* p, const uint16_t* v, float* o, int swap, cudaStream_t stream);

}  // namespace mla::cuda
