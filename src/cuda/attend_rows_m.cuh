#pragma once
// The pieces the two "rows on M" many-rows kernels share (attend_rows_bf16.cu, attend_rows_fp8s.cu):
// a thread's two query rows of the m64nN accumulator layout (row0 = 16 warp + g and row0 + 8) and
// their softmax state as it passes from the owner of a tile to the other warpgroup; the tile's
// scores masked, its maxima, its weights P; the epilogue's row sums and stores.
#include <cstdint>

#include "core/softmax_state.hpp"
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/ptx.cuh"

namespace mla::cuda::rows_m {

using wgmma_attend::kLazyRescale;

// Accumulator element i of an m64n64 tile: row row0 + 8 h(i), key key(i, c) of the tile.
__device__ __forceinline__ int acc_h(int i) { return (i >> 1) & 1; }
__device__ __forceinline__ int acc_key(int i, int c) { return 8 * (i >> 2) + 2 * c + (i & 1); }

struct Chain {
  float m_run[2] = {-INFINITY, -INFINITY}, d_run[2] = {0.0f, 0.0f};  // log2 units (scaled scores)

  // The other warpgroup published the running maxima after its tile (m_pub: 64 rows): o and this
  // warpgroup's share of the row sums move by alpha (the owner's rule on the same operands: the
  // same alpha). Returns whether a row of this thread moved.
  __device__ __forceinline__ bool take(const float* m_pub, int row0, float (&alpha)[2]) {
    bool moved = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = m_pub[row0 + 8 * h];
      alpha[h] = 1.0f;
      if (m_new != m_run[h]) {
        alpha[h] = exp2f(m_run[h] - m_new);
        m_run[h] = m_new;
        d_run[h] *= alpha[h];
        moved = true;
      }
    }
    return moved;
  }

  // The owner's tile: the rows' maxima over the scores (masked already) and the lazy rescale: a row's
  // maximum moves only past m_run + 2^3 (weights stay <= 2^8), to the tile's maximum; -inf stays -inf
  // while a row sees nothing. The new maxima go to m_pub (one thread of the quad).
  __device__ __forceinline__ bool own(const float (&s)[32], float scale_log2, int row0, int c, float* m_pub,
                                      float (&alpha)[2]) {
    bool moved = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int i = 2 * h; i < 32; i += 4) mx = fmaxf(mx, fmaxf(s[i], s[i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float tile_max = mx * scale_log2;
      alpha[h] = 1.0f;
      if (tile_max > m_run[h] + kLazyRescale) {
        alpha[h] = exp2f(m_run[h] - tile_max);  // 0 from -inf
        m_run[h] = tile_max;
        d_run[h] *= alpha[h];
        moved = true;
      }
      if (c == 0) m_pub[row0 + 8 * h] = m_run[h];
    }
    return moved;
  }

  // P = exp2(s scale - m) in 16 bits (kF16: f16, else bf16) as p.v's A fragments (k16 step ks: a[0]
  // row0 keys 16 ks + 2c, +1; a[1] row0 + 8; a[2], a[3] the keys + 8: accumulator elements 8 ks + 2e,
  // + 1), added to the row sums, and stored for the other warpgroup at p_mine (this thread's 4 bytes
  // of a 64-row x 64-key K-major core-matrix tile, chunks chunk_stride apart).
  template <bool kF16>
  __device__ __forceinline__ void weights(const float (&s)[32], float scale_log2, uint32_t p_mine, int chunk_stride,
                                          uint32_t (&pa)[wgmma_attend::kPvSteps][4]) {
    const float neg_m[2] = {m_run[0] == -INFINITY ? 0.0f : -m_run[0], m_run[1] == -INFINITY ? 0.0f : -m_run[1]};
#pragma unroll
    for (int ks = 0; ks < wgmma_attend::kPvSteps; ++ks)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 8 * ks + 2 * e, h = e & 1;
        const float w0 = exp2f(fmaf(s[i], scale_log2, neg_m[h])), w1 = exp2f(fmaf(s[i + 1], scale_log2, neg_m[h]));
        d_run[h] += w0 + w1;
        pa[ks][e] = kF16 ? ptx::pack_f16x2(w0, w1) : ptx::pack_bf16x2(w0, w1);
        // row0 + 8 h, keys 16 ks + 8 (e / 2) + 2c: chunk 2 ks + e / 2
        ptx::st_shared_b32(p_mine + (2 * ks + (e >> 1)) * chunk_stride + 128 * h, pa[ks][e]);
      }
  }

  // The epilogue: row sums over the quad, then both warpgroups' shares through red [2][64] (a CTA
  // barrier), then this warpgroup's kHalfDims dims of o and (warpgroup 0) the LSE.
  template <int kHalfDims>
  __device__ __forceinline__ void store(const AttendParams& p, const float (&o)[128], float (*red)[64], int wg,
                                        int row0, int c, int m_base, int rows_total, int64_t part,
                                        int64_t tok_base) const {
    float d[2] = {d_run[0], d_run[1]};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
      d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
    }
    if (c == 0) red[wg][row0] = d[0], red[wg][row0 + 8] = d[1];
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = row0 + 8 * h, m = m_base + n;
      if (m >= rows_total) continue;
      // Natural-log state for the shared rules: lse = ln 2 * (m + log2 d); empty rows o = 0, lse = -inf.
      SoftmaxState f;
      f.d = red[0][n] + red[1][n];
      f.m = f.empty() ? -INFINITY : m_run[h] * 0.6931471805599453f;
      const float scale = f.inv_sum() * p.v_scale;
      const wgmma_attend::OutRow out(p, part, tok_base, m);
#pragma unroll
      for (int jj = 0; jj < kHalfDims / 8; ++jj)
        out.store_pair(p, kHalfDims * wg + 8 * jj + 2 * c, o[4 * jj + 2 * h] * scale, o[4 * jj + 2 * h + 1] * scale);
      if (wg == 0 && c == 0) p.lse[out.lse_index] = f.lse();
    }
  }
};

// Scores of the tile's masked keys (not real: mask bit clear) to -inf by a select (a NaN goes too),
// and past a row's causal limit where the tile's last key is past the CTA's first row's limit
// (positions grow with the local index). position(j): a local key's global position.
template <class Position>
__device__ __forceinline__ void mask_scores(float (&s)[32], uint64_t mask, int c, int64_t key0, int32_t min_limit,
                                            const int32_t (&row_limit)[2], Position&& position) {
#pragma unroll
  for (int i = 0; i < 32; ++i)
    if (!((mask >> acc_key(i, c)) & 1)) s[i] = -INFINITY;
  if (position(key0 + kTileKeys - 1) > min_limit) {
#pragma unroll
    for (int i = 0; i < 32; ++i)
      if (position(key0 + acc_key(i, c)) > row_limit[acc_h(i)]) s[i] = -INFINITY;
  }
}

}  // namespace mla::cuda::rows_m
