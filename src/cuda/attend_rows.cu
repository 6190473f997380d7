// attend for many query rows a key (issue 5, v15): 128 heads, qlen 4-8, DCP-gathered heads.
//
// The 16-row wgmma kernel (attend_wgmma.cu) reads each key tile from L2 and widens its V once for
// every 16 query rows: at 128 heads a tile is read 8 times and widened 8 times, and its small MMAs
// (N = 16) leave the tensor cores idle (D: 13% of copy, 267 TFLOP/s). Here a CTA takes 64 query
// rows with two warpgroups at one CTA an SM and streams key tiles in pairs (keys on wgmma's M side
// as in the 16-row kernel, query rows on N). Warpgroup w owns query rows 32 w .. 32 w + 31 from
// end to end, so the two share nothing but the key tiles and run out of step: one's softmax and
// waits go under the other's MMAs (v13's warpgroups split p.v by latent dims and went in lock
// step: two CTA barriers and nine q.k waits a pair with nothing overlapped):
//   q.k:  S^T [64 keys x 32 rows] = K . Q^T for both tiles (QGMMA m64n32k32 e4m3, in 2-step f32
//         groups as the 16-row kernel: the fp8 MMA's accumulator is short; a group's MMAs of both
//         tiles under one wait)
//   softmax: 8 rows a thread, the same rows as its o columns; the maxima move lazily (only when a
//         score passes one by more than 2^8), across the warpgroup's 4 warps through shared memory
//         and its own named barrier; P^T of both tiles in shared memory as f16
//   p.v:  O^T [512 x 32] += V^T . P^T over both tiles: 8 k16 steps x 8 dim blocks (HGMMA
//         m64n32k16, V^T fragments from the fp8 tile by ldmatrix.trans and widening in registers,
//         half a step's blocks under one commit while the other half's are widened)
// so a tile is read from L2 once for 64 rows and widened twice (once a warpgroup).
// Tiles come by TMA only (pages of 8+ rows, a power of two), two stages of a pair: the warpgroup
// that finishes pair j last (a shared counter) has its warp 0 issue the pair two places on into
// the freed stage; page ids are loaded a pair ahead by both warpgroups' warp 0. The step's
// partials only, as the 16-row kernel (its accuracy: attend_wgmma.cu); the flat plan and fixed
// splits alike. Shared memory: 2 stages x 2 tiles x 40 KB + the 36 KB query + 16 KB P^T.
// Measured versions (H200): docs/attention.md, v13-v15.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "core/softmax_state.hpp"
#include "cuda/attend_keys.cuh"
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

constexpr int kRowsN = kAttendRowsPerCta;       // query rows a CTA (64)
constexpr int kGroups = 2;                      // warpgroups, each its 32 rows: wgmma N = 32
constexpr int kRowThreads = 128 * kGroups;
constexpr int kSlots = kRowsN / kGroups / 4;    // a thread's query rows (softmax state, o columns): 8
constexpr int kHalfBlocks = kDimBlocks / 2;     // p.v: dim blocks a commit (4 of 64 dims)
constexpr int kRowChunkStride = kRowsN / 8 * 128;      // B operands' leading byte offset (1024)
constexpr int kQkGroup = 2;                     // k32 steps an f32-summed q.k accumulator takes
constexpr int kQkGroups = kQkSteps / kQkGroup;  // 9

struct RowsSmem {
  alignas(1024) uint8_t kv[2][2][kTmaTileBytes];        // [stage][tile of the pair], swizzled slabs
  alignas(128) uint8_t q[kRowsN * kRow];                // e4m3 query rows, b_offset_n<64>
  alignas(128) uint16_t p[2][kRowsN * kTileKeys];       // f16 P^T of each tile of the pair, b_offset_n<64>
  float red[kGroups * 4][kRowsN / kGroups];             // per-warp row maxima, then row sums
  int32_t limit[kRowsN];                                // a row's last visible position (causal)
  alignas(8) uint64_t full[2][2];                       // a tile landed (mbarrier)
  uint64_t key_mask[2][2];                              // its real keys
  int32_t released[2];                                  // warpgroups done with a stage's pair
  int32_t flat_start[kMaxFlatBatch + 1];
  KeyStream segment, next_segment;
};
constexpr int rows_smem_bytes() { return int(sizeof(RowsSmem)) + 1024; }

