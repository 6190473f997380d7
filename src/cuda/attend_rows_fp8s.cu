// attend for many query rows a key with an fp8 query and cache, in the bf16 kernel's "seesaw"
// shape (v19, opt-in: MLA_ATTEND_ROWS_KERNEL=seesaw; NOT RUN ON A GPU YET, see docs/attention.md,
// "A plan for an fp8 seesaw kernel"). The default fp8 many-rows kernel is attend_rows.cu.
//
// Query rows on wgmma's M as in attend_rows_bf16.cu: a CTA takes 64 query rows with two warpgroups
// at one CTA an SM and streams 64-key fp8 tiles (TMA, five 128-byte slabs) through three buffers:
//   ownership: tile j of a segment (buffer (done + j) % 3) is owned by warpgroup j & 1, which scores
//            it alone: S [64 rows x 64 keys] = Q . K^T as QGMMA m64n64k32 e4m3 (the fp8 query from
//            shared memory, the tile as TMA wrote it), in 2-step groups summed in f32 (the fp8
//            accumulator is short: attend_wgmma.cu)
//   softmax: the running maxima pass from owner to owner in tile order (named barriers, one a
//            direction), lazily; P(j) as f16 into the tile's fifth slab (free once q.k is done)
//   p.v:     warpgroup w owns o's dims 256 w .. 256 w + 255 and adds P(j) V(j) for every tile in
//            order (HGMMA m64n256k16 f16): V MN-major from its own buffer, where it widens its
//            dims of each tile to f16 first (a masked key's row as zeros); P from registers for
//            its own tiles, from the fifth slab for the other's
//   loads:   warpgroup w loads its dims' slabs (2w, 2w + 1) of every tile, after its widening of
//            the tile that held them and that tile's q.k; and the fifth slab of its own tiles,
//            after its p.v of the tile that held them (it read P there last). With three buffers
//            tile j + 3 replaces tile j, about two rounds before its q.k.
// Tiles come by TMA only (pages of 8+ rows, a power of two); the step's partials only.
// Shared memory: 3 x 40 KB tiles + the 36 KB query + 2 x 32 KB widened V.
#include <cuda_fp16.h>

#include <cstdlib>
#include <string_view>

#include "cuda/attend_keys.cuh"
#include "cuda/attend_rows_m.cuh"
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

constexpr int kRowsM = kAttendRowsPerCta;            // query rows a CTA: wgmma M (64)
constexpr int kGroups = 2;                           // warpgroups
constexpr int kThreadsS = 128 * kGroups;
constexpr int kBuffers = 3;                          // tile buffers
constexpr int kDimSlabs = kLatent / 128 / kGroups;   // fp8 slabs of a warpgroup's dims (2)
constexpr int kRopeSlab = kLatent / 128;             // the fifth slab: rope dims, then P (4)
constexpr int kHalfDims = kLatent / kGroups;         // o's dims a warpgroup (256)
constexpr int kAtoms = kHalfDims / 64;               // widened V: 64-dim atoms of 8 KB a warpgroup (4)
constexpr int kAtomBytes = kTileKeys * 128;
constexpr int kChunkStrideM = kRowsM / 8 * 128;      // K-major core matrices of 64 rows: 1024
constexpr int kGroupSteps = 2;                       // k32 steps an f32-summed q.k accumulator takes
constexpr int kBarPublished = 1;                     // + w: warpgroup w published a tile (named barrier)
constexpr int kBarGroup = 3;                         // + w: warpgroup w's 128 threads
static_assert(kTileKeys / 8 * kChunkStrideM == kSlabBytes, "P [64 rows x 64 keys] in f16 fills the fifth slab");
static_assert(kQkSteps % kGroupSteps == 0 && (kDimSlabs * 4) % kGroupSteps == 0);

struct SeesawSmem {
  alignas(1024) uint8_t kv[kBuffers][kTmaTileBytes];   // swizzled fp8 slabs (tile_offset<true>)
  alignas(1024) uint8_t vw[kGroups][kAtoms * kAtomBytes];  // each warpgroup's V dims in f16, swizzled atoms
  alignas(128) uint8_t q[kRowsM * kRow];               // e4m3 query rows, b_offset_n<64>
  float m_pub[2][kRowsM];                              // the running maxima after tile j ([j & 1], log2 units)
  float red[kGroups][kRowsM];                          // each warpgroup's share of the row sums
  int32_t limit[kRowsM];                               // a row's last visible position (causal)
  alignas(8) uint64_t full[kBuffers][3];               // [buffer][part]: warpgroup 0's, 1's slabs, the fifth
  uint64_t key_mask[kBuffers][kGroups][4];             // a tile's real keys, by each warpgroup's issuing warps
  int32_t flat_start[kMaxFlatBatch + 1];
  KeyStream segment, next_segment;
};
constexpr int seesaw_smem_bytes() { return int(sizeof(SeesawSmem)) + 1024; }
static_assert(seesaw_smem_bytes() <= 227 * 1024, "over the H200's shared memory a block");

