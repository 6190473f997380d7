// What the two fp8 many-rows kernels share (attend_rows.cu: pairs of key tiles, TMA or gathered;
// attend_rows_pipe.cu: single-tile stages, TMA): the CTA's shape and the end of a segment.
#pragma once

#include "core/softmax_state.hpp"
#include "cuda/attend_wgmma_tiles.cuh"

namespace mla::cuda::rows {

using namespace wgmma_attend;

constexpr int kGroups = 2;                      // consumer warpgroups
constexpr int kRowThreads = 128 * kGroups;
constexpr int kGroupDimBlocks = kDimBlocks / kGroups;  // p.v: 4 blocks of 64 dims a warpgroup
constexpr int kQkGroup = 2;                     // k32 steps an f32-summed q.k accumulator takes
constexpr int kQkGroups = kQkSteps / kQkGroup;  // 9

// A CTA's query rows (wgmma N of p.v): kAttendRowsPerCta (64), or 48 or 32 where that many CTAs a
// request hold its rows (48 rows of 12 heads x qlen 4, 96 of 12 x 8 or 96 heads, 32 of 16 x 2:
// 64-row CTAs padded their MMAs and softmax with rows past the request's).
template <int kRowsN>
struct RowShape {
  static_assert(kRowsN == 64 || kRowsN == 48 || kRowsN == 32, "64-, 48- or 32-row CTAs");
  static constexpr int kWgRows = kRowsN / kGroups;         // q.k's N: a warpgroup's rows (32, 24, 16)
  static constexpr int kQkAcc = kWgRows / 2;               // a thread's q.k accumulator (16, 12, 8)
  static constexpr int kPvAcc = kRowsN / 2;                // a thread's o of one dim block (32, 24, 16)
  static constexpr int kSlots = kWgRows / 4;               // a thread's own query rows (softmax state)
  static constexpr int kRowChunkStride = kRowsN / 8 * 128;  // B operands' leading byte offset
};

// The end of a segment: row sums of this warpgroup's rows (over the 8 lanes of a column, then its
// 4 warps); the rows' final state goes through shared memory to both warpgroups, each of which
// writes its dims of all rows. The caller has drained its wgmmas (o complete).
template <int kRowsN>
__device__ __forceinline__ void finish_rows(const AttendParams& p, float (&red)[kGroups * 4][kRowsN], float* final_m,
                                            float* final_d, const float (&d_run)[RowShape<kRowsN>::kSlots],
                                            const float (&m_run)[RowShape<kRowsN>::kSlots],
                                            const float (&o)[kGroupDimBlocks][RowShape<kRowsN>::kPvAcc], int64_t part,
                                            int64_t tok_base, int m_base, int rows_total, int tid) {
  constexpr int kSlots = RowShape<kRowsN>::kSlots, kWgRows = RowShape<kRowsN>::kWgRows;
  const int wg = tid / 128, warp = (tid / 32) % 4, cwarp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  float d[kSlots];
#pragma unroll
  for (int r = 0; r < kSlots; ++r) {
    d[r] = d_run[r];
    d[r] += __shfl_xor_sync(0xffffffffu, d[r], 4);
    d[r] += __shfl_xor_sync(0xffffffffu, d[r], 8);
    d[r] += __shfl_xor_sync(0xffffffffu, d[r], 16);
  }
  __syncthreads();  // red is free
  if (g == 0)
#pragma unroll
    for (int r = 0; r < kSlots; ++r) red[cwarp][slot_col(r, c)] = d[r];
  __syncthreads();
  if (warp == 0 && g == 0)
#pragma unroll
    for (int r = 0; r < kSlots; ++r) {
      const int n = slot_col(r, c);
      final_d[kWgRows * wg + n] = (red[4 * wg][n] + red[4 * wg + 1][n]) + (red[4 * wg + 2][n] + red[4 * wg + 3][n]);
      final_m[kWgRows * wg + n] = m_run[r];
    }
  __syncthreads();

#pragma unroll
  for (int r = 0; r < 2 * kSlots; ++r) {  // the p.v accumulator's columns of this thread
    const int n = slot_col(r, c), m = m_base + n;
    if (m >= rows_total) continue;
    // Natural-log state for the shared rules: lse = ln 2 * (m + log2 d); empty rows o = 0, lse = -inf.
    SoftmaxState f;
    f.d = final_d[n];
    f.m = f.empty() ? -INFINITY : final_m[n] * 0.6931471805599453f;
    const float scale = f.inv_sum() * p.v_scale;
    const OutRow out(p, part, tok_base, m);
    const int i0 = 4 * (r >> 1) + (r & 1);  // elements i0 (dim 2g) and i0 + 2 (dim 2g + 1)
#pragma unroll
    for (int blk = 0; blk < kGroupDimBlocks; ++blk)
      out.store_pair(p, 64 * (kGroupDimBlocks * wg + blk) + 16 * warp + 2 * g, o[blk][i0] * scale, o[blk][i0 + 2] * scale);
    if (cwarp == 0 && g == 0) p.lse[out.lse_index] = f.lse();
  }
}

}  // namespace mla::cuda::rows