__global__ void __launch_bounds__(kRowThreads, 1)
    attend_rows_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ CUtensorMap cache_map) {
  // Aligned to 1024 bytes (the 128-byte swizzle) by an offset from smem_raw, so the compiler still
  // sees shared memory (a pointer through uintptr_t makes every access generic: 64-bit addresses).
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<RowsSmem*>(smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, cwarp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int wg_bar = 1 + wg;  // this warpgroup's named barrier
  const CtaWork cta(p, kRowsN, tid);
  const int rows_total = cta.rows_total, m_base = cta.m_base, wg_row = m_base + 32 * wg;
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      for (int u = 0; u < 2; ++u) tma::mbarrier_init(ptx::smem_addr(&sm.full[s][u]), 1);
      sm.released[s] = 0;
    }
    tma::fence_barrier_init();  // published by the first segment's CTA barrier
  }
  int done = 0;  // pairs consumed by earlier segments (stage and parity run on)
  const TmaTiles tiles(p, &cache_map, lane);

  // keys: the segment, in shared memory (read where needed: registers are short).
  auto serve = [&](const KeyStream& keys, int b, int64_t part, int64_t tok_base, bool has_next, bool prefetched) {
    const KeyStream& next = sm.next_segment;
    const int n_tiles = keys.n_tiles(), n_pairs = (n_tiles + 1) / 2;
    const bool next_has_tiles = has_next && next.n_tiles() > 0;
    // Pair k of the stream from this segment's first on: this segment's pair k, or for k = n_pairs
    // the next segment's first (prefetched across the boundary), or nothing.
    auto stream_pages = [&](int k, int32_t (&page)[2]) {
      const bool own = k < n_pairs, nxt = k == n_pairs && next_has_tiles;
      for (int u = 0; u < 2; ++u) page[u] = own ? tiles.page_of(keys, 2 * k + u) : nxt ? tiles.page_of(next, u) : -1;
    };
    // The pair's boxes (tiles 2 k, 2 k + 1) into stage (done + k) & 1, by a whole warp. A tile past
    // its segment issues no box but still arrives on its mbarrier (0 bytes), so every mbarrier
    // completes one phase a pair and the parity is (at / 2) & 1 for both tiles.
    auto stream_issue = [&](int k, const int32_t (&page)[2]) {
      const bool own = k < n_pairs, nxt = k == n_pairs && next_has_tiles;
      if (!own && !nxt) return;
      const int stage = (done + k) & 1;
      for (int u = 0; u < 2; ++u)
        tiles.issue(own ? keys : next, own ? 2 * k + u : u, page[u], ptx::smem_addr(&sm.kv[stage][u][0]),
                    ptx::smem_addr(&sm.full[stage][u]), &sm.key_mask[stage][u]);
    };
    // The query's loads first, then warp 0's page ids and first boxes: the round trips overlap.
    // (tid made opaque: the loads' offsets would be hoisted out of the segment loop and held)
    int tid_q = tid;
    asm volatile("" : "+r"(tid_q));
    QueryTile<kRowsN, kRowThreads> query;
    query.load(p, b, m_base, rows_total, tid_q);
    // Every stage is free here (the previous segment's pairs are consumed); pair 0 may be in
    // flight already (prefetched: issued into its stage during the previous segment's last pairs).
    if (cwarp == 0) {
      __syncwarp();
      int32_t page[2];
      for (int k = prefetched && n_pairs > 0 ? 1 : 0; k < 2; ++k) {
        stream_pages(k, page);
        stream_issue(k, page);
      }
    }
    int32_t ahead[2] = {-1, -1};  // warp 0 of each warpgroup: the page ids of pair j + 2
    if (warp == 0) stream_pages(2, ahead);
    query.store(sm.q, tid_q);
    if (tid < kRowsN) sm.limit[tid] = keys.limit(p, m_base + tid, rows_total);  // (published below)
    wgmma::fence_proxy_async();
    __syncthreads();

    // Causal limits: every row of the warpgroup sees keys up to min_limit (its first row's); a tile
    // past it takes the per-row rule (rows past the request's see nothing), from shared memory.
    const int32_t min_limit = keys.limit(p, wg_row, rows_total);
    float m_run[kSlots], d_run[kSlots];
#pragma unroll
    for (int r = 0; r < kSlots; ++r) m_run[r] = -INFINITY, d_run[r] = 0.0f;
    const float scale_log2 = p.score_scale * 1.4426950408889634f;
    float o[kDimBlocks][16];
#pragma unroll
    for (int blk = 0; blk < kDimBlocks; ++blk)
#pragma unroll
      for (int i = 0; i < 16; ++i) o[blk][i] = 0.0f;
    // q.k's and p.v's B operands: this warpgroup's 32 rows (four 8-row core-matrix groups, 128 bytes apart).
    const uint64_t q_desc = wgmma::descriptor(ptx::smem_addr(sm.q) + 4 * wg * 128, kRowChunkStride, 128);
    const uint64_t p_desc = wgmma::descriptor(ptx::smem_addr(sm.p[0]) + 4 * wg * 128, kRowChunkStride, 128);

    for (int j = 0; j < n_pairs; ++j) {
      const int at = done + j, stage = at & 1;
      const uint32_t parity = (at >> 1) & 1;
      // q.k of both tiles for this warpgroup's rows: S^T [64 keys x 32 rows]. A group's MMAs of
      // both tiles go out together (one wait a group, not one a tile and group).
      const bool both = 2 * j + 1 < n_tiles;
      float x[2][16];
      uint64_t key_mask[2];
      uint64_t kd[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        key_mask[u] = 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) x[u][i] = 0.0f;
        kd[u] = wgmma::descriptor_sw128(ptx::smem_addr(&sm.kv[stage][u][0]));
        if (u == 1 && !both) continue;
        tma::wait_parity_forever(ptx::smem_addr(&sm.full[stage][u]), parity);
        key_mask[u] = sm.key_mask[stage][u];
      }
      // The descriptors advance step by step through opaque registers: unrolled, ptxas would
      // otherwise materialize all of a pair's at once and spill.
      uint64_t qd = q_desc;
      float acc[2][16];
#pragma unroll
      for (int grp = 0; grp < kQkGroups; ++grp) {  // kQkGroup k32 steps an accumulator, summed in f32
#pragma unroll
        for (int u = 0; u < 2; ++u) {
#pragma unroll
          for (int i = 0; i < 16; ++i) acc[u][i] = 0.0f;
          wgmma::fence_operand(acc[u]);
        }
        wgmma::fence();
#pragma unroll
        for (int v = 0; v < kQkGroup; ++v) {
          const int step = grp * kQkGroup + v;
          // (a missing second tile is scored too, from whatever its buffer holds, and masked below:
          // a branch around a wgmma makes ptxas fence the accumulators)
#pragma unroll
          for (int u = 0; u < 2; ++u) wgmma::mma_m64n32k32_e4m3(acc[u], kd[u], qd, v > 0);
#pragma unroll
          for (int u = 0; u < 2; ++u)
            kd[u] = wgmma::advance(kd[u], key_step_offset<true>(step + 1) - key_step_offset<true>(step));
          qd = wgmma::advance(qd, 2 * kRowChunkStride);
          asm volatile("" : "+l"(kd[0]), "+l"(kd[1]), "+l"(qd));
        }
        wgmma::commit();
        wgmma::wait<0>();
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          wgmma::fence_operand(acc[u]);
#pragma unroll
          for (int i = 0; i < 16; ++i) x[u][i] += acc[u][i];
        }
      }
      // Scores in log2 units, masked by a select (a NaN of a masked key goes too). The thread's two
      // keys of tile u: 16 warp + g (+ 8); its rows: 32 wg + acc_col(i, c). Positions grow with the
      // local index, so the warp's last key decides whether every row sees all 16.
      auto position = [&](int64_t jj) {
        return keys.plain_positions ? jj : dcp_global_position(jj, p.dcp_size, p.dcp_rank, p.dcp_interleave);
      };
      bool grows = false;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int64_t key0 = keys.k_begin + int64_t(2 * j + u) * kTileKeys + 16 * warp + g;
