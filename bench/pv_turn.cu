// Microbenchmark (session 64, not part of the build): the turn of the many-rows kernel's p.v between its k16 steps.
// attend_rows_kernel.cuh issues p.v as 8 steps a pair, each a commit of 4 RS m64nNk16 HGMMAs (V^T widened from fp8 in
// registers, P^T from shared memory), and waits for the step before (`wait<1>`: two commits in flight, the fragments
// double-buffered) before it widens the next step's V. s67a's stamps (session 64) found 7 steps' 1792 clocks of MMAs
// (D, two warpgroups) taking ~2400: ~85 clocks a step. This loop runs that pattern alone, with two (or one) warpgroups
// a CTA, one CTA an SM, every SM, and variants: no widening between steps; three commits in flight (three fragment
// buffers, `wait<2>`); two steps a commit (eight MMAs); the fp8 form (turn_fp8). (Its V: the same bytes a step as the
// kernel's, by LDS.128 where the kernel uses ldmatrix.trans, widened by ptx::fp8x4_to_f16x2x2 without v_convert's
// byte permute: 8 PRMT a step fewer.) On a GPU (from the repository root):
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -o /tmp/pv_turn bench/pv_turn.cu && /tmp/pv_turn
// H100 (session 64, bench/results/2026-12-07-h100-s64-pv-turn.txt), two warpgroups, a pair's clocks against its MMAs':
// N = 64 96% as the kernel (10 clocks a step), 100% without V's loads; N = 48 79% as the kernel (50 a step), 80% with
// the loads but no widening, 91% with the widening but no loads, 100% with neither; three commits in flight change
// nothing at either N; the fp8 form 95% (N = 64) and 87% (N = 48). So the step's cost is V's shared-memory loads beside
// the MMAs' own operand reads (P^T, B, is read once a dim block: at N = 48 ~64 bytes a clock for B plus ~43 for V's
// ldmatrix, near shared memory's 128), not the widening's latency, which a third buffer would have hidden.
// (Those figures are from this file at 2f7e9a0 and 53829ca; the helpers shared with qk_turn.cu since compile the same
// loops, instruction for instruction by kind, with other registers.)
#include <cstdint>
#include <cstdio>

#include "probe_clock.cuh"
#include "cuda/ptx.cuh"
#include "cuda/wgmma.cuh"
using namespace mla::cuda;

constexpr int kPairs = 256, kSteps = 8, kBlocks = 4;

