// attend for many query rows a key with a bf16 query and cache (issue 5: 128 heads, qlen 4-8).
//
// The fp8 many-rows kernel (attend_rows.cu) puts keys on wgmma's M side because fp8 operands must
// be K-major; bf16 ones may be MN-major, so here the query rows are M and V is read straight from
// the cache rows as TMA wrote them (FlashMLA's layout): a CTA takes 64 query rows with two
// warpgroups at one CTA an SM and streams 64-key tiles (nine 128-byte slabs a key row):
//   q.k:     warpgroup w scores its half of the tile, keys 32 w .. 32 w + 31, for all 64 rows:
//            S [64 rows x 32 keys] = Q . K^T (HGMMA m64n32k16; the query's dims 0..511 from shared
//            memory, its rope dims 512..575 from registers, which leaves room for two stages)
//   softmax: the rows' maxima of both halves meet in shared memory, so both warpgroups move every
//            row's running maximum the same way (lazily: only past 2^8) and each keeps its own
//            share of the row sums; P in registers as bf16 (the accumulator layout is the A layout)
//   p.v:     warpgroup w owns o's dims 256 w .. 256 w + 255 for all 64 rows: O += P . V over the
//            whole tile (HGMMA m64n256k16, V MN-major from the tile), its own half's P from
//            registers, the other half's from shared memory after the CTA barrier that publishes it.
// V rows of masked keys are zeroed in the tile before p.v (NaN x 0 is NaN). P rounded once to bf16
// gives o a relative error of ~2e-3: only the step's partials (bf16 out) and a caller's bf16 o take
// this kernel. Tiles come by TMA only (pages of 8+ rows, a power of two); tile j + 1's boxes go out
// at tile j's first CTA barrier, which says both warpgroups are done with tile j - 1.
// Shared memory: 2 stages x 72 KB + the 64 KB query + 8 KB P. Measured versions: docs/attention.md.
#include <cuda_bf16.h>

#include "core/softmax_state.hpp"
#include "cuda/attend_keys.cuh"
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"
#include "cuda/tma.cuh"
#include "cuda/tma.hpp"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_bf16.cuh"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

constexpr int kRowsM = kAttendRowsPerCta;              // query rows a CTA: wgmma M (64)
constexpr int kGroups = 2;                             // warpgroups
constexpr int kThreadsB = 128 * kGroups;
constexpr int kHalfKeys = kTileKeys / kGroups;         // keys a warpgroup scores (32)
constexpr int kRowSlabs = 2 * kRow / 128;              // 128-byte slabs of a bf16 key row (9)
constexpr int kTileBytesB = kRowSlabs * kSlabBytes;    // 72 KB
constexpr int kQkSmemSteps = kLatent / 16;             // q.k k16 steps from shared memory (32)
constexpr int kRopeSteps = (kRow - kLatent) / 16;      // ... and from registers (4)
constexpr int kHalfDims = kLatent / kGroups;           // o's dims a warpgroup (256)
constexpr int kChunkStrideM = kRowsM / 8 * 128;        // K-major core-matrix tiles of 64 rows: 1024
constexpr int kQChunks = kLatent * 2 / 16;             // the query's 16-byte chunks in shared memory (64)

struct Bf16RowsSmem {
  alignas(1024) uint8_t kv[2][kTileBytesB];              // [stage], swizzled slabs (tile_offset<true>)
  alignas(128) uint8_t q[kQChunks * kChunkStrideM];     // dims 0..511: wgmma::kmajor_offset(row, chunk)
  alignas(128) uint8_t p[kGroups][kHalfKeys / 8 * kChunkStrideM];  // each half's P, the same layout
  float red[kGroups][kRowsM];                            // each half's row maxima, then row sums
  int32_t limit[kRowsM];                                 // a row's last visible position (causal)
  alignas(8) uint64_t full[2];                           // a tile landed (mbarrier: an arrival a slot)
  uint64_t key_mask[2][4];                               // its real keys, by the warp that issued them
  int32_t flat_start[kMaxFlatBatch + 1];
  KeyStream segment, next_segment;
};
constexpr int bf16_rows_smem_bytes() { return int(sizeof(Bf16RowsSmem)) + 1024; }
static_assert(bf16_rows_smem_bytes() <= 227 * 1024, "over the H200's shared memory a block");

