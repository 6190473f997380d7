// attend for many query rows a key, pipelined across single key tiles (issue 5, s17b): the
// many-rows kernel of attend_rows.cu (its CTA shape, operands and layouts: 64, 48 or 32 query rows,
// two consumer warpgroups, q.k by rows and p.v by dims) with one key tile a stage instead of a
// pair, so that the tensor cores run tile t + 1's q.k while the warps run tile t's softmax.
//
// The pair kernel's phases run one after another (s16c: at D ~128 µs of MMAs and ~152 µs of
// everything else, adding up to its 280; both warpgroups in the same phase), and its warps cannot
// go faster alone: two warps a scheduler, each instruction costs about twice its issue slot (s17a).
// What is left is to overlap (FA3's intra-warpgroup pipelining): an iteration of tile t
//   1. issues q.k(t + 1)'s first two f32 groups (tile t + 1 landed: stage (T + 1) % 4);
//   2. sums them (their wait also drains p.v(t - 1)), issues the next two and rescales o when tile
//      t's scores moved a row's maximum (known from the previous iteration's barrier);
//   3. runs tile t's softmax in chunks, between which it sums q.k(t + 1)'s groups and issues the
//      next ones (the tensor pipe is busy with them meanwhile);
//   4. masks tile t + 1's scores and checks whether they move a maximum; one CTA barrier publishes
//      P^T(t) and the check (__syncthreads_or), and says every warp's p.v(t - 1) is done, so
//      stage (T - 1) % 4 takes tile T + 3 now;
//   5. p.v(t) from stage T % 4 and P^T(t) (double-buffered: P^T(t + 1) is written while the
//      other warpgroup may still read P^T(t)); its last MMAs drain under step 2 of the next.
// Four stages of 40 KB: tile T in p.v, T + 1 in q.k, T + 2 and T + 3 in flight. Tiles come by TMA
// only (pages of a power of two rows; gathered pages take the pair kernel), issued by the
// warpgroup of the tile's parity, its warps sharing the boxes as in the pair kernel. The CTA's
// tile stream runs across its segments (the flat plan): tiles of the next segment go out while
// the current one ends, up to what is known of it (sm.next_segment).
#include <cuda_fp16.h>

#include <climits>
#include <cstdlib>

#include "cuda/attend_keys.cuh"
#include "cuda/attend_rows_common.cuh"
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/flat_plan.hpp"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/tma.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma.cuh"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;
using namespace rows;

constexpr int kStages = 4;

template <int kRowsN>
struct PipeSmem {
  alignas(1024) uint8_t kv[kStages][kTmaTileBytes];      // swizzled slabs, tile T at stage T % 4
  alignas(128) uint8_t q[kRowsN * kRow];                 // e4m3 query rows, b_offset_n<kRowsN>
  alignas(128) uint16_t p[2][kRowsN * kTileKeys];        // f16 P^T of tiles t (t & 1)
  float red[kGroups * 4][kRowsN];                        // per-warp row maxima, then row sums
  int32_t limit[kRowsN];                                 // a row's last visible position (causal)
  float alpha[kRowsN];                                   // a row's rescale factor (lazy rescale)
  float final_m[kRowsN], final_d[kRowsN];                // a row's softmax state at the end
  alignas(8) uint64_t full[kStages];                     // a tile landed (an arrival an issuing warp)
  uint64_t key_mask[kStages][4];                         // its real keys, by the warp that issued them
  int32_t flat_start[kMaxFlatBatch + 1];
  KeyStream segment, next_segment;
};
template <int kRowsN>
constexpr int pipe_smem_bytes() { return int(sizeof(PipeSmem<kRowsN>)) + 1024; }
static_assert(pipe_smem_bytes<64>() <= 227 * 1024, "over the H200's shared memory a block");

