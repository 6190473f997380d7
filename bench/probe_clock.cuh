// Shared by the stand-alone probes (bench/pv_turn.cu, bench/qk_turn.cu): each warpgroup's thread 0 stores its loop's
// SM clocks at out[2 CTA + warpgroup]; the host reads warpgroup 0's, averaged over the CTAs (one an SM).
#pragma once
#include <cstdint>
#include <cstdio>

// (sink keeps the loop's results live; it never equals the sentinel)
__device__ __forceinline__ void store_clocks(long long* out, long long clocks, int wg, float sink) {
  if (threadIdx.x % 128 == 0) out[blockIdx.x * 2 + wg] = clocks;
  if (sink == 12345.f) out[0] = 0;
}

inline double mean_cta_clocks(const long long* dout, int ctas) {
  static long long h[2 * 1024];
  cudaMemcpy(h, dout, sizeof(long long) * 2 * ctas, cudaMemcpyDeviceToHost);
  double clk = 0;
  for (int i = 0; i < ctas; ++i) clk += h[2 * i];
  return clk / ctas;
}

// The GPU's name and SM count printed, and room for every CTA's clocks (one CTA an SM).
struct ProbeDevice {
  int sms = 0;
  long long* dout = nullptr;
};
inline ProbeDevice probe_device(const char* what) {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  ProbeDevice d;
  d.sms = prop.multiProcessorCount;
  cudaMalloc(&d.dout, sizeof(long long) * 2 * 1024);
  std::printf("%s, %d SMs; %s\n", prop.name, d.sms, what);
  return d;
}