// The query rows m_base .. m_base + 63 (zero past the request's): dims 0..511 to shared memory in
// K-major core matrices, through registers (load, then store: a kernel issues the loads before it
// waits on something else), a warp 8 rows x 4 chunks an instruction so both sides are dense
// (64 contiguous bytes a row; 8 rows' 16-byte chunks on distinct banks a quarter warp).
struct QueryRowsBf16 {
  static constexpr int kPerThread = kRowsM * kQChunks / kThreadsB;  // 16
  uint4 raw[kPerThread];

  __device__ __forceinline__ static void rc(int tid, int k, int& row, int& chunk) {
    const int unit = tid / 32 + k * (kThreadsB / 32), lane = tid % 32;  // 128 units of 8 rows x 4 chunks
    row = 8 * (unit % 8) + lane % 8;
    chunk = 4 * (unit / 8) + lane / 8;
  }
  __device__ __forceinline__ void load(const AttendParams& p, int b, int m_base, int rows_total, int tid) {
    const uint16_t* q = static_cast<const uint16_t*>(p.q);
    const bool vec = (reinterpret_cast<uintptr_t>(q) | uintptr_t(2 * p.q_s_stride) | uintptr_t(2 * p.q_h_stride)) % 16 == 0;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      int row, chunk;
      rc(tid, k, row, chunk);
      raw[k] = make_uint4(0, 0, 0, 0);
      if (m_base + row >= rows_total) continue;
      const uint16_t* src = q + query_offset(p, b, m_base + row, 8 * chunk);
      if (vec) {
        raw[k] = *reinterpret_cast<const uint4*>(src);
      } else {
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = uint32_t(src[2 * e]) | uint32_t(src[2 * e + 1]) << 16;
        raw[k] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
  __device__ __forceinline__ void store(uint8_t* q_smem, int tid) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      int row, chunk;
      rc(tid, k, row, chunk);
      *reinterpret_cast<uint4*>(&q_smem[wgmma::kmajor_offset(row, chunk)]) = raw[k];
    }
  }
};

// The query's rope dims (512..575) as q.k's register A fragments: k16 step ks, this warp's rows
// 16 warp + g (a[0], a[2]) and + 8 (a[1], a[3]), dims 512 + 16 ks + 2c, +1 (a[0], a[1]) and + 8 (a[2], a[3]).
__device__ __forceinline__ void load_rope(const AttendParams& p, int b, int m_base, int rows_total, int warp, int g,
                                          int c, uint32_t (&a)[kRopeSteps][4]) {
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m_base + 16 * warp + g + 8 * h;
    const uint16_t* row = m < rows_total ? q + query_offset(p, b, m, kLatent) : nullptr;
#pragma unroll
    for (int ks = 0; ks < kRopeSteps; ++ks)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = 16 * ks + 8 * e + 2 * c;
        a[ks][h + 2 * e] = row ? uint32_t(row[d]) | uint32_t(row[d + 1]) << 16 : 0u;
      }
  }
}

