// Microbenchmark (session 64, not part of the build): the many-rows kernel's q.k group pattern alone, at D's 64 rows.
// attend_rows_kernel.cuh scores a pair at 64 rows as each warpgroup's 32 rows against both tiles: SS QGMMA m64n32k32,
// f32-summed groups of 2 k32 steps (fp8 accumulation: s17e), the two tiles' groups alternating with `wait<1>`, 18
// groups a warpgroup (1728 clocks of the pair by the 16 + N / 4 rule, bench/wgmma_rate.cu). q.k split by tile (each
// warpgroup its tile for all 64 rows, m64n64k32: the keys read once, 1152 clocks) did not fit the registers with
// two groups in flight (session 29: 4% slower with one; session 64: 1.4 KB spills with two). This loop times the
// patterns alone, two warpgroups, one CTA an SM, every SM: the kernel's; split with one group in flight (`wait<0>`);
// split with two (`wait<1>`). On a GPU (from the repository root):
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -o /tmp/qk_turn bench/qk_turn.cu && /tmp/qk_turn
// H100 (session 64, bench/results/2026-12-07-h100-s64-qk-turn.txt), clocks a pair: the kernel's 1932 (89% of its
// 1728), split with one group in flight 2153 (slower: each warpgroup waits out its group and its 32 sums while the
// other's one group runs), split with two 1637 (15% under the kernel's, 70% of its own 1152). So at 64 rows the split
// q.k could give back at most ~300 of the pair's ~5900 cycles, and only in the form that spills.
// (Those figures are from this file at 53829ca; the clock helpers shared with pv_turn.cu since leave its loops as
// they were.)
#include <cstdint>
#include <cstdio>

#include "probe_clock.cuh"
#include "cuda/ptx.cuh"
#include "cuda/wgmma.cuh"
using namespace mla::cuda;

constexpr int kPairs = 256, kQkSteps = 18, kGroupSteps = 2, kNGroups = kQkSteps / kGroupSteps;

// The keys' k32 step s in a 128-byte-swizzled tile of 5 slabs (64 keys x 128 bytes each), as key_step_offset.
__device__ __forceinline__ int key_step(int s) { return (s / 4) * 8192 + (s % 4) * 32; }

// kSplit = false: the kernel's (N = 32, both tiles a warpgroup, two groups in flight across the tiles);
// true: split by tile (N = 64, the warpgroup's tile), kInFlight groups in flight.
template <bool kSplit, int kInFlight>
__global__ void __launch_bounds__(256, 1) turn(long long* out) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const int tid = threadIdx.x, wg = tid / 128;
  for (int i = tid; i < 200 * 1024 / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(sm)[i] = 0x38383838u * ((i >> 3) & 1);
  __syncthreads();
  const uint32_t base = ptx::smem_addr(sm);
  const uint32_t tiles = base, q = base + 2 * 40960;  // two 40 KB key tiles, then the query (64 rows x 576)
  constexpr int kN = kSplit ? 64 : 32, kAcc = kN / 2, kTiles = kSplit ? 1 : 2;
  const int chunk_stride = 64 / 8 * 128;  // the query tile's 64 rows
  float x[kTiles][kAcc], acc[2][kAcc];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) x[t][i] = 0.f;
#pragma unroll
  for (int u = 0; u < 2; ++u)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[u][i] = 0.f;
  const uint64_t q_desc = wgmma::descriptor(q + (kSplit ? 0 : wg * 32 / 8 * 128), chunk_stride, 128);
  float sink = 0.f;
  long long t0 = clock64();
  for (int pair = 0; pair < kPairs; ++pair) {
    if constexpr (!kSplit) {
      // the kernel's: tile u's group grp into acc[u], both tiles' first groups out, then wait<1> each and sum
      auto issue = [&](int u, int grp) {
        wgmma::fence();
#pragma unroll
        for (int v = 0; v < kGroupSteps; ++v) {
          const int s = grp * kGroupSteps + v;
          wgmma::mma_qk_e4m3<32>(acc[u], wgmma::descriptor_sw128(tiles + u * 40960 + key_step(s)),
                                 wgmma::advance(q_desc, s * 2 * chunk_stride), v > 0);
        }
        wgmma::commit();
        wgmma::fence_operand(acc[u]);
      };
      issue(0, 0);
      issue(1, 0);
#pragma unroll
      for (int grp = 0; grp < kNGroups; ++grp)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (grp + 1 == kNGroups && u == 1) wgmma::wait<0>();
          else wgmma::wait<1>();
          wgmma::fence_operand(acc[u]);
#pragma unroll
          for (int i = 0; i < kAcc; ++i) x[u][i] = grp == 0 ? acc[u][i] : x[u][i] + acc[u][i];
          if (grp + 1 < kNGroups) issue(u, grp + 1);
        }
    } else {
      // split: the warpgroup's tile wg for all 64 rows, kInFlight groups in flight (acc[grp % kInFlight])
      auto issue = [&](int slot, int grp) {
        wgmma::fence();
#pragma unroll
        for (int v = 0; v < kGroupSteps; ++v) {
          const int s = grp * kGroupSteps + v;
          wgmma::mma_m64n64k32_e4m3(acc[slot], wgmma::descriptor_sw128(tiles + wg * 40960 + key_step(s)),
                                    wgmma::advance(q_desc, s * 2 * chunk_stride), v > 0);
        }
        wgmma::commit();
        wgmma::fence_operand(acc[slot]);
      };
#pragma unroll
      for (int grp = 0; grp < kInFlight; ++grp) issue(grp, grp);
#pragma unroll
      for (int grp = 0; grp < kNGroups; ++grp) {
        const int slot = grp % kInFlight;
        if (kInFlight == 1 || grp + 1 == kNGroups) wgmma::wait<0>();
        else wgmma::wait<1>();
        wgmma::fence_operand(acc[slot]);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) x[0][i] = grp == 0 ? acc[slot][i] : x[0][i] + acc[slot][i];
        if (grp + kInFlight < kNGroups) issue(slot, grp + kInFlight);
      }
    }
    // the scores' use (the softmax's place; kept short: this times q.k alone)
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) sink += x[t][i];
  }
  store_clocks(out, clock64() - t0, wg, sink);
}

template <bool kSplit, int kInFlight>
void run(const char* name, long long* dout, int sms) {
  auto k = turn<kSplit, kInFlight>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  k<<<sms, 256, 200 * 1024>>>(dout);  // warm
  k<<<sms, 256, 200 * 1024>>>(dout);
  const double pair = mean_cta_clocks(dout, sms) / kPairs;
  const double rule = kSplit ? 2.0 * kQkSteps * (16 + 64 / 4) : 2.0 * 2 * kQkSteps * (16 + 32 / 4);  // both warpgroups
  printf("%-40s clocks a pair %7.1f  by the 16 + N / 4 rule %6.0f  (%.0f%%)  %s\n", name, pair, rule,
         100.0 * rule / pair, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  const ProbeDevice d = probe_device("q.k of a pair (2 tiles x 64 keys) for 64 rows, two warpgroups");
  run<false, 2>("the kernel's (N = 32, both tiles, wait<1>)", d.dout, d.sms);
  run<true, 1>("split by tile, 1 group in flight", d.dout, d.sms);
  run<true, 2>("split by tile, 2 groups in flight", d.dout, d.sms);
  return 0;
}
