// Microbenchmark (session 69, not part of the build): how fast an SM runs straight-line code it has not run
// yet (instructions fetched from L2 or DRAM) against the same code run again. The question it answers: how much
// of the 16-row kernel's ~2.9 µs from a CTA's start to its first boxes (docs/attention.md, the fp8 memory-bound
// targets; sessions 22-26 took the divisions and dependent loads off that path for 1-4%) can be the fetch of its
// prologue's code, ~14 KB from its entry to the first UTMALDG (0x3950-0x70b0 of the default TMA instance's SASS,
// after a jump over the flat plan's scan), as every SM starts the kernel at once.
// Each of the grid's CTAs (one warp, one CTA an SM) runs a body of kLen unrolled FFMAs (8 independent chains, so
// ~1 a clock once fetched; 16 bytes an instruction) twice (a loop of two passes, not unrolled) and stamps clock64
// and globaltimer before, between and after: pass 1 fetches the body, pass 2 runs it from the instruction caches.
// The launches follow each other on one stream: the same kernel twice (does its code stay cached from one launch
// to the next?), another kernel of the same size, then the first again; then after reads of 4x the L2 (as
// mla_graph_bench flushes it before each timed replay: the code from DRAM). On a GPU (from the repository root):
//   nvcc -arch=sm_90a -O3 -o /tmp/ifetch bench/ifetch_probe.cu && /tmp/ifetch
// Prints a line a launch: the median over CTAs of each pass's clocks, the cold pass's extra clocks a 128-byte line
// of code, and its ns at the measured clock. Then `chains`: the clocks of one dependent round trip at a kernel's start,
// through the constant cache (the kernel's parameters) and to global memory, from DRAM and from L2, so that the
// 16-row kernel's stamps (scripts/device-check timeline) can be read as so many fetches and round trips.
// Session 70 (after the first run, session 70's call 1: straight code cold ~43 ns a KB more than warm): `hops`, run
// blocks with forward jumps over code not run, to price a cold branch target beside the straight-line fetch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kChains = 8;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "ifetch_probe: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}
#define CHECK(x) check((x), #x)

__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// kLen unrolled FFMAs over kChains independent chains (~1 instruction a clock once fetched; 16 bytes each),
// a * f + b: the immediates make an instance's code its own.
template <int kLen>
__device__ __forceinline__ void ffmas(float (&f)[kChains], float a, float b) {
#pragma unroll
  for (int i = 0; i < kLen; ++i) {
    const int c = i % kChains;
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(f[c]) : "f"(a), "f"(b));
  }
}

// A CTA's thread runs body(chains) twice (a loop of two passes, not unrolled), stamped by clock64 and globaltimer
// before, between and after; thread 0 stores pass 1's and pass 2's clocks and ns, and the chains' sum tested (keeps
// them live), into the CTA's 5 words of out.
template <class Body>
__device__ __forceinline__ void two_passes(long long* out, float seed, Body&& body) {
  float f[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) f[c] = seed * float(c + 1 + threadIdx.x);
  long long clk[3], ns[3];
  clk[0] = clock64(), ns[0] = global_ns();
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    body(f);
    clk[pass + 1] = clock64(), ns[pass + 1] = global_ns();
  }
  float sum = 0;
#pragma unroll
  for (int c = 0; c < kChains; ++c) sum += f[c];
  if (threadIdx.x == 0) {
    long long* o = out + 5 * blockIdx.x;
    o[0] = clk[1] - clk[0], o[1] = clk[2] - clk[1], o[2] = ns[1] - ns[0], o[3] = ns[2] - ns[1];
    o[4] = sum == 12345.f;
  }
}

// kSalt makes each instance's code its own (the FFMAs' immediate), so launches of two instances share no lines.
template <int kLen, int kSalt>
__global__ void __launch_bounds__(32, 1) straight(long long* out, float seed) {
  two_passes(out, seed, [](float (&f)[kChains]) { ffmas<kLen>(f, 0.999f + 1e-6f * kSalt, 1e-3f); });
}

// Session 70: the same with jumps. kBlocks blocks of kExec FFMAs run, each followed by a block of kSkip FFMAs behind a
// branch never taken (a runtime-false `skip`: ptxas keeps it in place, a forward BRA over it), so pass 1 fetches the
// run blocks' lines after a jump of kSkip * 16 bytes each, as the 16-row kernel's prologue jumps over the paths a
// launch does not take (the flat plan's scan, ~13 KB, and shorter ones). Against `straight` of the same run bytes:
// what a cold branch target costs beyond the straight-line fetch.
template <int kBlocks, int kExec, int kSkip, int kSalt>
__global__ void __launch_bounds__(32, 1) hops(long long* out, float seed, int skip) {
  two_passes(out, seed, [skip](float (&f)[kChains]) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      ffmas<kExec>(f, 0.999f + 1e-6f * kSalt, 1e-3f);
      if (skip) ffmas<kSkip>(f, 0.5f + 1e-6f * (kSalt + b), 2e-3f);
    }
  });
}

