// Microbenchmark (session 29, not part of the build): the clocks a wgmma instruction takes at the
// many-rows kernel's shapes, N = 16..64, from shared memory (SS e4m3: q.k) and with A in registers
// (RS f16: p.v), 1 or 2 warpgroups a CTA, one CTA an SM, every SM; 18 MMAs a commit, 1 commit in
// flight. On a GPU (from the repository root):
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -o /tmp/wgmma_rate bench/wgmma_rate.cu && /tmp/wgmma_rate
// H200 (session 29, bench/results/2026-12-04-h200-wgmma-rate.txt): SS e4m3 m64nNk32 takes 16 + N / 4
// clocks with two warpgroups issuing (shared memory at 128 bytes a clock: A's 2 KB + B's N x 32
// bytes), so N = 32 runs at 67% of the fp8 rate and N = 64 at 100%; RS f16 m64nNk16 is at the f16
// rate from N = 32 with two warpgroups (one warpgroup alone: 22 clocks at N = 32, latency-bound).
// Session 44 (kinds 2 and 3): the bf16 many-rows kernel's q.k, SS bf16 m64n64k16 with A the query
// (K-major) and B the keys (TMA's 128-byte swizzle), the query unswizzled (core matrices 1024 bytes
// apart along K, as attend_rows_bf16.cu keeps it) or in the 128-byte swizzle (FlashMLA's layout). H100
// GPU-a0534203 (bench/results/2026-12-05-h100-s44-wgmma-rate.txt): both 2044-2045 MAC/clk/SM with one and
// two warpgroups (32.06 / 64.09 clocks an instruction), the bf16 peak: the unswizzled query costs nothing.
#include <cstdio>
#include <cstdint>
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_bf16.cuh"
#include "cuda/ptx.cuh"
using namespace mla::cuda;

__device__ __forceinline__ void mma_m64n48k32_e4m3(float (&d)[24], uint64_t a, uint64_t b, bool acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1;\n}\n"
      : MLA_WGMMA_D24(d) : "l"(a), "l"(b), "r"(int32_t(acc)));
}
constexpr int kIters = 256, kSteps = 18;

// kKind: 0 SS e4m3 (q.k of the fp8 kernels), 1 RS f16 (p.v), 2 SS bf16 with an unswizzled A, 3 SS bf16
// with A in the 128-byte swizzle.
template <int kKind, int kN>
__global__ void __launch_bounds__(256, 1) rate(long long* out, int wgs) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const int tid = threadIdx.x, wg = tid / 128;
  for (int i = tid; i < 160 * 1024 / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(sm)[i] = 0;
  __syncthreads();
  if (wg >= wgs) return;
  const uint32_t base = ptx::smem_addr(sm);
  const uint32_t tile = base + wg * 40960, q = base + 2 * 40960 + wg * 20480;
  float d[kN / 2];
  for (int i = 0; i < kN / 2; ++i) d[i] = 0.f;
  uint32_t a[4] = {0, 0, 0, 0};
  const int chunk_stride = kN / 8 * 128;
  long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    uint64_t kd = wgmma::descriptor_sw128(tile);
    uint64_t qd = kKind == 3 ? wgmma::descriptor_sw128(q) : wgmma::descriptor(q, chunk_stride, 128);
    wgmma::fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if constexpr (kKind == 0) {
        if constexpr (kN == 48) mma_m64n48k32_e4m3(d, kd, qd, true);
        else if constexpr (kN == 64) wgmma::mma_m64n64k32_e4m3(d, kd, qd, true);
        else wgmma::mma_qk_e4m3<kN>(d, kd, qd, true);
        kd = wgmma::advance(kd, (s & 3) == 3 ? 8192 - 96 : 32);
        qd = wgmma::advance(qd, 2 * chunk_stride);
      } else if constexpr (kKind == 2 || kKind == 3) {
        static_assert(kN == 64, "the bf16 kernel's q.k is m64n64k16");
        wgmma::mma_m64n64k16_bf16(d, qd, kd, true);
        kd = wgmma::advance(kd, (s & 3) == 3 ? 8192 - 96 : 32);
        qd = kKind == 3 ? wgmma::advance(qd, (s & 3) == 3 ? 8192 - 96 : 32) : wgmma::advance(qd, 2 * chunk_stride);
      } else {
        wgmma::mma_pv_f16_rs<kN>(d, a, qd);
        qd = wgmma::advance(qd, 2 * chunk_stride);
      }
    }
    wgmma::commit();
    wgmma::wait<1>();
  }
  wgmma::wait<0>();
  wgmma::fence_operand(d);
  long long t1 = clock64();
  float s = 0;
  for (int i = 0; i < kN / 2; ++i) s += d[i];
  if (tid % 128 == 0) out[blockIdx.x * 2 + wg] = t1 - t0;
  if (s == 12345.f) out[0] = 0;
}

template <int kKind, int kN>
void run(long long* dout, int sms, int wgs) {
  auto k = rate<kKind, kN>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024);
  k<<<sms, 256, 160 * 1024>>>(dout, wgs);  // warm
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaEventRecord(e0);
  k<<<sms, 256, 160 * 1024>>>(dout, wgs);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  static long long h[1024];
  cudaMemcpy(h, dout, sizeof(long long) * 2 * sms, cudaMemcpyDeviceToHost);
  double clk = 0; for (int i = 0; i < sms; ++i) clk += h[2 * i]; clk /= sms;
  const double per = clk / (kIters * kSteps);
  const double macs = 64.0 * kN * (kKind == 0 ? 32 : 16) * wgs;  // a step, all warpgroups
  const char* names[] = {"SS e4m3", "RS f16", "SS bf16 A plain", "SS bf16 A sw128"};
  printf("%-15s N=%-3d wgs=%d  clk/instr(one wg) %7.2f  MAC/clk/SM %7.0f  (%s peak %d)  %.3f ms  err %s\n",
         names[kKind], kN, wgs, per, macs / per, kKind == 0 ? "fp8" : "f16",
         kKind == 0 ? 4096 : 2048, ms, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  cudaDeviceProp prop; cudaGetDeviceProperties(&prop, 0);
  long long* dout; cudaMalloc(&dout, sizeof(long long) * 2 * 1024);
  const int sms = prop.multiProcessorCount;
  printf("%s, %d SMs\n", prop.name, sms);
  for (int wgs = 1; wgs <= 2; ++wgs) {
    run<0, 16>(dout, sms, wgs); run<0, 24>(dout, sms, wgs); run<0, 32>(dout, sms, wgs);
    run<0, 48>(dout, sms, wgs); run<0, 64>(dout, sms, wgs);
    run<1, 32>(dout, sms, wgs); run<1, 48>(dout, sms, wgs); run<1, 64>(dout, sms, wgs);
    run<2, 64>(dout, sms, wgs); run<3, 64>(dout, sms, wgs);
  }
  return 0;
}
