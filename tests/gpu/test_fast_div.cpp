// The multiply-shift division of the 16-row kernel (src/cuda/fast_div.hpp; s22e), checked
// on the host (no GPU needed) against the integer division it replaces: every divisor the query rows
// may be divided by (heads 1..1024) over every row index below 2^16, and the bound's corners.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/fast_div.hpp"

namespace mla {
namespace {

TEST(FastDiv, EveryHeadCountOverEveryRowBelow65536) {
  for (uint32_t d = 1; d <= 1024; ++d) {
    const uint64_t magic = cuda::div_magic(d);
    for (int m = 0; m < 65536; ++m) {
      if (cuda::fast_div(m, magic) != m / int(d)) {
        FAIL() << "fast_div(" << m << ", div_magic(" << d << ")) = " << cuda::fast_div(m, magic) << ", expected "
               << m / int(d);
      }
    }
  }
}

TEST(FastDiv, CornersOfTheBound) {
  // m d < 2^32 is the bound: the largest m for a few large d, and d = 1 (magic = 2^32).
  for (const uint32_t d : {1u, 2u, 3u, 7u, 641u, 65535u, 65536u, 1000003u}) {
    const uint64_t magic = cuda::div_magic(d);
    const uint64_t m_max = ((uint64_t(1) << 32) - 1) / d;
    for (const uint64_t m : {uint64_t(0), uint64_t(1), uint64_t(d - 1), uint64_t(d), m_max - 1, m_max}) {
      if (m > m_max || m > uint64_t(INT32_MAX)) continue;  // outside the bound m d < 2^32
      EXPECT_EQ(cuda::fast_div(int(m), magic), int(m / d)) << "m " << m << ", d " << d;
    }
  }
}

}  // namespace
}  // namespace mla
