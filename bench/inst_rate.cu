// Microbenchmark (session 64, not part of the build): throughput of a few instructions per SM clock on sm_90a: the
// F2FP e4m3x2 -> f16x2 widening (p.v's V), MUFU.EX2 (the softmax), PRMT and FFMA for reference. 1 CTA an SM of 128,
// 256 or 1024 threads, 8 independent chains a thread. On a GPU (from the repository root):
//   nvcc -arch=sm_90a -O3 -o /tmp/inst_rate bench/inst_rate.cu && /tmp/inst_rate
// H100 (session 64, bench/results/2026-12-07-h100-s64-inst-rate.txt), results a clock an SM: ex2 16 (MUFU: 8 clocks a
// warp instruction a scheduler, so D's 32 weights a thread take >= 512 clocks of a pair for two warps a scheduler),
// the e4m3x2 -> f16x2 cvt >= 53 (its loop also holds a PRMT for every two), PRMT 63, FFMA 124. ex2.approx.f16x2 is
// two MUFU.EX2.F16 on sm_90a (cuobjdump), no faster a value.
#include <cstdio>
#include <cstdint>
constexpr int kIters = 1024, kChains = 8;
template <int kKind>
__global__ void probe(uint32_t* out, long long* cycles, uint32_t seed) {
  uint32_t v[kChains];
  float f[kChains];
  for (int c = 0; c < kChains; ++c) {
    v[c] = seed * (threadIdx.x + c * 7919) | 0x10101;
    f[c] = -float(c + threadIdx.x % 7) * 0.01f;
  }
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (kKind == 0) {  // e4m3x2 -> f16x2, fed by its own low half
        uint32_t r;
        asm volatile("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(r) : "r"(v[c]));
        v[c] = r;
      } else if constexpr (kKind == 1) {  // ex2.approx.ftz.f32
        float y;
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(f[c]));
        f[c] = y * -0.5f;
      } else if constexpr (kKind == 2) {  // prmt
        uint32_t r;
        asm volatile("prmt.b32 %0, %1, %2, 0x3120;" : "=r"(r) : "r"(v[c]), "r"(v[(c + 1) % kChains]));
        v[c] = r;
      } else {  // ffma
        float y;
        asm volatile("fma.rn.f32 %0, %1, %2, %3;" : "=f"(y) : "f"(f[c]), "f"(0.999f), "f"(1e-3f));
        f[c] = y;
      }
    }
  }
  long long t1 = clock64();
  __syncthreads();
  uint32_t acc = 0;
  for (int c = 0; c < kChains; ++c) acc ^= v[c] ^ __float_as_uint(f[c]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
template <int kKind>
void run(const char* name, int threads, int sms) {
  uint32_t* out; long long* cyc;
  cudaMalloc(&out, sms * 1024 * 4); cudaMalloc(&cyc, sms * 8);
  probe<kKind><<<sms, threads>>>(out, cyc, 3);
  probe<kKind><<<sms, threads>>>(out, cyc, 5);
  cudaDeviceSynchronize();
  long long c; cudaMemcpy(&c, cyc, 8, cudaMemcpyDeviceToHost);
  double per_sm_clk = double(threads) * kIters * kChains / c;
  // the extra instruction a step (the FMUL for ex2's chain, the half move for cvt) is in the loop: see the SASS count
  printf("%-8s threads %4d: %8lld cycles, %.1f ops a clock an SM (%.2f warp instructions a clock an SM)\n", name,
         threads, c, per_sm_clk, per_sm_clk / 32);
  cudaFree(out); cudaFree(cyc);
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int t : {128, 256, 1024}) {
    run<0>("cvt e4m3", t, sms); run<1>("ex2", t, sms); run<2>("prmt", t, sms); run<3>("ffma", t, sms);
  }
  return cudaGetLastError() != cudaSuccess;
}
