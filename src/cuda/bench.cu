// Benchmark support of the CUDA backend (`mla bench`): CUDA-event timing with L2 flushed before
// each run (MLA_BENCH_FLUSH, below), and the ceilings measured in the same run: device copy
// bandwidth (bytes read + written), 576-byte rows read in order and at random rows (bytes read),
// cuBLASLt bf16 and fp8 matmul rates on random data (zeros run faster: METHOD.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/backend.hpp"
#include "cuda/bench_kernels.cuh"
#include "cuda/check.hpp"
#include "cuda/gemm.hpp"
#include "cuda/handles.hpp"

namespace mla::cuda {
namespace {

// A 32-bit hash of index i (Knuth's multiplicative hash, then an xorshift-multiply-xorshift mix).
__device__ __forceinline__ uint32_t hash_index(int64_t i, uint32_t seed) {
  uint32_t h = uint32_t(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  return h ^ (h >> 13);
}

__global__ void fill_random_kernel(uint8_t* data, int64_t bytes, uint32_t seed, bool fp8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < bytes; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash_index(i, seed);
    // bf16 (pairs of bytes): a small exponent keeps values finite and O(1); fp8: no NaN (0x7F).
    if (fp8) data[i] = uint8_t((h & 0xB7u));                  // |x| < 2^-1..., never 0x7F / 0xFF
    else data[i] = (i & 1) ? uint8_t(0x3C | ((h >> 7) & 0x81)) : uint8_t(h);  // exponent ~ 2^-7..2^1
  }
}

void fill_random(void* data, size_t bytes, uint32_t seed, bool fp8, cudaStream_t stream) {
  fill_random_kernel<<<1024, 256, 0, stream>>>(static_cast<uint8_t*>(data), int64_t(bytes), seed, fp8);
  MLA_CUDA_CHECK_LAUNCH();
}

// Rows of 576 bytes (an fp8 key row) read 16 bytes a lane, a warp a row, four rows a warp in
// flight: row i in order (random = false) or at a hashed row index of the buffer (random: the
// access pattern of pages of one row). The bytes are folded into a word per thread, stored only if
// it matches a value no data here makes, so the loads stay.
constexpr int kRowChunks = 576 / 16;
__global__ void read_rows_kernel(const uint4* __restrict__ base, int64_t rows_total, int64_t n_rows, bool random,
                                 uint32_t* out) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  uint32_t acc = 0;
  for (int64_t i0 = 4 * warp; i0 < n_rows; i0 += 4 * warps) {
    uint4 v[4][2];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = i0 + k < n_rows ? i0 + k : n_rows - 1;
      const int64_t row = random ? int64_t(hash_index(i, 0) % uint32_t(rows_total)) : i % rows_total;
      const uint4* r = base + row * kRowChunks;
      v[k][0] = __ldg(r + lane);
      v[k][1] = lane + 32 < kRowChunks ? __ldg(r + lane + 32) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < 2; ++e) acc ^= v[k][e].x ^ v[k][e].y ^ v[k][e].z ^ v[k][e].w;
  }
  if (acc == 0x9E3779B9u) out[0] = acc;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median time of `iters` runs of fn after `warmup`, in microseconds, without cache flushing
// (the ceilings' operands are far larger than L2).
template <class Fn>
double median_us(cudaStream_t stream, int warmup, int iters, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<Event> start(iters), stop(iters);
  for (int i = 0; i < iters; ++i) {
    MLA_CUDA_CHECK(cudaEventRecord(start[i].get(), stream));
    fn();
    MLA_CUDA_CHECK(cudaEventRecord(stop[i].get(), stream));
  }
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    MLA_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i].get(), stop[i].get()));
    us[i] = ms * 1e3;
  }
  return median(us);
}

// time_us's L2 flush before each timed run (MLA_BENCH_FLUSH):
//  clean (default): read a buffer of twice the L2, which leaves the L2 holding clean lines;
//  write: write it (cudaMemset, sessions 1-13): the L2 then holds that many dirty lines, and the
//         timed run pays for writing them back to DRAM as its reads evict them (up to the L2's size
//         of writes, ~12 µs of the H200's bandwidth, charged to whatever runs next);
//  none: no flush (the previous run's lines stay).
enum class L2Flush { kClean, kWrite, kNone };

L2Flush l2_flush_mode() {
  static const L2Flush mode = [] {
    const char* env = std::getenv("MLA_BENCH_FLUSH");
    const std::string v = env ? env : "clean";
    MLA_REQUIRE(v == "clean" || v == "write" || v == "none", "MLA_BENCH_FLUSH: expected clean, write or none, got ", v);
    return v == "write" ? L2Flush::kWrite : v == "none" ? L2Flush::kNone : L2Flush::kClean;
  }();
  return mode;
}

const char* l2_flush_description(L2Flush mode) {
  switch (mode) {
    case L2Flush::kWrite: return "write: a buffer of twice the L2 written (cudaMemset) before each run";
    case L2Flush::kNone: return "none";
    default: return "clean: a buffer of twice the L2 read before each run";
  }
}