// p.v's accumulators: zeroed, drained at a pair's end, summed to keep them live
template <int kN>
__device__ __forceinline__ void zero_o(float (&o)[kBlocks][kN / 2]) {
#pragma unroll
  for (int b = 0; b < kBlocks; ++b)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) o[b][i] = 0.f;
}
template <int kN>
__device__ __forceinline__ void drain(float (&o)[kBlocks][kN / 2]) {
  wgmma::wait<0>();
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) wgmma::fence_operand(o[b]);
}
template <int kN>
__device__ __forceinline__ float sum_o(const float (&o)[kBlocks][kN / 2]) {
  float s = 0;
#pragma unroll
  for (int b = 0; b < kBlocks; ++b)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) s += o[b][i];
  return s;
}
// V's stand-in bytes (alternate 16-byte units of e4m3 1.0 and 0) and P^T's, then the warpgroups this run times
__device__ __forceinline__ bool fill_smem(uint8_t* sm, int wgs) {
  for (int i = threadIdx.x; i < 96 * 1024 / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(sm)[i] = 0x38383838u * (i & 1);
  __syncthreads();
  return threadIdx.x / 128 < wgs;
}

// kDepth commits in flight (kDepth fragment buffers), kPerCommit k16 steps a commit; kPrep, the fragments between
// steps: 1 loaded from shared memory's fp8 bytes and widened (as p.v does), 0 reused as they are, 2 loaded and not
// widened (an XOR instead), 3 widened from registers (no load).
template <int kN, int kDepth, int kPerCommit, int kPrep>
__global__ void __launch_bounds__(256, 1) turn(long long* out, int wgs) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
  if (!fill_smem(sm, wgs)) return;
  const uint32_t base = ptx::smem_addr(sm);
  const uint32_t p = base + 64 * 1024;  // P^T: kN rows x 16 keys a step
  const uint8_t* v = sm + wg * 16384 + (tid % 128) * 16;
  float o[kBlocks][kN / 2];
  zero_o<kN>(o);
  uint32_t frag[kDepth][kPerCommit][kBlocks][4];
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
#pragma unroll
    for (int s = 0; s < kPerCommit; ++s)
#pragma unroll
      for (int b = 0; b < kBlocks; ++b)
#pragma unroll
        for (int r = 0; r < 4; ++r) frag[d][s][b][r] = 0x3c003c00u * ((lane + b + r) & 1);
  const uint64_t pd = wgmma::descriptor(p, kN / 8 * 128, 128);
  constexpr int kCommits = kSteps / kPerCommit;
  long long t0 = clock64();
  for (int pair = 0; pair < kPairs; ++pair) {
#pragma unroll
    for (int t = 0; t < kCommits; ++t) {
      const int buf = t % kDepth;
      if constexpr (kPrep != 0) {
#pragma unroll
        for (int s = 0; s < kPerCommit; ++s) {
          // 16 fp8 bytes a block pair, widened to 8 f16x2 (p.v's v_convert: two blocks' fragments)
#pragma unroll
          for (int jj = 0; jj < kBlocks / 2; ++jj) {
            uint4 raw;
            if constexpr (kPrep == 3) {  // no load: the bytes from a register the loop changes
              const uint32_t x = frag[(buf + 1) % kDepth][s][2 * jj][0] ^ (t * 0x01010101u);
              raw = make_uint4(x, x ^ 1, x ^ 2, x ^ 3);
            } else {
              raw = *reinterpret_cast<const uint4*>(v + ((t * kPerCommit + s) * 2 + jj) * 2048 % 16384);
            }
            const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              uint32_t lo, hi;
              if constexpr (kPrep == 2) {  // loaded, not widened
                lo = w[r], hi = w[r] ^ 0x00ff00ffu;
              } else {
                ptx::fp8x4_to_f16x2x2(w[r], lo, hi);
              }
              frag[buf][s][2 * jj + r / 2][(r % 2) * 2] = lo;
              frag[buf][s][2 * jj + r / 2][(r % 2) * 2 + 1] = hi;
            }
          }
        }
      }
      wgmma::fence();
#pragma unroll
      for (int s = 0; s < kPerCommit; ++s)
#pragma unroll
        for (int b = 0; b < kBlocks; ++b)
          wgmma::mma_pv_f16_rs<kN>(o[b], frag[buf][s][b],
                                   wgmma::advance(pd, (t * kPerCommit + s) % 4 * 2 * (kN / 8 * 128)));
      wgmma::commit();
      if (t + 1 < kCommits) {
        if constexpr (kDepth == 3) wgmma::wait<2>();
        else wgmma::wait<1>();
      }
    }
    drain<kN>(o);  // the pair's end (the kernel drains p.v under the next pair's q.k)
  }
  store_clocks(out, clock64() - t0, wg, sum_o<kN>(o));
}

