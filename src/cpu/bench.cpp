// Benchmark support for the CPU backend: steady_clock timing with the last-level cache flushed
// before every run, and the roofline ceilings of this machine (memory copy bandwidth, sgemm rate,
// the peak rates of the two instructions attend's arithmetic runs on) measured in the same process
// as the benchmark they are compared with.
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "cpu/stages.hpp"
#include "mla/error.hpp"

namespace mla::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double since_us(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Bytes of last-level cache the process's CPUs can fill: the sum over distinct L3 instances
// (sysfs; one per CCX on EPYC), else what sysconf reports, else a large server LLC.
size_t last_level_cache_bytes() {
  std::set<std::string> seen;
  size_t total = 0;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  for (long c = 0; c < cpus; ++c) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cache/index3/";
    std::ifstream shared(dir + "shared_cpu_list"), size(dir + "size");
    std::string who, kib;
    if (!(shared >> who) || !(size >> kib) || !seen.insert(who).second) continue;
    const size_t mult = kib.back() == 'K' ? 1024 : kib.back() == 'M' ? size_t(1) << 20 : 1;
    total += size_t(std::stoull(kib)) * mult;
  }
  if (total > 0) return total;
  long llc = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  return llc > 0 ? size_t(llc) : size_t(256) << 20;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

Buffer alloc_bytes(size_t bytes, const char* what) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  MLA_REQUIRE(p != nullptr, "cpu bench: cannot allocate ", bytes, " bytes for ", what);
  return Buffer(static_cast<uint8_t*>(p));
}

// Writes a buffer twice the LLC (at least 64 MiB) from all threads, evicting whatever the timed
// function would otherwise find warm.
class CacheFlusher {
 public:
  explicit CacheFlusher(int threads)
      : bytes_(std::max(size_t(64) << 20, 2 * last_level_cache_bytes())),
        buf_(alloc_bytes(bytes_, "the cache flush buffer")),
        threads_(threads) {}
  void flush() {
    ++round_;
    const int64_t n = int64_t(bytes_ / sizeof(uint64_t));
    auto* p = reinterpret_cast<uint64_t*>(buf_.get());
    const uint64_t v = round_;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = v + uint64_t(i);
  }

 private:
  size_t bytes_;
  Buffer buf_;
  int threads_;
  uint64_t round_ = 0;
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(" \t", c + 1));
    }
  }
  return "unknown CPU";
}

// Host memory copy, bytes read + bytes written per second: each thread copies its own slice of
// a pair of 1 GiB buffers (first touched by the same thread, so pages sit on its NUMA node).
double copy_gbps(int threads) {
  const size_t bytes = size_t(1) << 30;
  Buffer src = alloc_bytes(bytes, "the bandwidth source"), dst = alloc_bytes(bytes, "the bandwidth target");
  auto slice = [&](int t, size_t& begin, size_t& len) {
    const size_t per = (bytes / size_t(threads)) & ~size_t(4095);
    begin = size_t(t) * per;
    len = t == threads - 1 ? bytes - begin : per;
  };
#pragma omp parallel num_threads(threads)
  {
    size_t b, n;
    slice(omp_get_thread_num(), b, n);
    std::memset(src.get() + b, 1, n);
    std::memset(dst.get() + b, 0, n);
  }
  std::vector<double> gbps;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads)
    {
      size_t b, n;
      slice(omp_get_thread_num(), b, n);
      std::memcpy(dst.get() + b, src.get() + b, n);
    }
    const double us = since_us(t0);
    if (rep > 0) gbps.push_back(2.0 * double(bytes) / (us * 1e3));  // the first run is a warm-up
  }
  return median(gbps);
}

// sgemm rate with every core busy: C [M, n] = A [M, K] B^T, each OpenMP thread its own block of
// 512 columns with OpenBLAS single-threaded inside it, the way the CPU backend runs its
// products (cpu/gemm.cpp: one thread pool, not OpenBLAS's pthreads fighting OpenMP's).
double sgemm_tflops(int threads) {
  const int64_t m = 2048, k = 2048, per_thread = 512, n = per_thread * threads;
  std::vector<float> a(size_t(m * k), 0.5f), b(size_t(n * k), 0.25f), c(size_t(m * n));
  openblas_set_num_threads(1);
  std::vector<double> tflops;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads)
    {
      const int64_t n0 = omp_get_thread_num() * per_thread;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(per_thread), blasint(k), 1.0f,
                  a.data(), blasint(k), b.data() + n0 * k, blasint(k), 0.0f, c.data() + n0, blasint(n));
    }
    const double us = since_us(t0);
    if (rep > 0) tflops.push_back(2.0 * double(m) * double(n) * double(k) / (us * 1e6));  // first: warm-up
  }
  return median(tflops);
}

// ---- peak instruction rates: register-only loops of independent accumulators ---------------------
// Each loop runs kChains independent dependency chains (more than latency x pipes on any current
// x86 core: 4-6 cycles x 2 pipes), no loads or stores inside, so it runs at the issue rate of the
// instruction alone. The values stay normal (acc * 0.999 + 1e-3 converges to 1; the dot products
// add 2^-20 a step), so no denormal slow path. Each returns the FLOPs it did.