__global__ void __launch_bounds__(kThreadsS, 1)
    attend_rows_fp8s_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ CUtensorMap cache_map) {
  // Aligned to 1024 bytes (the 128-byte swizzle) by an offset from smem_raw (attend_rows.cu: why).
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<SeesawSmem*>(smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));
  const int tid = threadIdx.x, warp = (tid / 32) % 4, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform to ptxas (attend_rows_bf16.cu)
  const int g = lane / 4, c = lane % 4;
  const int row0 = 16 * warp + g;  // this thread's rows: row0 (h = 0) and row0 + 8 (h = 1)
  const CtaWork cta(p, kRowsM, tid);
  const int rows_total = cta.rows_total, m_base = cta.m_base;
  if (tid == 0) {
    for (int b = 0; b < kBuffers; ++b) {
      for (int part = 0; part < 3; ++part) tma::mbarrier_init(ptx::smem_addr(&sm.full[b][part]), TmaTiles::slots(p));
      for (int w = 0; w < kGroups; ++w)
        for (int k = 0; k < 4; ++k) sm.key_mask[b][w][k] = 0;  // slots past TmaTiles::slots(p) stay 0
    }
    tma::fence_barrier_init();  // published by the first segment's CTA barrier
  }
  int done = 0;  // tiles consumed by earlier segments (buffer and parity run on)
  const TmaTiles tiles(p, &cache_map, lane, warp);  // each warpgroup's warps issue its own parts

  auto serve = [&](const KeyStream& keys, int b, int64_t part, int64_t tok_base, bool, bool) {
    const int n_tiles = keys.n_tiles();
    auto buffer = [&](int j) { return (done + j) % kBuffers; };
    auto parity = [&](int j) { return uint32_t((done + j) / kBuffers) & 1; };
    auto kv_of = [&](int j) { return ptx::smem_addr(sm.kv[buffer(j)]); };
    auto bar_of = [&](int j, int part_) { return ptx::smem_addr(&sm.full[buffer(j)][part_]); };
    // This warpgroup's loads, dims in tile order (dims_page: the next one's page id, loaded a
    // load ahead; own_page: the page of its latest own tile, for that tile's fifth slab).
    int32_t dims_page = -1, own_page = -1;
    auto load_dims = [&](int j) {
      if (!tiles.issues()) return;
      tiles.issue<kDimSlabs>(keys, j, dims_page, kv_of(j), bar_of(j, wg), &sm.key_mask[buffer(j)][wg][warp],
                             kDimSlabs * wg);
      if ((j & 1) == wg) own_page = dims_page;
      dims_page = j + 1 < n_tiles ? tiles.page_of(keys, j + 1) : -1;
    };
    auto load_rope = [&](int j) {  // an own tile's fifth slab, after its dims
      if (tiles.issues()) tiles.issue<1>(keys, j, own_page, kv_of(j), bar_of(j, 2), nullptr, kRopeSlab);
    };
    int tid_q = tid;
    asm volatile("" : "+r"(tid_q));  // (the loads' offsets would be hoisted out of the segment loop and held)
    QueryTile<kRowsM, kThreadsS> query;
    query.load(p, b, m_base, rows_total, tid_q);
    if (n_tiles > 0 && tiles.issues()) {  // tiles 0 .. 2: every part
      dims_page = tiles.page_of(keys, 0);
      for (int j = 0; j < kBuffers && j < n_tiles; ++j) {
        load_dims(j);
        if ((j & 1) == wg) load_rope(j);
      }
    }
    query.store(sm.q, tid_q);
    if (tid < kRowsM) sm.limit[tid] = keys.limit(p, m_base + tid, rows_total);
    wgmma::fence_proxy_async();
    __syncthreads();

    const int32_t min_limit = keys.limit(p, m_base, rows_total);
    const int32_t row_limit[2] = {sm.limit[row0], sm.limit[row0 + 8]};
    rows_m::Chain chain;  // this thread's rows' running maxima and share of the row sums
    const float scale_log2 = p.score_scale * 1.4426950408889634f;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    const uint64_t q_desc = wgmma::descriptor(ptx::smem_addr(sm.q), kChunkStrideM, 128);
    const uint32_t vw = ptx::smem_addr(sm.vw[wg]);
    auto position = [&](int64_t jj) {
      return keys.plain_positions ? jj : dcp_global_position(jj, p.dcp_size, p.dcp_rank, p.dcp_interleave);
    };
    auto v_desc = [&](int ks) {  // keys 16 ks .. of the widened V: 4 atoms of 64 dims, 8 KB apart
      return wgmma::descriptor_sw128_mn(vw + 16 * ks * 128, kAtomBytes);
    };
    auto key_mask = [&](int j) {  // tile j's real keys (after a wait on this warpgroup's part of it)
      const uint64_t* m = sm.key_mask[buffer(j)][wg];
      return (m[0] | m[1]) | (m[2] | m[3]);
    };
    auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    };
    // This warpgroup's 256 dims of tile j widened to f16 (p.v's B operand, MN-major: atom a holds
    // dims 256 w + 64 a .., key k's 128 bytes at 128 k, 16-byte chunk x at x ^ (k % 8), as TMA's
    // swizzle), a masked key's row as zeros (the tile may hold NaN there). Its p.v of the tile
    // before must be done; then this warpgroup's threads meet (the tensor cores read it next).
    auto widen = [&](int j) {
      tma::wait_parity_forever(bar_of(j, wg), parity(j));
      const uint64_t mask = key_mask(j);
      const uint8_t* tile = sm.kv[buffer(j)] + kDimSlabs * wg * kSlabBytes;
#pragma unroll 4
      for (int k = 0; k < kTileKeys * (kHalfDims / 16) / 128; ++k) {  // 8 units of 16 dims a thread
        const int unit = tid % 128 + 128 * k, key = unit / 16, x = unit % 16;  // x: 16-dim chunk of 256
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
        if ((mask >> key) & 1) {
          const uint4 raw =
              *reinterpret_cast<const uint4*>(tile + (x / 8) * kSlabBytes + key * 128 + (((x % 8) ^ (key & 7)) << 4));
          ptx::fp8x4_to_f16x2x2(raw.x, lo.x, lo.y);
          ptx::fp8x4_to_f16x2x2(raw.y, lo.z, lo.w);
          ptx::fp8x4_to_f16x2x2(raw.z, hi.x, hi.y);
          ptx::fp8x4_to_f16x2x2(raw.w, hi.z, hi.w);
        }
        uint8_t* atom = sm.vw[wg] + (x / 4) * kAtomBytes + key * 128;
        const int y = 2 * (x % 4);  // the two 8-dim chunks of the atom
        *reinterpret_cast<uint4*>(atom + ((y ^ (key & 7)) << 4)) = lo;
        *reinterpret_cast<uint4*>(atom + (((y + 1) ^ (key & 7)) << 4)) = hi;
      }
      wgmma::fence_proxy_async();
      ptx::named_sync(kBarGroup + wg, 128);
    };
    // q.k(t), the owner's, in waited 2-step groups summed in f32: this warpgroup's slabs first (the
    // bf16 kernel's v18d found the other order slower), then the other's, then the rope half slab.
    auto qk = [&](int t, float (&s)[32]) {
      const uint32_t kv = kv_of(t);
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.0f;
      auto group = [&](int step) {  // k32 steps step, step + 1
        float acc[32];
        wgmma::fence();
#pragma unroll
        for (int u = 0; u < kGroupSteps; ++u)
          wgmma::mma_m64n64k32_e4m3(acc, wgmma::advance(q_desc, (step + u) * 2 * kChunkStrideM),
                                    wgmma::descriptor_sw128(kv + key_step_offset<true>(step + u)), u > 0);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operand(acc);
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] += acc[i];
      };