using bench_kernels::clock_probe_kernel;
using bench_kernels::read_all;

}  // namespace

std::vector<double> CudaBackend::time_us(const std::function<void()>& fn, int warmup, int iters) {
  DeviceGuard guard(opts.cuda_device);
  const L2Flush mode = l2_flush_mode();
  if (!flush_.get()) {
    flush_ = DeviceBuffer(size_t(std::max<int64_t>(l2_bytes_, 1 << 20)) * 2);
    MLA_CUDA_CHECK(cudaMemsetAsync(flush_.get(), 0, flush_.bytes(), stream_));
  }
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<Event> start(iters), stop(iters);
  for (int i = 0; i < iters; ++i) {
    // Twice the L2's size evicts every line the previous run left there.
    if (mode == L2Flush::kWrite) MLA_CUDA_CHECK(cudaMemsetAsync(flush_.get(), i & 0xFF, flush_.bytes(), stream_));
    if (mode == L2Flush::kClean) {
      read_all(flush_.get(), flush_.bytes(), stream_);
      MLA_CUDA_CHECK_LAUNCH();
    }
    MLA_CUDA_CHECK(cudaEventRecord(start[i].get(), stream_));
    fn();
    MLA_CUDA_CHECK(cudaEventRecord(stop[i].get(), stream_));
  }
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<double> us(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    MLA_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i].get(), stop[i].get()));
    us[i] = ms * 1e3;
  }
  return us;
}

double CudaBackend::sm_clock_mhz() {
  DeviceGuard guard(opts.cuda_device);
  if (!clock_.get()) clock_ = DeviceBuffer(2 * sizeof(unsigned long long));
  clock_probe_kernel<<<1, 1, 0, stream_>>>(200000, static_cast<unsigned long long*>(clock_.get()));
  MLA_CUDA_CHECK_LAUNCH();
  unsigned long long v[2] = {0, 0};
  MLA_CUDA_CHECK(cudaMemcpyAsync(v, clock_.get(), sizeof v, cudaMemcpyDeviceToHost, stream_));
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return v[1] > 0 ? double(v[0]) * 1e3 / double(v[1]) : 0.0;
}

detail::Ceilings CudaBackend::measure_ceilings() {
  DeviceGuard guard(opts.cuda_device);
  detail::Ceilings c;
  c.device_name = device_name_;
  c.cache_flush = l2_flush_description(l2_flush_mode());
  {
    const size_t bytes = size_t(1) << 30;
    DeviceBuffer a(bytes), b(bytes);
    fill_random(a.get(), bytes, 1, false, stream_);
    const double us = median_us(stream_, 3, 10, [&] {
      MLA_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
    });
    c.copy_gbps = 2.0 * double(bytes) / (us * 1e-6) / 1e9;
    // 576-byte rows of the same 1 GiB (far past L2), 2^20 rows a run: in order, then at random.
    const int64_t rows_total = int64_t(bytes / 576), n_rows = int64_t(1) << 20;
    DeviceBuffer sink(sizeof(uint32_t));
    for (const bool random : {false, true}) {
      const double t = median_us(stream_, 3, 10, [&] {
        read_rows_kernel<<<2048, 256, 0, stream_>>>(static_cast<const uint4*>(a.get()), rows_total, n_rows, random,
                                                   static_cast<uint32_t*>(sink.get()));
        MLA_CUDA_CHECK_LAUNCH();
      });
      (random ? c.gather_rows_gbps : c.read_rows_gbps) = double(n_rows) * 576 / (t * 1e-6) / 1e9;
    }
  }
  const int n = 8192;
  const double flops = 2.0 * n * double(n) * n;
  auto matmul_rate = [&](cudaDataType_t in_type, size_t elem) {
    DeviceBuffer x(size_t(n) * n * elem), w(size_t(n) * n * elem), y(size_t(n) * n * 2), ws(size_t(32) << 20);
    const bool fp8 = in_type == CUDA_R_8F_E4M3;
    fill_random(x.get(), x.bytes(), 2, fp8, stream_);
    fill_random(w.get(), w.bytes(), 3, fp8, stream_);
    Gemm gemm(lt_->get(), n, n, ws.bytes(), in_type, CUDA_R_16BF);
    const double us = median_us(stream_, 3, 10, [&] { gemm.run(x.get(), n, w.get(), y.get(), n, n, stream_, ws.get()); });
    return flops / (us * 1e-6) / 1e12;
  };
  c.matmul_tflops = matmul_rate(CUDA_R_16BF, 2);
  try {
    c.fp8_matmul_tflops = matmul_rate(CUDA_R_8F_E4M3, 1);
  } catch (const Error&) {
    c.fp8_matmul_tflops = 0;  // no fp8 algorithm on this device / library
  }
  return c;
}

}  // namespace mla::cuda
