// The Hopper wgmma building blocks (src/cuda/wgmma.cuh) on the GPU, through a one-warpgroup probe:
// q.k of one 64-key tile on the fp8 tensor cores (QGMMA) against float64 on the host, on fresh
// random e4m3 data with padded row strides like the cache's. Issue 5's attend builds on these.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/tma.hpp"
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

// rel L2 error of a probe's S (device, [64, 64] f32) against float64 from the fp8 rows of q and k;
// infinity where S is not finite (unwritten: the poison, or NaN rows read).
double rel_error(const std::vector<uint8_t>& q, int64_t q_stride, const std::vector<uint8_t>& k, int64_t k_stride,
                 const float* device_s) {
  std::vector<float> s(size_t(kRows) * kRows);
  cudaMemcpy(s.data(), device_s, s.size() * sizeof(float), cudaMemcpyDeviceToHost);
  double err = 0.0, ref = 0.0;
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kRows; ++j) {
      double want = 0.0;
      for (int d = 0; d < kDims; ++d)
        want += double(fp8e4m3_to_float(q[size_t(i * q_stride + d)])) * fp8e4m3_to_float(k[size_t(j * k_stride + d)]);
      const double got = s[size_t(i) * kRows + size_t(j)];
      if (!std::isfinite(got)) return INFINITY;
      err += (got - want) * (got - want);
      ref += want * want;
    }
  return std::sqrt(err / ref);
}