#pragma unroll
      for (int half = 0; half < kGroups; ++half) {
        const int w = half ^ wg;
        tma::wait_parity_forever(bar_of(t, w), parity(t));
#pragma unroll 1
        for (int step = 4 * kDimSlabs * w; step < 4 * kDimSlabs * (w + 1); step += kGroupSteps) group(step);
      }
      tma::wait_parity_forever(bar_of(t, 2), parity(t));
      group(kQkSteps - kGroupSteps);  // the rope dims: the fifth slab's first 64 bytes
    };
    // p.v of the other warpgroup's tile j once it published the tile's maxima and P (its fifth
    // slab): o moves to the new maxima first; this warpgroup's dims of tile j + 3 go out (its
    // widening and the owner's q.k were the slabs' last readers).
    auto pv_other = [&](int j) {
      ptx::named_sync(kBarPublished + (wg ^ 1), kThreadsS);
      float alpha[2];
      if (__any_sync(0xffffffffu, chain.take(sm.m_pub[j & 1], row0, alpha))) {  // (nothing in flight)
        wgmma::fence_operand(o);  // (the compiler must not move o's reads above the last wait)
        rescale(alpha);
      }
      if (j + kBuffers < n_tiles) load_dims(j + kBuffers);
      const uint64_t pd = wgmma::descriptor(kv_of(j) + kRopeSlab * kSlabBytes, kChunkStrideM, 128);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kPvSteps; ++ks)
        wgmma::mma_m64n256k16_ss<true>(o, wgmma::advance(pd, 2 * ks * kChunkStrideM), v_desc(ks));
      wgmma::commit();
    };
    // The owner's softmax of tile t (q.k done), its maxima and P published; then, once the other's
    // tile is added (load_rope: the fifth slab of tile t + 2 replaces that tile's), its dims of t
    // widened, its dims of t + 3 loaded, and p.v with P from registers.
    auto own = [&](int t, float (&s)[32], bool rope_next) {
      rows_m::mask_scores(s, key_mask(t), c, keys.k_begin + int64_t(t) * kTileKeys, min_limit, row_limit, position);
      float alpha[2];
      const bool moved = chain.own(s, scale_log2, row0, c, sm.m_pub[t & 1], alpha);
      // P in f16 (weights <= 2^8 with the lazy rule) as A fragments and into the fifth slab.
      uint32_t pa[kPvSteps][4];
      chain.weights<true>(s, scale_log2, kv_of(t) + kRopeSlab * kSlabBytes + 2 * warp * 128 + 16 * g + 4 * c,
                          kChunkStrideM, pa);
      wgmma::fence_proxy_async();  // P (st.shared) before the other warpgroup's tensor cores read it
      ptx::named_arrive(kBarPublished + wg, kThreadsS);
      wgmma::wait<0>();  // the other's tile's p.v: o, the widened V and the fifth slab it read
      wgmma::fence_operand(o);
      if (__any_sync(0xffffffffu, moved)) rescale(alpha);
      if (rope_next && t + 2 < n_tiles) load_rope(t + 2);
      widen(t);
      if (t + kBuffers < n_tiles) load_dims(t + kBuffers);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kPvSteps; ++ks) wgmma::mma_m64n256k16_rs<true>(o, pa[ks], v_desc(ks));
      wgmma::commit();
    };

    // Rounds: warpgroup wg owns t = wg, wg + 2, ...: q.k(t); its dims of the other's tile t - 1
    // widened and added (pv_other); t's softmax and p.v (own). Warpgroup 0's first round has no
    // t - 1 (and its tile 2's fifth slab went out with the first three tiles); a last round may
    // hold only the other's tile. The q.k groups' waits also wait for the previous round's p.v.
    int t = wg;
    if (wg == 0 && n_tiles > 0) {
      float s[32];
      qk(0, s);
      own(0, s, false);
      t = 2;
    }
    for (; t < n_tiles; t += 2) {
      float s[32];
      qk(t, s);
      widen(t - 1);
      pv_other(t - 1);
      own(t, s, true);
    }
    if (t == n_tiles && t >= 1) {
      wgmma::wait<0>();  // this warpgroup's p.v of t - 2 read the widened V
      widen(t - 1);
      pv_other(t - 1);
    }
    wgmma::wait<0>();
    wgmma::fence_operand(o);

    chain.store<kHalfDims>(p, o, sm.red, wg, row0, c, m_base, rows_total, part, tok_base);
    done += n_tiles;
  };  // serve

  serve_segments<kThreadsS, kRowsM, true>(p, cta, p.flat_ctas > 0, kTileKeys, tid, sm.flat_start, sm.next_segment,
                                          &sm.segment, serve);
}

}  // namespace

bool attend_rows_seesaw_wanted() {
  static const bool wanted = [] {
    const char* env = std::getenv("MLA_ATTEND_ROWS_KERNEL");
    return env && std::string_view(env) == "seesaw";
  }();
  return wanted;
}

void prepare_attend_rows_fp8s_kernel() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(attend_rows_fp8s_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      seesaw_smem_bytes()));
}

void launch_attend_rows_fp8s(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream) {
  const dim3 grid = attend_launch_grid(p, kRowsM);
  attend_rows_fp8s_kernel<<<grid, kThreadsS, seesaw_smem_bytes(), stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
