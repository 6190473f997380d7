#pragma once
// How the wgmma attend kernels (attend_wgmma.cu's 16-row kernel, attend_rows.cu's and attend_rows_bf16.cu's
// many-rows kernels) walk their work and hand back results: serve_segments (a CTA's segments, fixed
// splits or the flat plan), the consumers' barrier (sync_consumers) and OutRow (where a query row's o
// and lse go). The tiles themselves (layouts, TMA boxes, row copies, the query tile, V^T's fragments):
// attend_wgmma_tiles.cuh.
#include <cstdint>
#include <type_traits>

#include "cuda/attend_keys.cuh"
#include "cuda/flat_plan.hpp"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda::wgmma_attend {

// Where a query row's results go: row m (query m / G, head m % G) of token rows tok_base + i in
// partial `part` (both wgmma kernels' epilogues).
struct OutRow {
  int64_t o_base, lse_index;
  __device__ __forceinline__ OutRow(const AttendParams& p, int64_t part, int64_t tok_base, int m)
      : OutRow(p, part, tok_base, m / p.heads, m % p.heads) {}
  // The same with query t, head h of row m given (the 16-row kernel: t by fast_div).
  __device__ __forceinline__ OutRow(const AttendParams& p, int64_t part, int64_t tok_base, int t, int h) {
    const int64_t s_idx = tok_base + t;
    o_base = part * p.o_split_stride + s_idx * p.o_s_stride + int64_t(h) * p.o_h_stride;
    lse_index = part * p.lse_split_stride + s_idx * p.lse_s_stride + int64_t(h) * p.lse_h_stride;
  }
  // Latent dims d, d + 1 (d even).
  __device__ __forceinline__ void store_pair(const AttendParams& p, int d, float x0, float x1) const {
    const int64_t off = o_base + d;
    if (p.o_bf16) *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.o) + off) = ptx::pack_bf16x2(x0, x1);
    else *reinterpret_cast<float2*>(static_cast<float*>(p.o) + off) = make_float2(x0, x1);
  }
};

// The consumer threads' barrier (kConsumers of them): named barrier kConsumerBarrier where a
// producer warpgroup runs beside them (it never joins), else the CTA barrier; _or also ORs `pred`
// over them.
constexpr int kConsumerBarrier = 1;
template <bool kProducer, int kConsumers>
__device__ __forceinline__ void sync_consumers() {
  if constexpr (kProducer) ptx::named_sync(kConsumerBarrier, kConsumers);
  else __syncthreads();
}
template <bool kProducer, int kConsumers>
__device__ __forceinline__ bool sync_consumers_or(bool pred) {
  if constexpr (kProducer) return ptx::named_sync_or(kConsumerBarrier, kConsumers, pred);
  else return __syncthreads_or(pred) != 0;
}

// A CTA's segments, for both wgmma kernels: one (request, split) with fixed splits (TMA tiles start
// on a page: chunks rounded up to whole tiles); with the flat plan (flat_plan.hpp) the requests
// overlapping this key-CTA's tiles [begin, end). serve(keys, b, part, tok_base, has_next,
// prefetched) serves one: request b's keys into partial `part` at token rows tok_base + i;
// has_next: a next segment follows, whose first tile serve may issue during its last (the 16-row
// kernel: *next_segment, written by thread 0 and read by its issuing warps after its prologue's
// CTA barrier; the previous segment's reads of it are behind its epilogue's CTA barriers; nullptr,
// a std::nullptr_t, where no serve reads it); prefetched: this one's first tile was issued so. (The many-rows
// kernels issue nothing across segments from serve: the fp8 one's producer warpgroup walks the
// segments itself.)
// kScanned: the caller ran flat::scan_tiles already (a CTA whose producer warpgroup and consumers
// call this from two places: scan_tiles' __syncthreads must be reached from one, else
// compute-sanitizer synccheck reports divergent threads, as it did in session 29).
// kSegmentInSmem: keys are handed to serve in shared memory (*segment, a CTA barrier after thread
// 0 writes it) rather than in registers; kSegmentSync > 0: that barrier is sync_consumers' of the
// kSegmentSync threads that serve (a producer warpgroup beside them walks its own copy of the
// segments). One call site of serve (one copy of its code).
// kFastDivs (the 16-row kernel's default TMA instance, s23a): the divisions by AttendParams'
// magics (cta from CtaWork's FastDivs constructor). kSkew (with kFastDivs; s33a): fixed splits
// skewed toward the CTAs placed first (skew_plan.hpp; cta from CtaWork's SkewedFastDivs one).
template <int kThreadsN, int kRowsPerCta, bool kSegmentInSmem, int kSegmentSync = 0, bool kFastDivs = false,
          bool kScanned = false, bool kSkew = false, class NextSegment, class Serve>
