// The two kernels every timing here shares: the L2 flush's read and the SM clock probe. A header of its own so that
// bench/flashmla/flashmla_bench.cu (built apart from the library, against FlashMLA's sources) times FlashMLA exactly
// as CudaBackend::time_us times ours. Self-contained: CUDA's headers only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mla::cuda::bench_kernels {

// Reads every 16-byte word of the buffer (folded into a word stored only if it matches a value
// the zeroed buffer never gives, so the loads stay).
static __global__ void read_all_kernel(const uint4* __restrict__ data, int64_t n, uint32_t* out) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) out[0] = acc;
}

// The L2 flush before a timed run: a read of a zeroed buffer of twice the L2's size (the never-taken store would
// land on the buffer's first word).
inline void read_all(void* data, size_t bytes, cudaStream_t stream) {
  read_all_kernel<<<1024, 512, 0, stream>>>(static_cast<const uint4*>(data), int64_t(bytes / 16),
                                            static_cast<uint32_t*>(data));
}

// One thread counts SM cycles (clock64) while the global timer (ns) advances spin_ns: cycles and ns
// out. (A single thread on one SM: the clock is chip-wide, and the probe adds no load of its own.)
static __global__ void clock_probe_kernel(uint64_t spin_ns, unsigned long long* out) {
  uint64_t t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < spin_ns);
  const long long c1 = clock64();
  out[0] = static_cast<unsigned long long>(c1 - c0);
  out[1] = t1 - t0;
}

}  // namespace mla::cuda::bench_kernels
