// The Hopper wgmma building blocks (src/cuda/wgmma.cuh) on the GPU, through a one-warpgroup probe:
// q.k of one 64-key tile on the fp8 tensor cores (QGMMA) against float64 on the host, on fresh
// random e4m3 data with padded row strides like the cache's. Issue 5's attend builds on these.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/wgmma_probe.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/formats.hpp"
#include "mla/layer.hpp"

namespace mla {
namespace {

#define MLA_REQUIRE_GPU() MLA_SKIP_WITHOUT_GPU("the wgmma probe tests")

constexpr int kRows = 64, kDims = 576;

// Random e4m3 codes, never NaN (0x7F / 0xFF).
std::vector<uint8_t> random_fp8(size_t n, int64_t stride, std::mt19937& rng) {
  std::vector<uint8_t> v(n * size_t(stride), 0xFF);  // the row padding: NaN, never read
  std::uniform_int_distribution<int> code(0, 253);
  for (size_t r = 0; r < n; ++r)
    for (int d = 0; d < kDims; ++d) {
      uint8_t b = uint8_t(code(rng));
      if ((b & 0x7F) == 0x7F) b ^= 1;
      v[r * size_t(stride) + size_t(d)] = b;
    }
  return v;
}

struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(size_t n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~DeviceBytes() { cudaFree(p); }
};

// rel L2 error of the probe's S against float64, for the given descriptor byte offsets.
double probe_error(uint32_t leading, uint32_t stride, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t q_stride = kDims + 16, k_stride = kDims + 64;  // like the cache's padded rows
  const std::vector<uint8_t> q = random_fp8(kRows, q_stride, rng), k = random_fp8(kRows, k_stride, rng);
  DeviceBytes dq(q.size()), dk(k.size()), ds(sizeof(float) * kRows * kRows);
  cudaMemcpy(dq.p, q.data(), q.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dk.p, k.data(), k.size(), cudaMemcpyHostToDevice);
  cudaMemset(ds.p, 0xFF, sizeof(float) * kRows * kRows);  // poison: NaN where nothing is written
  cuda::qgmma_qk_probe(static_cast<const uint8_t*>(dq.p), q_stride, static_cast<const uint8_t*>(dk.p), k_stride,
                       static_cast<float*>(ds.p), leading, stride, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> s(size_t(kRows) * kRows);
  cudaMemcpy(s.data(), ds.p, s.size() * sizeof(float), cudaMemcpyDeviceToHost);
  double err = 0.0, ref = 0.0;
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kRows; ++j) {
      double want = 0.0;
      for (int d = 0; d < kDims; ++d)
        want += double(fp8e4m3_to_float(q[size_t(i * q_stride + d)])) * fp8e4m3_to_float(k[size_t(j * k_stride + d)]);
      const double got = s[size_t(i) * kRows + size_t(j)];
      if (!std::isfinite(got)) return INFINITY;  // unwritten (poison) or wrong
      err += (got - want) * (got - want);
      ref += want * want;
    }
  return std::sqrt(err / ref);
}

TEST(Wgmma, QgmmaQkTileMatchesFloat64) {
  MLA_REQUIRE_GPU();
  // fp8 products are exact in the f32 accumulator: only the summation order differs.
  for (uint32_t seed : {1u, 2u, 3u}) {
    const double e = probe_error(1024, 128, seed);
    if (!(e < 1e-5)) {
      // Say which reading of the two byte offsets the hardware takes, for whoever fixes it.
      const double swapped = probe_error(128, 1024, seed);
      FAIL() << "rel L2 " << e << " with leading 1024 / stride 128 (K-major core matrices, docs/attention.md); "
             << "with the offsets swapped: " << swapped;
    }
  }
}

}  // namespace
}  // namespace mla