// kChains (A/B): q.k(t + 1) as three f32 chains of 6 k32 steps issued at once and summed after
// tile t's softmax (no waits in between; a longer chain is less accurate: s15's probe), instead of
// 2-step groups summed between chunks of it.
template <int kRowsN, bool kChains = false>
__global__ void __launch_bounds__(kRowThreads, 1)
    attend_rows_pipe_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ CUtensorMap cache_map) {
  using Shape = RowShape<kRowsN>;
  constexpr int kWgRows = Shape::kWgRows, kQkAcc = Shape::kQkAcc, kPvAcc = Shape::kPvAcc, kSlots = Shape::kSlots;
  constexpr int kRowChunkStride = Shape::kRowChunkStride;
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<PipeSmem<kRowsN>*>(smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, cwarp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const CtaWork cta(p, kRowsN, tid);
  const int rows_total = cta.rows_total, m_base = cta.m_base;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::mbarrier_init(ptx::smem_addr(&sm.full[s]), TmaTiles::slots(p));
      for (int k = 0; k < 4; ++k) sm.key_mask[s][k] = 0;  // slots past TmaTiles::slots(p) stay 0
    }
    tma::fence_barrier_init();  // published by the first segment's CTA barrier
  }
  // The CTA's tile stream: position X (over all its segments) at stage X % 4, mbarrier phase X / 4,
  // issued by warpgroup X & 1. done: positions consumed by earlier segments; issued: positions
  // issued so far (the same in every thread).
  int done = 0, issued = 0;
  const TmaTiles tiles(p, &cache_map, lane, warp);
  const bool issuer = tiles.issues();
  int32_t page = -1;  // an issuing lane's page id for position page_at (loaded a tile of its own ahead)
  int page_at = -1;

  auto serve = [&](const KeyStream& keys, int b, int64_t part, int64_t tok_base, bool has_next, bool) {
    const KeyStream& next = sm.next_segment;
    const int n_tiles = keys.n_tiles();
    // Position X as a tile of this segment or the next (false: past what is known).
    auto resolve = [&](int X, const KeyStream*& ks, int& tile) {
      tile = X - done;
      ks = &keys;
      if (tile < n_tiles) return true;
      tile -= n_tiles;
      ks = &next;
      return has_next && tile < next.n_tiles();
    };
    // Position `issued` out, if known (every thread advances `issued`; the issuing warps of its
    // warpgroup issue, with the page id loaded ahead, then load the one of their next position).
    auto issue_next = [&] {
      const KeyStream* ks;
      int tile;
      if (!resolve(issued, ks, tile)) return;
      const int X = issued++;
      if (!issuer || (X & 1) != wg) return;
      if (page_at != X) page = tiles.page_of(*ks, tile);  // (not loaded ahead: a short segment)
      tiles.issue(*ks, tile, page, ptx::smem_addr(&sm.kv[X % kStages][0]), ptx::smem_addr(&sm.full[X % kStages]),
                  &sm.key_mask[X % kStages][warp]);
      page_at = -1;
      if (resolve(X + 2, ks, tile)) page = tiles.page_of(*ks, tile), page_at = X + 2;
    };
    // The query's loads first, then the first tiles: the round trips overlap.
    int tid_q = tid;
    asm volatile("" : "+r"(tid_q));
    QueryTile<kRowsN, kRowThreads> query;
    query.load(p, b, m_base, rows_total, tid_q);
    while (issued < done + 3 && issued < done + n_tiles) issue_next();
    query.store(sm.q, tid_q);
    if (tid < kRowsN) sm.limit[tid] = keys.limit(p, m_base + tid, rows_total);  // (published below)
    wgmma::fence_proxy_async();
    __syncthreads();

    const int32_t min_limit = keys.limit(p, m_base, rows_total);
    float m_run[kSlots], d_run[kSlots];
#pragma unroll
    for (int r = 0; r < kSlots; ++r) m_run[r] = -INFINITY, d_run[r] = 0.0f;
    const float scale_log2 = p.score_scale * 1.4426950408889634f, inv_scale_log2 = 1.0f / scale_log2;
    float o[kGroupDimBlocks][kPvAcc];
#pragma unroll
    for (int blk = 0; blk < kGroupDimBlocks; ++blk)
#pragma unroll
      for (int i = 0; i < kPvAcc; ++i) o[blk][i] = 0.0f;
    const uint64_t q_desc = wgmma::descriptor(ptx::smem_addr(sm.q) + kWgRows * wg / 8 * 128, kRowChunkStride, 128);

    // q.k of one tile for this warpgroup's rows, S^T [64 keys x kWgRows rows], in f32-summed groups
    // of kQkGroup k32 steps, two groups in flight (acc[grp & 1]; a group's first MMA overwrites).
    float acc[2][kQkAcc];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < kQkAcc; ++i) acc[u][i] = 0.0f;
    auto issue_group = [&](uint64_t kd, int grp) {
      wgmma::fence();
      uint64_t a = wgmma::advance(kd, key_step_offset<Tiles::kBoxes>(grp * kQkGroup));
      uint64_t bq = wgmma::advance(q_desc, grp * kQkGroup * 2 * kRowChunkStride);
#pragma unroll
      for (int v = 0; v < kQkGroup; ++v) {
        const int step = grp * kQkGroup + v;
        wgmma::mma_qk_e4m3<kWgRows>(acc[grp & 1], a, bq, v > 0);
        a = wgmma::advance(a, key_step_offset<Tiles::kBoxes>(step + 1) - key_step_offset<Tiles::kBoxes>(step));
        bq = wgmma::advance(bq, 2 * kRowChunkStride);
      }
      wgmma::commit();
      wgmma::fence_operand(acc[grp & 1]);
    };
    // Groups 0 and 1 out, both summed into x (wait<0>: everything before them is drained too; a
    // later drain of p.v's o makes ptxas serialize the wgmmas, C7514), groups 2 and 3 out.
    auto first_groups = [&](float (&x)[kQkAcc], uint64_t kd) {
      issue_group(kd, 0);
      issue_group(kd, 1);
      wgmma::wait<0>();
      wgmma::fence_operand(acc[0]);
      wgmma::fence_operand(acc[1]);
#pragma unroll
      for (int i = 0; i < kQkAcc; ++i) x[i] = acc[0][i] + acc[1][i];
      issue_group(kd, 2);
      issue_group(kd, 3);
    };
    // Group grp >= 2's sum into x (wait: grp + 1 may still run unless it is the last), then group
    // grp + 2 out.
    auto sum_group = [&](float (&x)[kQkAcc], uint64_t kd, int grp) {
      if (grp + 1 < kQkGroups) wgmma::wait<1>();
      else wgmma::wait<0>();
      wgmma::fence_operand(acc[grp & 1]);
#pragma unroll
      for (int i = 0; i < kQkAcc; ++i) x[i] += acc[grp & 1][i];
      if (grp + 2 < kQkGroups) issue_group(kd, grp + 2);
    };
    // Tile t's scores masked by a select (a NaN of a masked key goes too; the thread's keys 16 warp
    // + g (+ 8), rows kWgRows wg + acc_col(i, c)); whether one passes its row's maximum by more
    // than 2^kLazyRescale (the scale stays out of the scores: a row grows where x > (m + 8) / scale).
    auto position = [&](int64_t jj) {
      return keys.plain_positions ? jj : dcp_global_position(jj, p.dcp_size, p.dcp_rank, p.dcp_interleave);
    };
    auto mask_scores = [&](float (&x)[kQkAcc], uint64_t key_mask, int t) {
      const int64_t key0 = keys.k_begin + int64_t(t) * kTileKeys + 16 * warp + g;
#pragma unroll
      for (int i = 0; i < kQkAcc; ++i)
        if (!((key_mask >> (16 * warp + g + 8 * acc_half(i))) & 1)) x[i] = -INFINITY;
      if (position(key0 - g + 15) > min_limit) {  // the causal edge: some row does not see some key
        const int32_t pos0 = int32_t(position(key0)), pos1 = int32_t(position(key0 + 8));
#pragma unroll
        for (int i = 0; i < kQkAcc; ++i)
          if ((acc_half(i) ? pos1 : pos0) > sm.limit[kWgRows * wg + acc_col(i, c)]) x[i] = -INFINITY;
      }
      bool grows = false;
#pragma unroll
      for (int i = 0; i < kQkAcc; ++i) grows |= x[i] > (m_run[row_slot(i)] + kLazyRescale) * inv_scale_log2;
      return grows;
    };
    // kChains: three chains of 6 k32 steps into ch[3], one commit each.
    constexpr int kChainSteps = kQkSteps / 3;
    float ch[kChains ? 3 : 1][kQkAcc];
    auto issue_chains = [&](uint64_t kd) {
      wgmma::fence();
#pragma unroll
      for (int k = 0; k < (kChains ? 3 : 0); ++k) {
        uint64_t a = wgmma::advance(kd, key_step_offset<Tiles::kBoxes>(k * kChainSteps));
        uint64_t bq = wgmma::advance(q_desc, k * kChainSteps * 2 * kRowChunkStride);
#pragma unroll
        for (int v = 0; v < kChainSteps; ++v) {
          const int step = k * kChainSteps + v;
          wgmma::mma_qk_e4m3<kWgRows>(ch[k], a, bq, v > 0);
          a = wgmma::advance(a, key_step_offset<Tiles::kBoxes>(step + 1) - key_step_offset<Tiles::kBoxes>(step));
          bq = wgmma::advance(bq, 2 * kRowChunkStride);
        }
        wgmma::commit();
        wgmma::fence_operand(ch[k]);
      }
    };
    auto sum_chains = [&](float (&x)[kQkAcc]) {
      wgmma::wait<0>();
#pragma unroll
      for (int k = 0; k < (kChains ? 3 : 0); ++k) wgmma::fence_operand(ch[k]);
      if constexpr (kChains)
#pragma unroll
        for (int i = 0; i < kQkAcc; ++i) x[i] = (ch[0][i] + ch[1][i]) + ch[2][i];
    };
    auto tile_key_mask = [&](int X) {
      const uint64_t* k = sm.key_mask[X % kStages];
      return (k[0] | k[1]) | (k[2] | k[3]);
    };

    float x[kQkAcc];  // tile t's raw scores (q.k in the quantized units; the scale is folded in below)
    uint64_t key_mask = 0;
    bool any_grows = false;
    if (n_tiles > 0) {  // tile 0's q.k alone
      tma::wait_parity_forever(ptx::smem_addr(&sm.full[done % kStages]), (done / kStages) & 1);
      key_mask = tile_key_mask(done);
      const uint64_t kd = wgmma::descriptor_sw128(ptx::smem_addr(&sm.kv[done % kStages][0]));
      if constexpr (kChains) {
        issue_chains(kd);
        sum_chains(x);
      } else {
        first_groups(x, kd);
#pragma unroll
        for (int grp = 2; grp < kQkGroups; ++grp) sum_group(x, kd, grp);
      }
      any_grows = __syncthreads_or(mask_scores(x, key_mask, 0));
    }
    for (int t = 0; t < n_tiles; ++t) {
      const int T = done + t;
      const bool more = t + 1 < n_tiles;
      // 1. q.k of tile t + 1 (the last tile scores itself again, for nothing: no branch around a
      // wgmma, which would make ptxas fence the accumulators).
      uint64_t next_mask = 0;
      if (more) {
        tma::wait_parity_forever(ptx::smem_addr(&sm.full[(T + 1) % kStages]), ((T + 1) / kStages) & 1);
        next_mask = tile_key_mask(T + 1);
      }
      const uint64_t kd = wgmma::descriptor_sw128(ptx::smem_addr(&sm.kv[(more ? T + 1 : T) % kStages][0]));
      float xn[kQkAcc];
      // 2. Groups 0 and 1 (their wait drains p.v(t - 1): o is complete), then the lazy rescale.
      if constexpr (kChains) issue_chains(kd);
      else first_groups(xn, kd);
#pragma unroll
      for (int blk = 0; blk < kGroupDimBlocks; ++blk) wgmma::fence_operand(o[blk]);
      if (any_grows) {
        if constexpr (kChains) {  // p.v(t - 1) drained (with the chains: rare)
          wgmma::wait<0>();
#pragma unroll
          for (int blk = 0; blk < kGroupDimBlocks; ++blk) wgmma::fence_operand(o[blk]);
        }
        // This warpgroup's rows: maxima over its 4 warps' keys; every row's alpha goes through
        // shared memory, since o holds all the CTA's rows.
        float mx[kSlots];
#pragma unroll
        for (int r = 0; r < kSlots; ++r) mx[r] = -INFINITY;
#pragma unroll
        for (int i = 0; i < kQkAcc; ++i) mx[row_slot(i)] = fmaxf(mx[row_slot(i)], x[i]);
#pragma unroll
        for (int r = 0; r < kSlots; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 4));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 8));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 16));
          if (g == 0) sm.red[cwarp][slot_col(r, c)] = mx[r];
        }
        __syncthreads();  // every warp's row maxima
