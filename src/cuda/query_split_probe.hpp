#pragma once
// A probe of the 16-row kernel's bf16-query split (SplitQueryTile, attend_wgmma_tiles.cuh) for the
// GPU tests: one CTA loads the query rows m_base .. m_base + 15 of request b as the kernel does and
// writes the 32-row e4m3 B tile it stores (hi rows 0..15, lo rows 16..31, b_offset_n<32> layout:
// 32 x 576 bytes) and the rows' exponents (16 int32) to device memory. Not part of any step.
#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

struct AttendParams;
// p: q (bf16), q_s_stride, q_h_stride, qlen, heads as attend takes them (heads_magic is set here).
void query_split_probe(const AttendParams& p, int b, int m_base, uint8_t* tile, int32_t* exps, cudaStream_t stream);

}  // namespace mla::cuda