// rel L2 error of the probe's S against float64, with partials of steps_per_group k32 steps.
double probe_error(int steps_per_group, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t q_stride = kDims + 16, k_stride = kDims + 64;  // like the cache's padded rows
  const std::vector<uint8_t> q = random_fp8(kRows, q_stride, rng), k = random_fp8(kRows, k_stride, rng);
  DeviceBytes dq(q.size()), dk(k.size()), ds(sizeof(float) * kRows * kRows);
  cudaMemcpy(dq.p, q.data(), q.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dk.p, k.data(), k.size(), cudaMemcpyHostToDevice);
  cudaMemset(ds.p, 0xFF, sizeof(float) * kRows * kRows);  // poison: NaN where nothing is written
  cuda::qgmma_qk_probe(static_cast<const uint8_t*>(dq.p), q_stride, static_cast<const uint8_t*>(dk.p), k_stride,
                       static_cast<float*>(ds.p), steps_per_group, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return rel_error(q, q_stride, k, k_stride, static_cast<const float*>(ds.p));
}

// The layout (K-major core matrices, LBO = 1024 along K, SBO = 128 between 8-row groups) is right
// when S matches float64 at all; how closely depends on how long the tensor core accumulates. On
// the H200 one chain of 18 k32 steps gave rel L2 4.6e-4 (session 3): Hopper's fp8 MMA keeps
// fewer accumulator bits than f32 (DeepSeek-V3 report, sec. 3.3.2), so products over K = 576 are
// summed in groups and the group partials in f32 registers, as attend does.
TEST(Wgmma, QgmmaQkTileMatchesFloat64) {
  MLA_REQUIRE_GPU();
  for (int group : {18, 6, 3, 2, 1}) {
    double worst = 0.0;
    for (uint32_t seed : {1u, 2u, 3u}) worst = std::max(worst, probe_error(group, seed));
    std::printf("QGMMA q.k, K = 576, partials of %2d k32 steps: rel L2 %.3g\n", group, worst);
    EXPECT_LT(worst, group == 18 ? 2e-3 : 1e-3) << group << " steps a group";
  }
  // attend_wgmma.cu gives every k32 step its own accumulator and sums them in f32. Measured on the
  // H200 (session 3), rel L2 by steps a group: 18: 4.7e-4, 6: 2.7e-4, 3: 1.9e-4, 2: 1.6e-4,
  // 1: 1.1e-4. One k32 instruction alone already loses ~1e-4 (its 32 products are aligned to the
  // largest before they are added), so that is the floor; with 6 steps a group the kernel's LSE
  // missed SPEC.md's 1e-3 by 2e-4 on a random case, with 1 step it passes (CudaBackend tests).
  double worst = 0.0;
  for (uint32_t seed : {4u, 5u}) worst = std::max(worst, probe_error(1, seed));
  EXPECT_LT(worst, 1.5e-4);
}

// TMA with the 128-byte swizzle and QGMMA on swizzled descriptors (the next attend kernel's
// building blocks, docs/attention.md), on a page-shaped tile: 64 rows of 576 bytes out of a larger
// cache whose other rows are NaN, the fifth 128-byte box half out of bounds (zero-filled). One chain
// over K = 576, so the bound is the no-swizzle chain's (4.7e-4 measured) with room. NOT YET RUN on
// a GPU when written (session 3): if it fails, the swizzled descriptor fields or the expect-tx
// count of a partly out-of-bounds box are the first suspects.
TEST(Wgmma, TmaSwizzledQgmmaMatchesFloat64) {
  MLA_REQUIRE_GPU();
  std::mt19937 rng(11);
  constexpr int kCacheRows = 3 * kRows, kFirst = kRows;  // the tile: rows 64 .. 127
  const std::vector<uint8_t> q = random_fp8(kRows, kDims, rng), k_tile = random_fp8(kRows, kDims, rng);
  std::vector<uint8_t> cache(size_t(kCacheRows) * kDims, 0x7F);  // NaN outside the tile
  std::copy(k_tile.begin(), k_tile.end(), cache.begin() + size_t(kFirst) * kDims);
  DeviceBytes dq(q.size()), dk(cache.size()), ds(sizeof(float) * kRows * kRows), dok(sizeof(int));
  cudaMemcpy(dq.p, q.data(), q.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dk.p, cache.data(), cache.size(), cudaMemcpyHostToDevice);
  cudaMemset(ds.p, 0xFF, sizeof(float) * kRows * kRows);
  const int one = 1;
  cudaMemcpy(dok.p, &one, sizeof(int), cudaMemcpyHostToDevice);
  const CUtensorMap q_map = cuda::make_tensor_map_bytes_sw128(dq.p, kRows, kDims, kDims, kRows);
  const CUtensorMap k_map = cuda::make_tensor_map_bytes_sw128(dk.p, kCacheRows, kDims, kDims, kRows);
  cuda::qgmma_qk_probe_tma(q_map, 0, k_map, kFirst, static_cast<float*>(ds.p), static_cast<int*>(dok.p), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int ok = 0;
  cudaMemcpy(&ok, dok.p, sizeof(int), cudaMemcpyDeviceToHost);
  ASSERT_EQ(ok, 1) << "the TMA loads never completed their mbarrier phase (expect-tx count?)";
  const double rel = rel_error(q, kDims, k_tile, kDims, static_cast<const float*>(ds.p));
  std::printf("TMA 128B-swizzle + QGMMA q.k, one chain over K = 576: rel L2 %.3g\n", rel);
  EXPECT_LT(rel, 1e-3);
}

// f16 bits of a value exactly representable as a normal f16 (or zero): the probe's inputs are
// chosen so, so the float64 reference is the exact product of what the tensor cores see.
uint16_t exact_f16_bits(float x) {
  if (x == 0.0f) return 0;
  int e = 0;
  const float m = std::frexp(std::fabs(x), &e);  // |x| = m * 2^e, m in [0.5, 1)
  const uint32_t mant = uint32_t(std::lround((m * 2.0f - 1.0f) * 1024.0f));
  return uint16_t((x < 0 ? 0x8000u : 0u) | uint32_t(e - 1 + 15) << 10 | mant);
}

// The many-rows kernel's p.v (docs/attention.md): P from the q.k accumulator layout as register A
// fragments, V in f16 as an MN-major B operand (imm-trans-b), HGMMA m64n64k16 over 64 keys. The
// PTX ISA's field names leave open which descriptor field holds the stride between dim blocks and
// which the one between key blocks for an MN-major operand: the probe runs both (swap = 0, 1),
// prints each error and passes if one reading is exact (f16 inputs, f32 sums: ~1e-7). NOT YET RUN
// on a GPU when written (session 4): its printout tells the next kernel which reading holds.
TEST(Wgmma, HgmmaMnMajorPvMatchesFloat64) {
  MLA_REQUIRE_GPU();
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> pm(0, 256), vm(-128, 128);
  std::vector<float> p(size_t(kRows) * kRows);
  std::vector<uint16_t> v(size_t(kRows) * kRows);
  std::vector<double> vd(v.size());
  for (float& x : p) x = float(pm(rng)) / 256.0f;  // exact in f16
  for (size_t i = 0; i < v.size(); ++i) {
    vd[i] = double(vm(rng)) / 64.0;
    v[i] = exact_f16_bits(float(vd[i]));
  }
  DeviceBytes dp(p.size() * sizeof(float)), dv(v.size() * sizeof(uint16_t)), dout(sizeof(float) * kRows * kRows);
  cudaMemcpy(dp.p, p.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dv.p, v.data(), v.size() * sizeof(uint16_t), cudaMemcpyHostToDevice);
  double best = INFINITY;
  for (int swap = 0; swap < 2; ++swap) {
    cudaMemset(dout.p, 0xFF, sizeof(float) * kRows * kRows);
    cuda::hgmma_pv_probe(static_cast<const float*>(dp.p), static_cast<const uint16_t*>(dv.p),
                         static_cast<float*>(dout.p), swap, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> o(size_t(kRows) * kRows);
    cudaMemcpy(o.data(), dout.p, o.size() * sizeof(float), cudaMemcpyDeviceToHost);
    double err = 0.0, ref = 0.0;
    for (int i = 0; i < kRows; ++i)
      for (int d = 0; d < kRows; ++d) {
        double want = 0.0;
        for (int k = 0; k < kRows; ++k) want += double(p[size_t(i) * kRows + size_t(k)]) * vd[size_t(k) * kRows + size_t(d)];
        const double got = o[size_t(i) * kRows + size_t(d)];
        err += std::isfinite(got) ? (got - want) * (got - want) : INFINITY;
        ref += want * want;
      }
    const double rel = std::sqrt(err / ref);
    std::printf("HGMMA p.v, MN-major f16 V (%s): rel L2 %.3g\n",
                swap ? "leading offset = dim blocks' stride" : "leading offset = key blocks' stride", rel);
    best = std::min(best, rel);
  }
  EXPECT_LT(best, 1e-5) << "neither reading of the MN-major descriptor fields (or the A fragments from the "
                           "accumulator layout) gives the product";
}

}  // namespace
}  // namespace mla