#pragma unroll
        for (int r = 0; r < kSlots; ++r) {
          const int n = slot_col(r, c);
          float m_raw = sm.red[4 * wg][n];
#pragma unroll
          for (int w = 1; w < 4; ++w) m_raw = fmaxf(m_raw, sm.red[4 * wg + w][n]);
          const float m_new = fmaxf(m_run[r], m_raw * scale_log2);  // -inf stays -inf
          const float alpha = exp2_ftz(m_run[r] - (m_new == -INFINITY ? 0.0f : m_new));
          m_run[r] = m_new;
          d_run[r] *= alpha;
          if (warp == 0 && g == 0) sm.alpha[kWgRows * wg + n] = alpha;
        }
        __syncthreads();  // every row's alpha
#pragma unroll
        for (int blk = 0; blk < kGroupDimBlocks; ++blk) {
#pragma unroll
          for (int i = 0; i < kPvAcc; ++i) o[blk][i] *= sm.alpha[acc_col(i, c)];
          wgmma::fence_operand(o[blk]);
        }
      }
      // 3. Tile t's softmax into P^T(t), a chunk of scores before each of q.k(t + 1)'s groups 2..8.
      // Element i sits at b_offset_n<kRowsN>(kWgRows wg + acc_col(i, c), key / 8) + 2 (key % 8), key =
      // 16 warp + g + 8 h: the thread's base plus a constant (h: the chunk stride, n8 block: 128, i & 1: 16).
      const uint32_t p_thread = ptx::smem_addr(sm.p[t & 1]) + (2 * warp) * kRowChunkStride + (kWgRows / 8 * wg) * 128 +
                                (2 * c) * 16 + 2 * g;
