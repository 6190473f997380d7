#pragma once
// MXFP4 matrix-vector products by hand (W_UK in pre, W_UV in post). The weights are 4 bits an
// element, so each row is decoded once in registers (a 16-entry lookup, times the block scale)
// and multiplied into every token's vector while it is hot; fp32 accumulation.
#include <cstdint>

namespace mla::cpu {

// dots[t * dots_stride] = sum_c row[c] * x[t * x_stride + c] for t < tokens, where row is one
// MXFP4 row of `cols` elements (cols a multiple of 32): codes [cols/2] (first element in the low
// nibble), scales [cols/32] E8M0. x is fp32 and contiguous along c.
void mxfp4_row_dots(const uint8_t* codes, const uint8_t* scales, int cols, const float* x, int64_t x_stride,
                    int tokens, float* dots, int64_t dots_stride);

}  // namespace mla::cpu
