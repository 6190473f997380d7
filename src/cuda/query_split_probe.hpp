#pragma once
// A probe of the bf16-query split (SplitQueryTile, attend_wgmma_tiles.cuh) for the GPU tests: one CTA
// loads the query rows m_base .. m_base + rows - 1 of request b as a kernel does and writes the e4m3
// tile it stores and the rows' exponents (rows int32) to device memory. rows = 16: the 16-row
// kernel's 32-row B tile (hi rows 0..15, lo rows 16..31, b_offset_n<32>: 32 x 576 bytes); rows = 32:
// the many-rows kernel's (kQSplit, attend_rows_kernel.cuh): the hi rows' 32-row tile (b_offset_n<32>),
// then the lo rows' (2 x 32 x 576 bytes). Not part of any step.
#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda {

struct AttendParams;
// p: q (bf16), q_s_stride, q_h_stride, qlen, heads as attend takes them (heads_magic is set here).
void query_split_probe(const AttendParams& p, int b, int m_base, uint8_t* tile, int32_t* exps, cudaStream_t stream,
                       int rows = 16);

}  // namespace mla::cuda