// The fp8 form (s65a's, session 63, at 64 rows; removed): k32 steps, each two k16 halves of V^T's bytes permuted into
// e4m3 A fragments (8 prmt a block pair, no widening) times P^T's hi and lo halves: 2 RS QGMMA m64nNk32 a dim block, a
// commit a k32 step (4 a pair), the same MMA time as the f16 form's 8 commits.
template <int kN>
__device__ __forceinline__ void qgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kN == 48) wgmma::mma_m64n48k32_e4m3_rs(d, a, b, true);
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : MLA_WGMMA_D32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <int kN>
__global__ void __launch_bounds__(256, 1) turn_fp8(long long* out, int wgs) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const int tid = threadIdx.x, wg = tid / 128;
  if (!fill_smem(sm, wgs)) return;
  const uint32_t p = ptx::smem_addr(sm) + 64 * 1024;
  const uint8_t* v = sm + wg * 16384 + (tid % 128) * 16;
  float o[kBlocks][kN / 2];
  zero_o<kN>(o);
  uint32_t frag[2][kBlocks][4];
  const uint64_t pd = wgmma::descriptor(p, kN / 8 * 128, 128);
  constexpr int kCommits = kSteps / 2;
  long long t0 = clock64();
  for (int pair = 0; pair < kPairs; ++pair) {
#pragma unroll
    for (int t = 0; t < kCommits; ++t) {
      const int buf = t & 1;
#pragma unroll
      for (int jj = 0; jj < kBlocks / 2; ++jj) {
        const uint4 r0 = *reinterpret_cast<const uint4*>(v + ((2 * t) * 2 + jj) * 2048 % 16384);
        const uint4 r1 = *reinterpret_cast<const uint4*>(v + ((2 * t + 1) * 2 + jj) * 2048 % 16384);
        auto perm = [](uint32_t x, uint32_t y, uint32_t& even, uint32_t& odd) {
          asm("prmt.b32 %0, %2, %3, 0x6240;\n prmt.b32 %1, %2, %3, 0x7351;\n" : "=r"(even), "=r"(odd) : "r"(x), "r"(y));
        };
        perm(r0.x, r0.y, frag[buf][2 * jj][0], frag[buf][2 * jj][1]);
        perm(r1.x, r1.y, frag[buf][2 * jj][2], frag[buf][2 * jj][3]);
        perm(r0.z, r0.w, frag[buf][2 * jj + 1][0], frag[buf][2 * jj + 1][1]);
        perm(r1.z, r1.w, frag[buf][2 * jj + 1][2], frag[buf][2 * jj + 1][3]);
      }
      wgmma::fence();
      const uint64_t hi = wgmma::advance(pd, t % 2 * 2 * (kN / 8 * 128)), lo = wgmma::advance(hi, kN * 64);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        qgmma_rs<kN>(o[b], frag[buf][b], hi);
        qgmma_rs<kN>(o[b], frag[buf][b], lo);
      }
      wgmma::commit();
      if (t + 1 < kCommits) wgmma::wait<1>();
    }
    drain<kN>(o);
  }
  store_clocks(out, clock64() - t0, wg, sum_o<kN>(o));
}

template <int kN, int kDepth, int kPerCommit, int kPrep>
void run(const char* name, long long* dout, int sms, int wgs) {
  auto k = kDepth == 0 ? turn_fp8<kN> : turn<kN, (kDepth > 0 ? kDepth : 2), kPerCommit, kPrep>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024);
  k<<<sms, 256, 96 * 1024>>>(dout, wgs);  // warm
  k<<<sms, 256, 96 * 1024>>>(dout, wgs);
  const double pair = mean_cta_clocks(dout, sms) / kPairs;
  const double mma = double(kSteps) * kBlocks * wgs * (kN / 2);  // f16: N / 2 clocks an MMA
  printf("%-34s N=%d wgs=%d  clocks a pair %7.1f  MMAs' own %6.0f  (%.0f%%)  turn a step %5.1f  %s\n", name, kN, wgs,
         pair, mma, 100.0 * mma / pair, (pair - mma) / kSteps, cudaGetErrorString(cudaGetLastError()));
}
// The variants at one N (the output's order: the kernel's, its parts, then the other forms)
template <int kN>
void run_all(long long* dout, int sms, int wgs) {
  run<kN, 2, 1, 1>("as the kernel (2 in flight, widen)", dout, sms, wgs);
  run<kN, 2, 1, 0>("2 in flight, no load, no widening", dout, sms, wgs);
  run<kN, 2, 1, 2>("2 in flight, load, no widening", dout, sms, wgs);
  run<kN, 2, 1, 3>("2 in flight, widen, no load", dout, sms, wgs);
  run<kN, 3, 1, 1>("3 in flight, widen", dout, sms, wgs);
  if constexpr (kN == 64) run<kN, 2, 2, 1>("2 steps a commit, widen", dout, sms, wgs);
  run<kN, 0, 1, 1>("fp8 (s65a: prmt, k32 hi + lo)", dout, sms, wgs);
}
int main() {
  const ProbeDevice d = probe_device("a pair = 8 k16 steps x 4 blocks of m64nNk16 RS f16 a warpgroup");
  for (int wgs = 2; wgs >= 1; --wgs) {
    run_all<64>(d.dout, d.sms, wgs);
    run_all<48>(d.dout, d.sms, wgs);
  }
  return 0;
}
