// Microbenchmark (session 64, not part of the build; its first run, session 65's call 1, was void: see the loop; first
// valid run session 66 call 1, H100: as the kernel 815 clocks a pair, no growth check or vote 594, exp2 and sums 552,
// no exp2 390, sums only 153; bench/results/2026-12-07-h100-cuda-s66-call1-weights-probe-s68a-revs.json): the
// fp8 many-rows kernel's weights at D's 64 rows alone. attend_rows_kernel.cuh's write_p makes a pair's weights from
// each thread's 32 q.k scores (two tiles of an m64n32 accumulator): w = exp2(x scale - m) (exp2_ftz, MUFU.EX2), the row
// sums, P^T by stmatrix (store_p_t) and the proxy fence; around it the lazy rescale's growth check and the pair's vote
// (a named barrier of both consumer warpgroups). s67a's stamps (session 64) put that part of D's pair at 1079-1163
// cycles where MUFU's rate (16 results a clock an SM, bench/inst_rate.cu) makes the 8192 exponentials 512. This loop
// runs the same instructions with no MMAs, two warpgroups a CTA, one CTA an SM, every SM, by parts (kParts: bit 0 the
// exponentials, else the scores themselves as weights; bit 1 P^T's stores and the fence; bit 2 the growth check, one
// compare a score as before s70a, and the vote). If the kernel's part takes about what this loop takes, the weights are
// at their own floor and only an overlap with the MMAs moves them; if far less, the kernel loses the difference around
// them. On a GPU (from the repository root, one line):
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -DMLA_WITH_CUDA=1
//     --expt-relaxed-constexpr -o /tmp/weights_turn bench/weights_turn.cu && /tmp/weights_turn
#include <cstdint>
#include <cstdio>

#include "cuda/attend_segments.cuh"
#include "cuda/attend_wgmma_tiles.cuh"
#include "probe_clock.cuh"
using namespace mla::cuda;
using namespace mla::cuda::wgmma_attend;

constexpr int kPairs = 256, kRowsN = 64, kWgRows = 32, kAcc = kWgRows / 2, kSlots = kWgRows / 4;
constexpr int kSmemBytes = 200 * 1024;  // (one CTA an SM)

template <int kParts>
__global__ void __launch_bounds__(256, 1) weights(long long* out) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp = (tid / 32) % 4;
  const uint32_t p_smem = ptx::smem_addr(sm);  // P^T of the pair's two tiles, kRowsN x 64 f16 each
  float x[2][kAcc], m_run[kSlots], d_run[kSlots];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) x[t][i] = float((tid * 7 + i * 13 + t * 5) % 97) * 0.05f;
#pragma unroll
  for (int r = 0; r < kSlots; ++r) m_run[r] = 4.0f, d_run[r] = 0.0f;
  const float scale_log2 = 0.1f * 1.4426950408889634f, inv_scale_log2 = 1.0f / scale_log2;
  bool any_grows = false;
  __syncthreads();
  const long long t0 = clock64();
  for (int pair = 0; pair < kPairs; ++pair) {
    // fresh scores every pair, as the q.k accumulators': one FFMA each (in every part, "sums only" too).
    // (Session 65: an empty `asm volatile` emits no PTX instruction, so ptxas saw the same scores every
    // pair and hoisted the exponentials out of the loop: "exp2 and sums only" took 33 clocks a pair
    // against MUFU's 512-clock floor, and every figure of that run was void.)
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) x[t][i] = fmaf(x[t][i], 0.9990234375f, 0.0009765625f);
    bool grows = false;
    if constexpr ((kParts & 4) != 0) {
      float grow_at[kSlots];
#pragma unroll
      for (int r = 0; r < kSlots; ++r) grow_at[r] = (m_run[r] + kLazyRescale) * inv_scale_log2;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) grows |= x[t][i] > grow_at[row_slot(i)];
    }
    float sums[kSlots];
#pragma unroll
    for (int r = 0; r < kSlots; ++r) sums[r] = 0.0f;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      float w[kAcc];
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const float m = m_run[row_slot(i)];
        w[i] = (kParts & 1) != 0 ? exp2_ftz(fmaf(x[t][i], scale_log2, -(m == -INFINITY ? 0.0f : m))) : x[t][i];
        sums[row_slot(i)] += w[i];
      }
      if constexpr ((kParts & 2) != 0)
        store_p_t<kRowsN>(p_smem + t * kRowsN * kTileKeys * 2, w, kWgRows * wg, warp, lane);
    }
    if constexpr ((kParts & 2) != 0) wgmma::fence_proxy_async();
    if constexpr ((kParts & 4) != 0) any_grows |= sync_consumers_or<true, 256>(grows);
#pragma unroll
    for (int r = 0; r < kSlots; ++r) d_run[r] += sums[r];
  }
  const long long clocks = clock64() - t0;
  float sink = any_grows ? 1.0f : 0.0f;
#pragma unroll
  for (int r = 0; r < kSlots; ++r) sink += d_run[r];
  store_clocks(out, clocks, wg, sink);
}

template <int kParts>
void run(const char* name, long long* dout, int sms) {
  auto k = weights<kParts>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  k<<<sms, 256, kSmemBytes>>>(dout);  // warm
  k<<<sms, 256, kSmemBytes>>>(dout);
  const double pair = mean_cta_clocks(dout, sms) / kPairs;
  // MUFU: 16 results a clock an SM, 2 x 128 x 32 exponentials a pair
  std::printf("%-44s clocks a pair %7.1f  (MUFU's floor for its exponentials %4d)  %s\n", name, pair,
              (kParts & 1) != 0 ? 2 * 128 * 32 / 16 : 0, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  const ProbeDevice d = probe_device("a pair's weights for 64 rows (two warpgroups of 32 rows, two 64-key tiles)");
  run<7>("as the kernel (growth, exp2, sums, P^T, vote)", d.dout, d.sms);
  run<3>("no growth check, no vote", d.dout, d.sms);
  run<1>("exp2 and sums only", d.dout, d.sms);
  run<6>("no exp2 (the scores as weights)", d.dout, d.sms);
  run<0>("sums only", d.dout, d.sms);
  return 0;
}