#pragma unroll
      for (int grp = 2; grp < kQkGroups; ++grp) {
#pragma unroll
        for (int i = (grp - 2) * kQkAcc / (kQkGroups - 2); i < (grp - 1) * kQkAcc / (kQkGroups - 2); ++i) {
          const float m = m_run[row_slot(i)];
          const float w = exp2_ftz(fmaf(x[i], scale_log2, -(m == -INFINITY ? 0.0f : m)));
          d_run[row_slot(i)] += w;
          ptx::st_shared_b16(p_thread + acc_half(i) * kRowChunkStride + (i >> 2) * 128 + (i & 1) * 16,
                             __half_as_ushort(__float2half_rn(w)));
        }
        if constexpr (!kChains) sum_group(xn, kd, grp);
      }
      if constexpr (kChains) sum_chains(xn);
      // 4. Tile t + 1's mask and growth check; the barrier publishes P^T(t) and the check, and says
      // every warp drained p.v(t - 1): its stage takes the next tile.
      const bool grows = more && mask_scores(xn, next_mask, t + 1);
      wgmma::fence_proxy_async();  // P (st.shared) before the tensor cores read it
      any_grows = __syncthreads_or(grows);
      issue_next();
      // 5. p.v(t) for this warpgroup's dims: V^T fragments from the fp8 tile (ldmatrix.trans,
      // zeroed where masked, widened), P^T(t) from shared memory, fragments double-buffered (an
      // in-flight wgmma reads its A registers); the last step drains under the next iteration.
      {
        const uint64_t p_desc = wgmma::descriptor(ptx::smem_addr(sm.p[t & 1]), kRowChunkStride, 128);
        const uint32_t kv = ptx::smem_addr(&sm.kv[T % kStages][0]);
        uint32_t vraw[kGroupDimBlocks / 2][4], frag[2][kGroupDimBlocks][4];
#pragma unroll
        for (int jj = 0; jj < kGroupDimBlocks / 2; ++jj)
          v_load<Tiles::kBoxes>(kv, 0, kGroupDimBlocks / 2 * wg + jj, warp, lane, vraw[jj]);
#pragma unroll
        for (int ks = 0; ks < kPvSteps; ++ks) {
#pragma unroll
          for (int jj = 0; jj < kGroupDimBlocks / 2; ++jj) {
            if (key_mask != ~0ull) v_mask(vraw[jj], key_mask, ks, c);  // 0 x NaN is NaN
            v_convert(vraw[jj], frag[ks & 1][2 * jj], frag[ks & 1][2 * jj + 1]);
            if (ks + 1 < kPvSteps) v_load<Tiles::kBoxes>(kv, ks + 1, kGroupDimBlocks / 2 * wg + jj, warp, lane, vraw[jj]);
          }
          wgmma::fence();
          const uint64_t bp = wgmma::advance(p_desc, ks * 2 * kRowChunkStride);
#pragma unroll
          for (int blk = 0; blk < kGroupDimBlocks; ++blk) wgmma::mma_pv_f16_rs<kRowsN>(o[blk], frag[ks & 1][blk], bp);
          wgmma::commit();
          if (ks > 0) wgmma::wait<1>();
        }
      }