__global__ void __launch_bounds__(kThreadsB, 1)
    attend_rows_bf16_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ CUtensorMap cache_map) {
  // Aligned to 1024 bytes (the 128-byte swizzle) by an offset from smem_raw (attend_rows.cu: why).
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<Bf16RowsSmem*>(smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int row0 = 16 * warp + g;  // this thread's rows: row0 (h = 0) and row0 + 8 (h = 1)
  const CtaWork cta(p, kRowsM, tid);
  const int rows_total = cta.rows_total, m_base = cta.m_base;
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      tma::mbarrier_init(ptx::smem_addr(&sm.full[s]), TmaTiles::slots(p));
      for (int k = 0; k < 4; ++k) sm.key_mask[s][k] = 0;  // slots past TmaTiles::slots(p) stay 0
    }
    tma::fence_barrier_init();  // published by the first segment's CTA barrier
  }
  int done = 0;  // tiles consumed by earlier segments (stage and parity run on)
  const TmaTiles tiles(p, &cache_map, lane, wg == 0 ? warp : 4);  // warpgroup 0's warps issue the boxes

  auto serve = [&](const KeyStream& keys, int b, int64_t part, int64_t tok_base, bool has_next, bool prefetched) {
    const KeyStream& next = sm.next_segment;
    const int n_tiles = keys.n_tiles();
    auto issue = [&](const KeyStream& ks, int tile, int at, int32_t page) {
      if (!tiles.issues()) return;
      const int stage = at & 1;
      tiles.issue<kRowSlabs>(ks, tile, page, ptx::smem_addr(sm.kv[stage]), ptx::smem_addr(&sm.full[stage]),
                             &sm.key_mask[stage][warp]);
    };
    auto page_of = [&](const KeyStream& ks, int tile) { return tiles.issues() ? tiles.page_of(ks, tile) : -1; };
    // The query's loads first, then the page ids and first boxes: the round trips overlap.
    int tid_q = tid;
    asm volatile("" : "+r"(tid_q));  // (the loads' offsets would be hoisted out of the segment loop and held)
    QueryRowsBf16 query;
    query.load(p, b, m_base, rows_total, tid_q);
    int32_t next_page = -1, next_segment_page = -1;
    if (n_tiles > 0) {
      if (!prefetched) issue(keys, 0, done, page_of(keys, 0));
      if (n_tiles > 1) next_page = page_of(keys, 1);
      if (has_next) next_segment_page = page_of(next, 0);
    }
    query.store(sm.q, tid_q);
    uint32_t q_rope[kRopeSteps][4];
    load_rope(p, b, m_base, rows_total, warp, g, c, q_rope);
    if (tid < kRowsM) sm.limit[tid] = keys.limit(p, m_base + tid, rows_total);
    wgmma::fence_proxy_async();
    __syncthreads();

    // Causal limits: every row of the CTA sees keys up to min_limit (the first row's); a half past
    // it takes the per-row rule (rows past the request's see nothing).
    const int32_t min_limit = keys.limit(p, m_base, rows_total);
    const int32_t row_limit[2] = {sm.limit[row0], sm.limit[row0 + 8]};
    float m_run[2] = {-INFINITY, -INFINITY}, d_run[2] = {0.0f, 0.0f};  // log2 units (scaled scores)
    const float scale_log2 = p.score_scale * 1.4426950408889634f;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    const uint64_t q_desc = wgmma::descriptor(ptx::smem_addr(sm.q), kChunkStrideM, 128);
    auto position = [&](int64_t jj) {
      return keys.plain_positions ? jj : dcp_global_position(jj, p.dcp_size, p.dcp_rank, p.dcp_interleave);
    };

    for (int j = 0; j < n_tiles; ++j) {
      const int at = done + j, stage = at & 1;
      const uint32_t kv = ptx::smem_addr(sm.kv[stage]);
      tma::wait_parity_forever(ptx::smem_addr(&sm.full[stage]), (at >> 1) & 1);
      const uint64_t tile_mask = (sm.key_mask[stage][0] | sm.key_mask[stage][1]) | (sm.key_mask[stage][2] | sm.key_mask[stage][3]);
      const uint32_t half_mask = uint32_t(tile_mask >> (kHalfKeys * wg));  // this warpgroup's 32 keys

      // q.k: S [64 rows x 32 keys] for this warpgroup's half. This waits for the previous tile's
      // p.v too (one wait for both: the tensor cores run them back to back).
      float s[16];
      {
        uint64_t qd = q_desc, kd = wgmma::descriptor_sw128(kv + kHalfKeys * wg * 128);
        wgmma::fence();
#pragma unroll
        for (int t = 0; t < kQkSmemSteps; ++t) {
          wgmma::mma_m64n32k16_bf16(s, qd, kd, t > 0);
          // next step: two 16-byte chunks on in the query; 32 bytes on in the slab, or the next slab
          qd = wgmma::advance(qd, 2 * kChunkStrideM);
          kd = wgmma::advance(kd, (t & 3) == 3 ? kSlabBytes - 3 * 32 : 32);
          asm volatile("" : "+l"(qd), "+l"(kd));  // (unrolled, ptxas would hold every descriptor at once)
        }
#pragma unroll
        for (int t = 0; t < kRopeSteps; ++t) {
          wgmma::mma_m64n32k16_bf16_rs(s, q_rope[t], kd);
          kd = wgmma::advance(kd, 32);
        }
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operand(s);
        wgmma::fence_operand(o);
      }
      // Scores masked by a select (a NaN of a masked key goes too). Element i: row row0 + 8 half,
      // key 8 (i / 4) + 2c + (i & 1) of the half. Positions grow with the local index, so the half's
      // last key decides whether every row sees all of it.
      const int64_t key0 = keys.k_begin + int64_t(j) * kTileKeys + kHalfKeys * wg;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if (!((half_mask >> (8 * (i >> 2) + 2 * c + (i & 1))) & 1)) s[i] = -INFINITY;
      if (position(key0 + kHalfKeys - 1) > min_limit) {
#pragma unroll
        for (int i = 0; i < 16; ++i)
          if (position(key0 + 8 * (i >> 2) + 2 * c + (i & 1)) > row_limit[(i >> 1) & 1]) s[i] = -INFINITY;
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < 16; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      }
      if (c == 0) sm.red[wg][row0] = mx[0], sm.red[wg][row0 + 8] = mx[1];
      // V rows of this half's masked keys (past the segment, on a bad page: whatever the buffer
      // held, NaN included) to zero before p.v reads them; this warpgroup's q.k is done with them.
      if (half_mask != 0xFFFFFFFFu) {
        const int t = tid % 128;
#pragma unroll 4
        for (int k = 0; k < kHalfKeys * kLatent * 2 / 16 / 128; ++k) {  // 16 16-byte chunks a thread
          const int unit = t + 128 * k, key = unit / 64, slab = (unit / 8) % 8, chunk = unit % 8;
          if (!((half_mask >> key) & 1))
            *reinterpret_cast<uint4*>(&sm.kv[stage][slab * kSlabBytes + (kHalfKeys * wg + key) * 128 + 16 * chunk]) =
                make_uint4(0, 0, 0, 0);
        }
        wgmma::fence_proxy_async();  // (the tensor cores read them after the barriers below)
      }
      // Both warpgroups are done with tile j - 1 (their q.k of tile j waited for its p.v): its
      // stage takes tile j + 1 now, and P and the maxima may be rewritten.
      __syncthreads();
      if (j + 1 < n_tiles) {
        issue(keys, j + 1, at + 1, next_page);
        if (j + 2 < n_tiles) next_page = page_of(keys, j + 2);
      } else if (has_next) {
        issue(next, 0, at + 1, next_segment_page);
      }
      // The rows' maxima over the whole tile, the same in both warpgroups (the same operands in the
      // same order), and the lazy rescale: a row's maximum moves only past m_run + 2^3 (weights stay
      // <= 2^8), to the tile's maximum; -inf stays -inf while a row sees nothing.
      float alpha[2];
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float tile_max = fmaxf(sm.red[0][row0 + 8 * h], sm.red[1][row0 + 8 * h]) * scale_log2;
        alpha[h] = 1.0f;
        if (tile_max > m_run[h] + kLazyRescale) {
          alpha[h] = exp2f(m_run[h] - tile_max);  // 0 from -inf
          m_run[h] = tile_max;
          d_run[h] *= alpha[h];
          moved = true;
        }
      }
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
      }
      // P = exp2(s scale - m) in bf16 as p.v's A fragments (k16 step ks: a[0] row0 keys 16 ks + 2c,
      // +1; a[1] row0 + 8; a[2], a[3] the keys + 8: accumulator elements 8 ks + 2e, + 1), and to
      // shared memory for the other warpgroup (K-major core matrices, a thread's 4 bytes a chunk row).
      uint32_t pa[2][4];
      const float neg_m[2] = {m_run[0] == -INFINITY ? 0.0f : -m_run[0], m_run[1] == -INFINITY ? 0.0f : -m_run[1]};
      const uint32_t p_mine = ptx::smem_addr(sm.p[wg]) + 2 * warp * 128 + 16 * g + 4 * c;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 8 * ks + 2 * e, h = e & 1;
          const float w0 = exp2f(fmaf(s[i], scale_log2, neg_m[h])), w1 = exp2f(fmaf(s[i + 1], scale_log2, neg_m[h]));
          d_run[h] += w0 + w1;
          pa[ks][e] = ptx::pack_bf16x2(w0, w1);
          // row0 + 8 h, keys 16 ks + 8 (e / 2) + 2c: chunk 2 ks + e / 2
          ptx::st_shared_b32(p_mine + (2 * ks + (e >> 1)) * kChunkStrideM + 128 * h, pa[ks][e]);
        }
      // p.v with this half's P from registers, then (after the barrier that publishes it) the other's.
      auto v_desc = [&](int half, int ks) {  // keys 32 half + 16 ks .., this warpgroup's 4 slabs of dims
        return wgmma::descriptor_sw128_mn(kv + (kHalfDims / 64 * wg) * kSlabBytes + (kHalfKeys * half + 16 * ks) * 128,
                                          kSlabBytes);
      };
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) wgmma::mma_m64n256k16_bf16_rs(o, pa[ks], v_desc(wg, ks));
      wgmma::commit();
      wgmma::fence_proxy_async();  // P (st.shared) before the other warpgroup's tensor cores read it
      __syncthreads();
      const uint64_t p_other = wgmma::descriptor(ptx::smem_addr(sm.p[wg ^ 1]), kChunkStrideM, 128);
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
        wgmma::mma_m64n256k16_bf16_ss(o, wgmma::advance(p_other, 2 * ks * kChunkStrideM), v_desc(wg ^ 1, ks));
      wgmma::commit();
    }
    wgmma::wait<0>();
    wgmma::fence_operand(o);

    // Row sums: over the quad, then both halves through shared memory (the last tile's reads of the
    // maxima are behind its second barrier).
    float d[2] = {d_run[0], d_run[1]};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
      d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
    }
    if (c == 0) sm.red[wg][row0] = d[0], sm.red[wg][row0 + 8] = d[1];
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = row0 + 8 * h, m = m_base + n;
      if (m >= rows_total) continue;
      // Natural-log state for the shared rules: lse = ln 2 * (m + log2 d); empty rows o = 0, lse = -inf.
      SoftmaxState f;
      f.d = sm.red[0][n] + sm.red[1][n];
      f.m = f.empty() ? -INFINITY : m_run[h] * 0.6931471805599453f;
      const float scale = f.inv_sum() * p.v_scale;
      const OutRow out(p, part, tok_base, m);