#pragma unroll
        for (int i = 0; i < 16; ++i)
          if (!((key_mask[u] >> (16 * warp + g + 8 * acc_half(i))) & 1)) x[u][i] = -INFINITY;
        if (position(key0 - g + 15) > min_limit) {  // the causal edge: some row does not see some key
          const int32_t pos0 = int32_t(position(key0)), pos1 = int32_t(position(key0 + 8));
#pragma unroll
          for (int i = 0; i < 16; ++i)
            if ((acc_half(i) ? pos1 : pos0) > sm.limit[32 * wg + acc_col(i, c)]) x[u][i] = -INFINITY;
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          x[u][i] *= scale_log2;  // -inf stays -inf
          grows |= x[u][i] > m_run[row_slot(i)] + kLazyRescale;
        }
      }
      // This warpgroup's barrier also says its 4 warps are done with pair j - 1's red and P^T.
      if (ptx::bar_sync_or(wg_bar, 128, grows)) {
        // The rows' maxima over the warpgroup's keys of both tiles: the thread's, its column's 8
        // lanes, then the 4 warps through shared memory.
        float mx[kSlots];
#pragma unroll
        for (int r = 0; r < kSlots; ++r) mx[r] = -INFINITY;
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int i = 0; i < 16; ++i) mx[row_slot(i)] = fmaxf(mx[row_slot(i)], x[u][i]);
#pragma unroll
        for (int r = 0; r < kSlots; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 4));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 8));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 16));
          if (g == 0) sm.red[cwarp][slot_col(r, c)] = mx[r];
        }
        ptx::bar_sync(wg_bar, 128);  // the 4 warps' row maxima
        float alpha[kSlots];