__device__ __forceinline__ void serve_segments(const AttendParams& p, const CtaWork& cta, bool flat, int chunk_align,
                                               int tid, int32_t* flat_start, NextSegment next_segment,
                                               KeyStream* segment, Serve&& serve) {
  const int batch = p.batch;
  flat::Cta range{1, 0, 0};  // the flat plan: this key-CTA's tiles
  int cta_key = 0, b = cta.b;
  if (flat) {
    if constexpr (!kScanned) flat::scan_tiles<kThreadsN>(flat_start, p, kTileKeys, tid);
    if constexpr (kFastDivs) {
      cta_key = cta.work;
      range = flat::cta_range_fast(flat_start, batch, p.flat_ctas, cta_key, p.flat_ctas_magic);
    } else {
      const int m_tiles = (cta.rows_total + kRowsPerCta - 1) / kRowsPerCta;
      cta_key = blockIdx.x / m_tiles;
      range = flat::cta_range(flat_start, batch, p.flat_ctas, cta_key);
    }
    if (blockIdx.x == 0)  // post merges nothing for an empty request
      for (int i = tid; i < batch; i += kThreadsN)
        if (flat_start[i + 1] == flat_start[i]) p.part_count[i] = 0;
    b = flat::first_request(flat_start, batch, range);
  }
  // The flat plan's segment of request i (which must hold a tile of [begin, end)).
  auto segment_keys = [&](int i, bool reporter) {
    const int64_t begin = int64_t(flat::segment_first(flat_start, i, range)) * kTileKeys;
    const int64_t end = int64_t(flat::segment_last(flat_start, i, range)) * kTileKeys;
    if constexpr (kFastDivs) return KeyStream(p, i, begin, end, reporter, cta.last_query, FastDivs{});
    else return KeyStream(p, i, begin, end, cta.last_row(kRowsPerCta), reporter);
  };
  auto next_request = [&](int i) { return flat::next_request(flat_start, batch, i, range); };
  bool prefetched = false;
  for (int cur = flat ? next_request(b) : cta.b; cur >= 0;) {
    const int nb = flat ? next_request(cur + 1) : -1;
    const bool opens = flat && flat::opens(flat_start, cur, range);  // serves the request's first tile
    if (opens && cta.m_tile == 0 && tid == 0) {
      p.part_first[cur] = int32_t(flat::partial(cta_key, cur));
      p.part_count[cur] = flat::partial_count(flat_start, cur, range, cta_key);
    }
    static_assert(!kSkew || kFastDivs);
    const KeyStream keys =
        flat ? segment_keys(cur, opens && cta.m_tile == 0 && tid == 0)
        : kSkew
            ? KeyStream(p, cta.b, cta.split, cta.reporter, chunk_align, cta.last_query, SkewedFastDivs{})
        : kFastDivs ? KeyStream(p, cta.b, cta.split, cta.reporter, chunk_align, cta.last_query, FastDivs{})
                    : KeyStream(p, cta.b, cta.split, cta.last_row(kRowsPerCta), cta.reporter, chunk_align);
    if constexpr (!std::is_null_pointer_v<NextSegment>) {
      if (nb >= 0 && tid == 0) *next_segment = segment_keys(nb, false);
    }
    const int64_t part = flat ? flat::partial(cta_key, cur) : cta.split;
    const int64_t tok_base = flat ? 0 : int64_t(cta.b) * p.qlen;
    if constexpr (kSegmentInSmem) {
      if (tid == 0) *segment = keys;
      // the segments (the previous serve's reads of them are behind its barriers)
      sync_consumers<(kSegmentSync > 0), kSegmentSync>();
      serve(*segment, cur, part, tok_base, nb >= 0, prefetched);
    } else {
      serve(keys, cur, part, tok_base, nb >= 0, prefetched);
    }
    prefetched = nb >= 0;
    cur = nb;
  }
}

}  // namespace mla::cuda::wgmma_attend
