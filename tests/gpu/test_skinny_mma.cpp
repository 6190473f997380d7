// The tensor-core projection for 5..64 tokens (src/cuda/skinny_mma.cu, a step takes it only with
// MLA_SKINNY_MMA=1) against a float64 product on fresh random bf16 inputs: every element within
// its bf16 rounding (plus f32 summation slack), strided x and y, y poisoned first and its columns
// past n left as they were. The shapes take 2, 3 and 8 splits (k of 2 and 3 blocks to kimi-k3's qkv_a),
// whole and partial n8 token tiles and 256-row weight tiles, a k slice with an odd block count.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/stages.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/formats.hpp"
#include "mla/tensor.hpp"

namespace mla {
namespace {

#define MLA_REQUIRE_GPU() MLA_SKIP_WITHOUT_GPU("the skinny MMA GEMM tests")

struct Shape {
  int s, n, k;
  int64_t ldx, ldy;
  int row_step;  // reference rows checked: every row_step-th (all: 1), to keep big shapes quick
};

void check(const Shape& sh, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "S " << sh.s << ", n " << sh.n << ", k " << sh.k << ", ldx " << sh.ldx
                                  << ", ldy " << sh.ldy);
  ASSERT_TRUE(cuda::skinny_mma_supports(sh.s, sh.n, sh.k, sh.ldx, reinterpret_cast<const void*>(16)));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(size_t(sh.s) * sh.ldx), w(size_t(sh.n) * sh.k);
  for (auto& v : x) v = float_to_bf16(normal(rng));
  for (auto& v : w) v = float_to_bf16(0.05f * normal(rng));
  constexpr uint16_t kPoison = 0x7FC1;  // a NaN the kernel never writes
  std::vector<uint16_t> y0(size_t(sh.s) * sh.ldy, kPoison);
  auto device_copy = [](const std::vector<uint16_t>& host, int64_t rows, int64_t cols) {
    Tensor t = Tensor::empty(DType::bf16, {rows, cols}, Device::cuda);
    t.copy_from(TensorView::contiguous(host.data(), DType::bf16, {rows, cols}));
    return t;
  };
  const Tensor dx = device_copy(x, sh.s, sh.ldx), dw = device_copy(w, sh.n, sh.k), dy = device_copy(y0, sh.s, sh.ldy);
  cuda::launch_skinny_mma({.x = dx.ptr<uint16_t>(), .ldx = sh.ldx, .w = dw.ptr<uint16_t>(), .y = dy.ptr<uint16_t>(),
                           .ldy = sh.ldy, .s = sh.s, .n = sh.n, .k = sh.k},
                          nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Tensor y_host = dy.to_host();
  const uint16_t* y = y_host.ptr<uint16_t>();

  int bad = 0;
  for (int t = 0; t < sh.s; ++t) {
    for (int64_t c = sh.n; c < sh.ldy; ++c)
      ASSERT_EQ(y[t * sh.ldy + c], kPoison) << "token " << t << ", column " << c << " past n was written";
    for (int r = 0; r < sh.n; ++r) {
      const uint16_t got = y[t * sh.ldy + r];
      if (r % sh.row_step != 0 && r != sh.n - 1) {
        ASSERT_NE(got, kPoison) << "token " << t << ", row " << r << " not written";
        continue;
      }
      double ref = 0.0, mag = 0.0;
      for (int i = 0; i < sh.k; ++i) {
        const double p = double(bf16_to_float(x[t * sh.ldx + i])) * bf16_to_float(w[int64_t(r) * sh.k + i]);
        ref += p;
        mag += std::fabs(p);
      }
      // bf16's half ulp of the result, and f32 summation error of k products.
      const double tol = std::ldexp(std::fabs(ref), -8) + 1e-6 * mag;
      const double v = bf16_to_float(got);
      if (!(std::fabs(v - ref) <= tol) && bad++ < 5)
        ADD_FAILURE() << "y[" << t << ", " << r << "] = " << v << ", expected " << ref << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(SkinnyMma, MatchesFloat64) {
  MLA_REQUIRE_GPU();
  const Shape shapes[] = {
      {5, 300, 512, 520, 301, 1},      // one token tile, partial; strided x and y; one CTA of rows, part-filled
      {8, 256, 1024, 1024, 256, 1},    // a whole token tile, one weight tile
      {13, 17, 96, 104, 24, 1},        // k of 3 blocks: at most 3 splits; 17 rows
      {16, 2304, 1536, 1536, 2304, 3},  // kimi-k3's q_b at 16 tokens
      {33, 1000, 2048, 2056, 1003, 1},
      {48, 513, 64, 64, 520, 1},       // 2 blocks of k, a row past a weight tile
      {64, 3648, 7168, 7168, 3648, 37},  // kimi-k3's qkv_a at 64 tokens
      {57, 3648, 7168, 7176, 3650, 53},
  };
  uint64_t seed = 7;
  for (const Shape& sh : shapes) check(sh, seed++);
}

// Host logic only (no GPU needed): what a launch can take.
TEST(SkinnyMma, SupportsOnlyWhatItCan) {
  const void* aligned = reinterpret_cast<const void*>(256);
  EXPECT_FALSE(cuda::skinny_mma_supports(4, 100, 64, 64, aligned));   // the CUDA-core kernel's
  EXPECT_FALSE(cuda::skinny_mma_supports(65, 100, 64, 64, aligned));  // cuBLASLt's
  EXPECT_FALSE(cuda::skinny_mma_supports(16, 100, 48, 48, aligned));  // k not a multiple of 32
  EXPECT_FALSE(cuda::skinny_mma_supports(16, 100, 64, 68, aligned));  // ldx not a multiple of 8
  EXPECT_FALSE(cuda::skinny_mma_supports(16, 100, 64, 64, reinterpret_cast<const void*>(264)));  // x misaligned
  EXPECT_FALSE(cuda::skinny_mma_supports(16, 0, 64, 64, aligned));    // no weight rows
  EXPECT_TRUE(cuda::skinny_mma_supports(5, 1, 32, 8, aligned));
  EXPECT_TRUE(cuda::skinny_mma_supports(64, 3648, 7168, 7168, aligned));
}

}  // namespace
}  // namespace mla