#pragma unroll
        for (int r = 0; r < kSlots; ++r) {
          const int n = slot_col(r, c);
          float m_new = m_run[r];
#pragma unroll
          for (int w = 0; w < 4; ++w) m_new = fmaxf(m_new, sm.red[4 * wg + w][n]);
          alpha[r] = exp2f(m_run[r] - (m_new == -INFINITY ? 0.0f : m_new));
          m_run[r] = m_new;
          d_run[r] *= alpha[r];
        }
#pragma unroll
        for (int blk = 0; blk < kDimBlocks; ++blk) {
#pragma unroll
          for (int i = 0; i < 16; ++i) o[blk][i] *= alpha[row_slot(i)];
          wgmma::fence_operand(o[blk]);
        }
      }
      // P^T of both tiles for this warpgroup's rows (a missing second tile: zeros, its keys masked).
      // Element i sits at b_offset_n<64>(32 wg + acc_col(i, c), key / 8) + 2 (key % 8), key = 16 warp
      // + g + 8 h: the thread's base plus a constant (h: 1024, n8 block: 128, i & 1: 16).
      const uint32_t p_thread = ptx::smem_addr(sm.p[0]) + (2 * warp) * kRowChunkStride + (4 * wg) * 128 + (2 * c) * 16 + 2 * g;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float m = m_run[row_slot(i)];
          const float w = exp2f(x[u][i] - (m == -INFINITY ? 0.0f : m));
          d_run[row_slot(i)] += w;
          ptx::st_shared_b16(p_thread + u * int(sizeof(sm.p[0])) + acc_half(i) * kRowChunkStride + (i >> 2) * 128 + (i & 1) * 16,
                             __half_as_ushort(__float2half_rn(w)));
        }
      }
      wgmma::fence_proxy_async();  // P (st.shared) before the tensor cores read it
      ptx::bar_sync(wg_bar, 128);  // the warpgroup's P^T of both tiles

      // p.v over the pair's tiles: 8 k16 steps (step t: tile t / 4's k16 step t % 4) of V^T
      // fragments from the fp8 tile (ldmatrix.trans, zeroed where masked, widened) against P^T. A
      // step's 8 dim blocks go in two commits of 4: half h's fragments are rewritten once the
      // commit before the other half's is done (an in-flight wgmma reads its A registers).
      {
        const int steps = (both ? 2 : 1) * kPvSteps;
        auto kv_of = [&](int t) { return ptx::smem_addr(&sm.kv[stage][t / kPvSteps][0]); };
        uint32_t vraw[2][4], frag[2][kHalfBlocks][4];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) v_load<true>(kv_of(0), 0, jj, warp, lane, vraw[jj]);
#pragma unroll
        for (int t = 0; t < 2 * kPvSteps; ++t) {
          if (t < steps) {
            const int u = t / kPvSteps, ks = t % kPvSteps;
            const uint64_t bp = wgmma::advance(p_desc, u * int(sizeof(sm.p[0])) + ks * 2 * kRowChunkStride);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (t > 0) wgmma::wait<1>();  // the commit that read frag[h] (step t - 1's half h)
              const int tn = h == 0 ? t : t + 1, hn = 1 - h;  // the next half's loads
#pragma unroll
              for (int jj = 0; jj < 2; ++jj) {
                if (key_mask[u] != ~0ull) v_mask(vraw[jj], key_mask[u], ks, c);  // 0 x NaN is NaN
                v_convert(vraw[jj], frag[h][2 * jj], frag[h][2 * jj + 1]);
                if (tn < steps) v_load<true>(kv_of(tn), tn % kPvSteps, 2 * hn + jj, warp, lane, vraw[jj]);
              }
              wgmma::fence();
#pragma unroll
              for (int blk = 0; blk < kHalfBlocks; ++blk)
                wgmma::mma_m64n32k16_f16_rs(o[kHalfBlocks * h + blk], frag[h][blk], bp);
              wgmma::commit();
            }
          }
        }
        wgmma::wait<0>();
      }
      // Pair j's stage is free once both warpgroups are done with it: the later one's warp 0 issues
      // pair j + 2 there (its page ids were loaded a pair ahead), then loads pair j + 3's.
      ptx::bar_sync(wg_bar, 128);  // every warp of this warpgroup is past its p.v
      if (warp == 0) {
        int last = 0;
        if (lane == 0) {
          __threadfence_block();
          last = atomicAdd(&sm.released[stage], 1) == 1;
          if (last) sm.released[stage] = 0;
          __threadfence_block();
        }
        if (__shfl_sync(0xffffffffu, last, 0)) stream_issue(j + 2, ahead);
        stream_pages(j + 3, ahead);
      }
    }
    wgmma::wait<0>();
