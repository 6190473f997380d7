// The wgmma probe (src/cuda/wgmma_probe.hpp): one warpgroup, Q and K re-laid into K-major core-
// matrix tiles in shared memory, 18 QGMMA k32 steps in groups whose partials are summed in f32,
// the sums written out row-major.
#include "cuda/check.hpp"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/tma.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_probe.hpp"

namespace mla::cuda {
namespace {

constexpr int kProbeRows = wgmma::kTileRows;  // 64 query rows, 64 keys
constexpr int kChunks = kRow / 16;            // 36 chunks of 16 bytes a row
constexpr int kTileBytes = kChunks * wgmma::kChunkStride;

// The warpgroup's m64n64 accumulator (wgmma::mma_m64n64k32_e4m3's layout) to s [64, 64] row-major.
__device__ __forceinline__ void store_s(const float (&d)[32], float* s, int tid) {
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int row = 16 * warp + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * c + i % 2;
    s[row * kProbeRows + col] = d[i];
  }
}

__global__ void __launch_bounds__(128) qgmma_probe_kernel(const uint8_t* q, int64_t q_stride, const uint8_t* k,
                                                          int64_t k_stride, float* s, int steps_per_group) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* qs = smem;
  uint8_t* ks = smem + kTileBytes;
  const int tid = threadIdx.x;
  // Lane -> (8 rows x 4 chunks): each 8 lanes write one core matrix's 128 contiguous bytes.
  for (int i = tid; i < kProbeRows * kChunks; i += 128) {
    const int row = (i / 32) % 8 * 8 + i % 8, chunk = (i / 256) * 4 + (i % 32) / 8;
    if (chunk >= kChunks) continue;
    *reinterpret_cast<uint4*>(qs + wgmma::kmajor_offset(row, chunk)) =
        *reinterpret_cast<const uint4*>(q + row * q_stride + chunk * 16);
    *reinterpret_cast<uint4*>(ks + wgmma::kmajor_offset(row, chunk)) =
        *reinterpret_cast<const uint4*>(k + row * k_stride + chunk * 16);
  }
  wgmma::fence_proxy_async();
  __syncthreads();

  float d[32], total[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = total[i] = 0.0f;
  const uint32_t qa = static_cast<uint32_t>(__cvta_generic_to_shared(qs));
  const uint32_t ka = static_cast<uint32_t>(__cvta_generic_to_shared(ks));
  constexpr uint32_t kLeading = wgmma::kChunkStride, kStride = 128;  // along K, between 8-row groups
#pragma unroll
  for (int step = 0; step < kChunks / 2; ++step) {
    const uint32_t off = step * 2 * wgmma::kChunkStride;
    if (step % steps_per_group == 0) wgmma::fence();
    wgmma::mma_m64n64k32_e4m3(d, wgmma::descriptor(qa + off, kLeading, kStride),
                              wgmma::descriptor(ka + off, kLeading, kStride), step % steps_per_group != 0);
    if ((step + 1) % steps_per_group == 0 || step == kChunks / 2 - 1) {
      wgmma::commit();
      wgmma::wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) total[i] += d[i];
    }
  }

  store_s(total, s, tid);
}

// Five 128-byte K slabs of 64 rows x 128 bytes a tile (the fifth half out of bounds: zeros).
constexpr int kSlabs = (kRow + 127) / 128;
constexpr int kSlabBytes = kProbeRows * 128;