// Reads a buffer of several times the L2 (as mla_graph_bench's L2 flush does before each timed replay), so that
// the next launch's code comes from DRAM, not L2.
__global__ void flush_l2(const float4* buf, size_t n, float* sink) {
  float acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    acc += buf[i].x;
  if (acc == 12345.f) *sink = acc;
}

// The prologue's other ingredient, a chain of dependent round trips (the request head, the page ids; the kernel's
// parameters come through the constant cache): kHops dependent reads of a __grid_constant__ array 128 bytes apart
// (each a constant-cache line of its own), then kHops dependent global loads 64 KB apart (a line and a DRAM page each,
// another 256 bytes for each CTA, so no two SMs share one), stamped by clock64 before, between and after. The
// launch after an L2 flush times DRAM round trips; the one after it, L2's.
constexpr int kHops = 16, kStrideWords = 32, kChaseStride = 16384;  // 128 bytes; 64 KB in ints
struct ChainParams {
  int idx[kHops * kStrideWords];  // 2 KB: idx[32 h] = 32 (h + 1), the last back to 0
};
__global__ void __launch_bounds__(32, 1) chains(const __grid_constant__ ChainParams cp, const int* chase, long long* out) {
  long long clk[3];
  clk[0] = clock64();
  int cur = 0;
#pragma unroll 1
  for (int h = 0; h < kHops; ++h) cur = cp.idx[cur];
  clk[1] = clock64();
  int off = int(blockIdx.x) * 64 + (cur & 1);  // (cur is 0 here: the chase starts after the constant chain)
#pragma unroll 1
  for (int h = 0; h < kHops; ++h) off = __ldcg(chase + off);
  clk[2] = clock64();
  if (threadIdx.x == 0) {
    long long* o = out + 5 * blockIdx.x;
    o[0] = clk[1] - clk[0], o[1] = clk[2] - clk[1], o[2] = off, o[3] = 0, o[4] = 0;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// After a launch of `sms` CTAs: its errors checked, and the CTAs' 5 words each as columns (column k: word k of
// every CTA).
std::vector<std::vector<double>> columns(int sms, const long long* d_out) {
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<long long> h(5 * sms);
  CHECK(cudaMemcpy(h.data(), d_out, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::vector<std::vector<double>> cols(5);
  for (int b = 0; b < sms; ++b)
    for (int k = 0; k < 5; ++k) cols[k].push_back(double(h[5 * b + k]));
  return cols;
}

// One line of the table: the launch just made (kLen instructions run a pass).
void report(const char* what, int sms, int len, long long* d_out) {
  const auto cols = columns(sms, d_out);
  const std::vector<double>& c1 = cols[0];
  const double m1 = median(c1), m2 = median(cols[1]), t1 = median(cols[2]), t2 = median(cols[3]);
  const double lines = len * 16.0 / 128;
  std::printf("%-34s body %6d B: pass 1 %8.0f clk %7.0f ns | pass 2 %8.0f clk %7.0f ns | cold extra %6.1f clk a line, "
              "%6.1f ns a KB (max pass 1 %8.0f clk)\n",
              what, len * 16, m1, t1, m2, t2, (m1 - m2) / lines, (t1 - t2) / (len * 16.0 / 1024),
              *std::max_element(c1.begin(), c1.end()));
}

template <int kLen, int kSalt>
void launch(const char* what, int sms, long long* d_out) {
  straight<kLen, kSalt><<<sms, 32>>>(d_out, 1e-3f);
  report(what, sms, kLen, d_out);
}

template <int kBlocks, int kExec, int kSkip, int kSalt>
void launch_hops(const char* what, int sms, long long* d_out) {
  hops<kBlocks, kExec, kSkip, kSalt><<<sms, 32>>>(d_out, 1e-3f, 0);
  report(what, sms, kBlocks * kExec, d_out);
}

void launch_chains(const char* what, int sms, const int* d_chase, long long* d_out) {
  ChainParams cp{};
  for (int h = 0; h < kHops; ++h) cp.idx[h * kStrideWords] = h + 1 < kHops ? (h + 1) * kStrideWords : 0;
  chains<<<sms, 32>>>(cp, d_chase, d_out);
  const auto cols = columns(sms, d_out);
  const std::vector<double>& c = cols[0];  // constant hops
  const std::vector<double>& g = cols[1];  // global hops
  std::printf("%-34s %d dependent hops: constant %6.0f clk a hop (max %6.0f) | global %6.0f clk a hop (max %6.0f)\n",
              what, kHops, median(c) / kHops, *std::max_element(c.begin(), c.end()) / kHops, median(g) / kHops,
              *std::max_element(g.begin(), g.end()) / kHops);
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long long* d_out = nullptr;
  CHECK(cudaMalloc(&d_out, 5 * sms * sizeof(long long)));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; one warp a CTA, one CTA an SM\n", prop.name, sms);
  // 14 KB, the prologue's size; 64 KB, past the L1 instruction cache's reach if it is smaller.
  launch<896, 1>("A 14 KB, first launch", sms, d_out);
  launch<896, 1>("A again", sms, d_out);
  launch<896, 2>("B (other code, same size)", sms, d_out);
  launch<896, 1>("A after B", sms, d_out);
  launch<4096, 3>("C 64 KB, first launch", sms, d_out);
  launch<4096, 3>("C again", sms, d_out);
  launch<896, 1>("A after C", sms, d_out);
  // The L2 flushed by reading 4x its size: A's code (and C's) from DRAM again.
  const size_t flush_bytes = 4 * size_t(prop.l2CacheSize);
  float4* flush = nullptr;
  float* sink = nullptr;
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMalloc(&sink, sizeof(float)));
  CHECK(cudaMemset(flush, 0, flush_bytes));
  for (int k = 0; k < 2; ++k) {
    flush_l2<<<4 * sms, 512>>>(flush, flush_bytes / sizeof(float4), sink);
    CHECK(cudaGetLastError());
    launch<896, 1>(k == 0 ? "A after an L2 flush" : "A after another L2 flush", sms, d_out);
  }
  flush_l2<<<4 * sms, 512>>>(flush, flush_bytes / sizeof(float4), sink);
  launch<4096, 3>("C after an L2 flush", sms, d_out);
  // The round trips: each CTA chases its own 256 bytes of 17 lines 64 KB apart.
  std::vector<int> chase_h(size_t(kHops + 1) * kChaseStride, 0);
  for (int b = 0; b < sms; ++b)
    for (int h = 0; h < kHops; ++h) chase_h[size_t(h) * kChaseStride + b * 64] = (h + 1) * kChaseStride + b * 64;
  int* d_chase = nullptr;
  CHECK(cudaMalloc(&d_chase, chase_h.size() * sizeof(int)));
  CHECK(cudaMemcpy(d_chase, chase_h.data(), chase_h.size() * sizeof(int), cudaMemcpyHostToDevice));
  flush_l2<<<4 * sms, 512>>>(flush, flush_bytes / sizeof(float4), sink);
  launch_chains("chains after an L2 flush", sms, d_chase, d_out);
  launch_chains("chains again (L2)", sms, d_chase, d_out);
  CHECK(cudaFree(d_chase));
  // Jumps (session 70): 8 run blocks of 1 KB, each jumping over 0, 2 or 16 KB not run, against 8 KB straight; each
  // after an L2 flush, as the graph bench's replays.
  flush_l2<<<4 * sms, 512>>>(flush, flush_bytes / sizeof(float4), sink);
  launch<512, 5>("E 8 KB straight, after a flush", sms, d_out);
  flush_l2<<<4 * sms, 512>>>(flush, flush_bytes / sizeof(float4), sink);
  launch_hops<8, 64, 0, 6>("H 8 x 1 KB, no jumps, after a flush", sms, d_out);
  flush_l2<<<4 * sms, 512>>>(flush, flush_bytes / sizeof(float4), sink);
  launch_hops<8, 64, 128, 7>("H 8 x 1 KB, jumps of 2 KB", sms, d_out);
  flush_l2<<<4 * sms, 512>>>(flush, flush_bytes / sizeof(float4), sink);
  launch_hops<8, 64, 1024, 8>("H 8 x 1 KB, jumps of 16 KB", sms, d_out);
  flush_l2<<<4 * sms, 512>>>(flush, flush_bytes / sizeof(float4), sink);
  launch_hops<8, 16, 1024, 9>("H 8 x 256 B, jumps of 16 KB", sms, d_out);
  // One CTA only: the fetch without 131 other SMs asking for the same lines.
  launch<896, 4>("D 14 KB, first launch, 1 CTA", 1, d_out);
  CHECK(cudaFree(flush));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(d_out));
  return 0;
}
