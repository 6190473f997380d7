#pragma once
// m / d by a multiply and a shift, for the small non-negative m of a kernel's prologue and epilogue
// (query rows: m < 2^16), where a division by a runtime d is ~20 dependent instructions (I2F,
// MUFU.RCP, corrections). The host computes the magic once; host-tested (tests/gpu/test_fast_div.cpp).
#include <cstdint>

#include "mla/host_device.hpp"

namespace mla::cuda {

// ceil(2^32 / d), d >= 1. With magic = (2^32 + e) / d, 0 <= e < d: m * magic / 2^32 = m / d +
// m e / (d 2^32), whose floor is floor(m / d) while m e < 2^32, so for every m with m d < 2^32.
MLA_HD uint64_t div_magic(uint32_t d) { return ((uint64_t(1) << 32) + d - 1) / d; }
MLA_HD int fast_div(int m, uint64_t magic) { return int((uint64_t(uint32_t(m)) * magic) >> 32); }

}  // namespace mla::cuda