#pragma unroll
    for (int blk = 0; blk < kDimBlocks; ++blk) wgmma::fence_operand(o[blk]);

    // Row sums: over the 8 lanes of a column, then the warpgroup's 4 warps (red's last readers, the
    // maxima exchange, are behind the P^T barrier).
#pragma unroll
    for (int r = 0; r < kSlots; ++r) {
      float d = d_run[r];
      d += __shfl_xor_sync(0xffffffffu, d, 4);
      d += __shfl_xor_sync(0xffffffffu, d, 8);
      d += __shfl_xor_sync(0xffffffffu, d, 16);
      if (g == 0) sm.red[cwarp][slot_col(r, c)] = d;
    }
    ptx::bar_sync(wg_bar, 128);
#pragma unroll
    for (int r = 0; r < kSlots; ++r) {  // the p.v accumulator's 8 columns of this thread
      const int n = slot_col(r, c), m = wg_row + n;
      if (m >= rows_total) continue;
      // Natural-log state for the shared rules: lse = ln 2 * (m + log2 d); empty rows o = 0, lse = -inf.
      SoftmaxState f;
      f.d = (sm.red[4 * wg][n] + sm.red[4 * wg + 1][n]) + (sm.red[4 * wg + 2][n] + sm.red[4 * wg + 3][n]);
      f.m = f.empty() ? -INFINITY : m_run[r] * 0.6931471805599453f;
      const float scale = f.inv_sum() * p.v_scale;
      const OutRow out(p, part, tok_base, m);
      const int i0 = 4 * (r >> 1) + (r & 1);  // elements i0 (dim 2g) and i0 + 2 (dim 2g + 1)
#pragma unroll
      for (int blk = 0; blk < kDimBlocks; ++blk)
        out.store_pair(p, 64 * blk + 16 * warp + 2 * g, o[blk][i0] * scale, o[blk][i0 + 2] * scale);
      if (warp == 0 && g == 0) p.lse[out.lse_index] = f.lse();
    }
    done += n_pairs;
    __syncthreads();  // both warpgroups are done with the segment, the next one and red
  };  // serve

  serve_segments<kRowThreads, kRowsN, true>(p, cta, p.flat_ctas > 0, kTileKeys, tid, sm.flat_start,
                                          sm.next_segment, &sm.segment, serve);
}

int rows_min_env() {
  static const int rows = [] {
    const char* env = std::getenv("MLA_ATTEND_ROWS_MIN");
    return env ? std::max(0, std::atoi(env)) : 0;
  }();
  return rows;
}

}  // namespace

int attend_rows_min() {
  // MLA_ATTEND_ROWS_MIN=N: the many-rows kernel from N query rows a request (heads x qlen) up, for
  // any batch (forced: the tests run it on every case with N = 1; 100000 turns it off); unset or 0:
  // the default below, with the batch rule of attend_rows_wanted.
  return rows_min_env() > 0 ? rows_min_env() : kAttendRowsMinDefault;
}

bool attend_rows_wanted(int batch, int rows, int sms) {
  if (rows < attend_rows_min()) return false;
  // Unforced, only where the batch alone gives a quarter wave of 64-row CTAs: at B = 1 the kernel
  // needs many splits, each writing 64 rows x 2 KB of partials for a pair of key tiles (128
  // heads, ctx 8192: 38.1 us vs 19.5 for the 16-row kernel; H200, bd392bb).
  return rows_min_env() > 0 || int64_t(batch) * ((rows + kAttendRowsPerCta - 1) / kAttendRowsPerCta) * 4 >= sms;
}

void prepare_attend_rows_kernel() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(attend_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      rows_smem_bytes()));
}

void launch_attend_rows(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream) {
  const int m_tiles = (p.heads * p.qlen + kRowsN - 1) / kRowsN;
  const dim3 grid = p.flat_ctas > 0 ? dim3(unsigned(p.flat_ctas) * unsigned(m_tiles)) : attend_grid(p, kRowsN);
  attend_rows_kernel<<<grid, kRowThreads, rows_smem_bytes(), stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