#pragma unroll
      for (int i = 0; i < kQkAcc; ++i) x[i] = xn[i];
      key_mask = next_mask;
    }
    wgmma::wait<0>();
#pragma unroll
    for (int blk = 0; blk < kGroupDimBlocks; ++blk) wgmma::fence_operand(o[blk]);
    finish_rows<kRowsN>(p, sm.red, sm.final_m, sm.final_d, d_run, m_run, o, part, tok_base, m_base, rows_total, tid);
    done += n_tiles;
  };  // serve

  serve_segments<kRowThreads, kRowsN, true>(p, cta, p.flat_ctas > 0, kTileKeys, tid, sm.flat_start,
                                          sm.next_segment, &sm.segment, serve);
}

int pipe_mode() {  // A/B: MLA_ATTEND_ROWS_PIPE=3: kChains
  static const int mode = [] {
    const char* env = std::getenv("MLA_ATTEND_ROWS_PIPE");
    return env ? std::atoi(env) : 0;
  }();
  return mode;
}
template <int kRowsN>
void launch_pipe_height(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream) {
  if (pipe_mode() == 3)
    attend_rows_pipe_kernel<kRowsN, true><<<attend_launch_grid(p, kRowsN), kRowThreads, pipe_smem_bytes<kRowsN>(), stream>>>(p, map);
  else
    attend_rows_pipe_kernel<kRowsN><<<attend_launch_grid(p, kRowsN), kRowThreads, pipe_smem_bytes<kRowsN>(), stream>>>(p, map);
}

template <int kRowsN>
void prepare_pipe_height() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(attend_rows_pipe_kernel<kRowsN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      pipe_smem_bytes<kRowsN>()));
  MLA_CUDA_CHECK(cudaFuncSetAttribute(attend_rows_pipe_kernel<kRowsN, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      pipe_smem_bytes<kRowsN>()));
}
}  // namespace

void prepare_attend_rows_pipe_kernel() {
  prepare_pipe_height<64>();
  prepare_pipe_height<48>();
  prepare_pipe_height<32>();
}

void launch_attend_rows_pipe(const AttendParams& p, const CUtensorMap& map, int cta_rows, cudaStream_t stream) {
  switch (cta_rows) {
    case 32: launch_pipe_height<32>(p, map, stream); break;
    case 48: launch_pipe_height<48>(p, map, stream); break;
    default: launch_pipe_height<64>(p, map, stream);
  }
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