#pragma unroll
      for (int jj = 0; jj < kHalfDims / 8; ++jj)
        out.store_pair(p, kHalfDims * wg + 8 * jj + 2 * c, o[4 * jj + 2 * h] * scale, o[4 * jj + 2 * h + 1] * scale);
      if (wg == 0 && c == 0) p.lse[out.lse_index] = f.lse();
    }
    done += n_tiles;
  };  // serve

  serve_segments<kThreadsB, kRowsM, true>(p, cta, p.flat_ctas > 0, kTileKeys, tid, sm.flat_start, sm.next_segment,
                                          &sm.segment, serve);
}

}  // namespace

bool attend_rows_bf16_applies(const AttendParams& p) {
  return attend_kernel_mode() > 0 && (p.step_partials || attend_kernel_mode() == 2) && !p.q_fp8 && !p.cache_fp8 &&
         !p.exact_p && attend_o_pairs_aligned(p) && p.many_rows && attend_wgmma_uses_tma(p);
}

void prepare_attend_rows_bf16_kernel() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(attend_rows_bf16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      bf16_rows_smem_bytes()));
}

void launch_attend_rows_bf16(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream) {
  const dim3 grid = attend_launch_grid(p, kRowsM);
  attend_rows_bf16_kernel<<<grid, kThreadsB, bf16_rows_smem_bytes(), stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