__global__ void __launch_bounds__(128) qgmma_probe_tma_kernel(const __grid_constant__ CUtensorMap q_map, int q_row,
                                                              const __grid_constant__ CUtensorMap k_map, int k_row,
                                                              float* s, int* ok) {
  extern __shared__ __align__(1024) uint8_t smem[];
  // 1024-byte alignment of the dynamic window is not guaranteed: align by hand.
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t qs = base, ks = base + kSlabs * kSlabBytes, bar = ks + kSlabs * kSlabBytes;
  const int tid = threadIdx.x;
  if (tid == 0) {
    tma::mbarrier_init(bar, 1);
    tma::fence_barrier_init();
  }
  __syncthreads();
  if (tid == 0) {
    tma::arrive_expect_tx(bar, 2 * kSlabs * kSlabBytes);
    for (int j = 0; j < kSlabs; ++j) {
      tma::load_2d(qs + j * kSlabBytes, &q_map, 128 * j, q_row, bar);
      tma::load_2d(ks + j * kSlabBytes, &k_map, 128 * j, k_row, bar);
    }
  }
  if (!tma::wait_parity(bar, 0)) {
    if (tid == 0) *ok = 0;
    return;
  }

  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.0f;
  wgmma::fence();
#pragma unroll
  for (int step = 0; step < kChunks / 2; ++step) {
    const uint32_t off = (step / 4) * kSlabBytes + (step % 4) * 32;
    wgmma::mma_m64n64k32_e4m3(d, wgmma::descriptor_sw128(qs + off), wgmma::descriptor_sw128(ks + off), step > 0);
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operand(d);

  store_s(d, s, tid);
}

// V (64 keys x 64 dims, f16) as an MN-major B operand without swizzle: core matrix (key block kb,
// dim block nb) of 8 keys x 8 dims (each key's 8 dims 16 contiguous bytes) at nb * 1024 + kb * 128.
constexpr int kPvDimBlockStride = 1024, kPvKeyBlockStride = 128;
__host__ __device__ constexpr int pv_v_offset(int key, int dim) {
  return (dim / 8) * kPvDimBlockStride + (key / 8) * kPvKeyBlockStride + (key % 8) * 16 + (dim % 8) * 2;
}

__global__ void __launch_bounds__(128) hgmma_pv_probe_kernel(const float* p, const uint16_t* v, float* o, int swap) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  for (int i = tid; i < kProbeRows * kProbeRows; i += 128) {
    const int key = i / kProbeRows, dim = i % kProbeRows;
    *reinterpret_cast<uint16_t*>(smem + pv_v_offset(key, dim)) = v[i];
  }
  wgmma::fence_proxy_async();
  __syncthreads();

  // P in the m64n64 accumulator layout: d[4j + r] = P[16 warp + g + 8 (r / 2)][8 j + 2 c + r % 2].
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int row = 16 * warp + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * c + i % 2;
    s[i] = p[row * kProbeRows + col];
  }
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.0f;
  wgmma::fence_operand(d);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t lead = swap ? kPvDimBlockStride : kPvKeyBlockStride, stride = swap ? kPvKeyBlockStride : kPvDimBlockStride;
  uint32_t frag[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    // k16 step ks = accumulator n8 blocks 2 ks (keys 16 ks + 2c, +1) and 2 ks + 1 (keys 16 ks + 8 + 2c, +1):
    // the mma.sync A layout {row g, row g + 8} x {k 2c, k 8 + 2c}.
    const int j0 = 2 * ks, j1 = 2 * ks + 1;
    frag[ks][0] = ptx::pack_f16x2(s[4 * j0 + 0], s[4 * j0 + 1]);
    frag[ks][1] = ptx::pack_f16x2(s[4 * j0 + 2], s[4 * j0 + 3]);
    frag[ks][2] = ptx::pack_f16x2(s[4 * j1 + 0], s[4 * j1 + 1]);
    frag[ks][3] = ptx::pack_f16x2(s[4 * j1 + 2], s[4 * j1 + 3]);
  }
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)  // keys 16 ks .. +15: two key blocks further
    wgmma::mma_m64n64k16_f16_rs<true>(d, frag[ks], wgmma::descriptor(base + ks * 2 * kPvKeyBlockStride, lead, stride));
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operand(d);
  store_s(d, o, tid);
}

}  // namespace

void hgmma_pv_probe(const float* p, const uint16_t* v, float* o, int swap, cudaStream_t stream) {
  const int smem = kProbeRows * kProbeRows * 2;
  hgmma_pv_probe_kernel<<<1, 128, smem, stream>>>(p, v, o, swap);
  MLA_CUDA_CHECK_LAUNCH();
}

void qgmma_qk_probe_tma(const CUtensorMap& q_map, int q_row, const CUtensorMap& k_map, int k_row, float* s, int* ok,
                        cudaStream_t stream) {
  const int smem = 2 * kSlabs * kSlabBytes + 1024 + 16;
  MLA_CUDA_CHECK(cudaFuncSetAttribute(qgmma_probe_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  qgmma_probe_tma_kernel<<<1, 128, smem, stream>>>(q_map, q_row, k_map, k_row, s, ok);
  MLA_CUDA_CHECK_LAUNCH();
}

void qgmma_qk_probe(const uint8_t* q, int64_t q_stride, const uint8_t* k, int64_t k_stride, float* s,
                    int steps_per_group, cudaStream_t stream) {
  MLA_REQUIRE(q_stride % 16 == 0 && k_stride % 16 == 0, "qgmma probe: row strides must be multiples of 16 bytes, got ",
              q_stride, " and ", k_stride);
  MLA_REQUIRE(steps_per_group >= 1, "qgmma probe: steps_per_group must be >= 1, got ", steps_per_group);
  const int smem = 2 * kTileBytes;
  MLA_CUDA_CHECK(cudaFuncSetAttribute(qgmma_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  qgmma_probe_kernel<<<1, 128, smem, stream>>>(q, q_stride, k, k_stride, s, steps_per_group);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