constexpr int kChains = 24;      // zmm: 24 accumulators + 2 operands of 32 registers
constexpr int kChainsYmm = 12;   // ymm: 12 + 2 of 16

// The loop each peak kernel runs: N chains of vector type V starting at 0, 1, ..., N-1, `iters`
// rounds of step(acc) on every chain, then their sum kept alive. Plain vector arithmetic (no
// intrinsics), always inlined, so it takes the target of the kernel that calls it; `step`, the one
// instruction measured, is a lambda carrying that target too (lambdas do not inherit it).
template <typename V, int N, typename Step>
[[gnu::always_inline]] inline void run_chains(int64_t iters, const Step& step) {
  V acc[N];
  for (int c = 0; c < N; ++c) acc[c] = float(c) - V{};  // c in every lane
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int c = 0; c < N; ++c) step(acc[c]);
  }
  V sum = acc[0];
  for (int c = 1; c < N; ++c) sum += acc[c];
  volatile float sink = sum[0] + sum[sizeof(V) / sizeof(float) - 1];  // keeps the chains alive
  (void)sink;
}

#define MLA_ZMM __attribute__((target("avx512f")))
#define MLA_YMM __attribute__((target("avx2,fma")))
#define MLA_ZMM_BF16 __attribute__((target("avx512f,avx512bf16")))

MLA_ZMM double fma_zmm(int64_t iters) {
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  run_chains<__m512, kChains>(iters, [&](__m512& acc) MLA_ZMM { acc = _mm512_fmadd_ps(acc, a, b); });
  return double(iters) * kChains * 16 * 2;  // 16 lanes, multiply + add
}

MLA_YMM double fma_ymm(int64_t iters) {
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  run_chains<__m256, kChainsYmm>(iters, [&](__m256& acc) MLA_YMM { acc = _mm256_fmadd_ps(acc, a, b); });
  return double(iters) * kChainsYmm * 8 * 2;
}

// vdpbf16ps zmm: per fp32 lane acc += x[2l] y[2l] + x[2l+1] y[2l+1]: 64 FLOPs an instruction, the
// way attend's FLOP formula counts its score dot products (2 per multiply-add of a pair).
MLA_ZMM_BF16 double bf16_dot_zmm(int64_t iters) {
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3F80);  // 1.0
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3580);  // 2^-20
  run_chains<__m512, kChains>(iters, [&](__m512& acc) MLA_ZMM_BF16 { acc = _mm512_dpbf16_ps(acc, x, y); });
  return double(iters) * kChains * 16 * 4;  // 16 lanes, two multiply-adds each
}

// GFLOP/s of `kernel` on every thread at once: each thread runs it in short bursts for 10 ms of
// its own clock and its rate is its FLOPs over its own elapsed time (so a thread that wakes late
// does not dilute the others'); the machine's rate is the sum. The median of 5 such runs (~50 ms).
double peak_gflops(double (*kernel)(int64_t), int threads) {
  constexpr int64_t kBurst = 4096;  // a few microseconds at any rate
  auto run = [&](double us_per_thread) {
    double gflops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : gflops)
    {
      double flops = 0, us = 0;
      const auto t0 = Clock::now();
      do {
        flops += kernel(kBurst);
      } while ((us = since_us(t0)) < us_per_thread);
      gflops += flops / (us * 1e3);
    }
    return gflops;
  };
  run(2000);  // wakes the threads and the vector units' full width
  std::vector<double> gflops;
  for (int rep = 0; rep < 5; ++rep) gflops.push_back(run(10000));
  return median(gflops);
}

}  // namespace

std::vector<double> time_us(const std::function<void()>& fn, int warmup, int iters, int threads) {
  MLA_REQUIRE(warmup >= 0, "cpu::time_us: warmup: expected >= 0, got ", warmup);
  MLA_REQUIRE(iters >= 1, "cpu::time_us: iters: expected >= 1, got ", iters);
  CacheFlusher flusher(std::max(threads, 1));
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> us;
  us.reserve(size_t(iters));
  for (int i = 0; i < iters; ++i) {
    flusher.flush();
    const auto t0 = Clock::now();
    fn();
    us.push_back(since_us(t0));
  }
  return us;
}

detail::Ceilings measure_ceilings(int threads) {
  threads = std::max(threads, 1);
  detail::Ceilings c;
  c.device_name = cpu_model() + " (" + std::to_string(threads) + " threads)";
  c.cache_flush = "write: a buffer of twice the LLC (at least 64 MiB) written before each run";
  c.copy_gbps = copy_gbps(threads);
  c.matmul_tflops = sgemm_tflops(threads);
  c.fp8_matmul_tflops = 0;  // no fp8 matmul on the CPU
  // The instructions attend's arithmetic runs on (attend_kernels.hpp): fp32 FMA at the widest
  // vector width the kernels use, bf16 dot products where the CPU has AVX512-BF16.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  c.fp32_fma_gflops = peak_gflops(avx512 ? fma_zmm : fma_ymm, threads);
  c.bf16_dot_gflops = avx512 && __builtin_cpu_supports("avx512bf16") ? peak_gflops(bf16_dot_zmm, threads) : 0;
  return c;
}

}  // namespace mla::cpu
