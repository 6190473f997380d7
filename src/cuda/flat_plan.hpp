#pragma once
// The flat plan's arithmetic (docs/attention.md, "The flat plan"), shared by the wgmma attend
// kernel and a host test of its invariants (tests/gpu/test_flat_plan.cpp): the requests' key tiles
// laid end to end (starts[b] = request b's first tile, starts[batch] = T), key-CTA c serving tiles
// [c K, (c+1) K), K = max(kMinFlatTiles, ceil(T / ctas)), one segment per request it overlaps.
#include <cstdint>

#include "cuda/fast_div.hpp"
#include "cuda/stages.hpp"
#include "mla/host_device.hpp"

namespace mla::cuda::flat {

// Key tiles of a request of global length `len` at W = 1 (none for an empty or invalid length).
MLA_HD int32_t request_tiles(int32_t len, int qlen, int tile_keys) {
  return len > 0 && len >= qlen ? (len + tile_keys - 1) / tile_keys : 0;
}

// Key-CTA `cta`'s tiles [begin, end) of the T in all (begin == end: nothing to serve).
struct Cta {
  int32_t per_cta, begin, end;
};
// (ceil = ceil(T / CTAs), however computed.)
MLA_HD Cta cta_range_of(int32_t total, int32_t ceil, int cta) {
  const int32_t per = ceil > kMinFlatTiles ? ceil : kMinFlatTiles;
  const int64_t b = int64_t(cta) * per;
  const int32_t begin = b < total ? int32_t(b) : total;
  return {per, begin, begin + per < total ? begin + per : total};
}
MLA_HD Cta cta_range(const int32_t* starts, int batch, int ctas, int cta) {
  const int32_t total = starts[batch];
  return cta_range_of(total, (total + ctas - 1) / ctas, cta);
}

// The same with T / CTAs by the multiply-shift ctas_magic = div_magic(ctas) where it is exact
// (fast_div.hpp: x ctas < 2^32, else the division; the 16-row kernel's default instance, s23a).
MLA_HD Cta cta_range_fast(const int32_t* starts, int batch, int ctas, int cta, uint64_t ctas_magic) {
  const int32_t total = starts[batch];
  const uint32_t x = uint32_t(total) + uint32_t(ctas) - 1;
  const int32_t ceil = uint64_t(x) * uint32_t(ctas) < (uint64_t(1) << 32) ? fast_div(int(x), ctas_magic)
                                                                          : int32_t(x / uint32_t(ctas));
  return cta_range_of(total, ceil, cta);
}

// The request holding tile c.begin: the last b with starts[b] <= begin (empty ones skipped after).
MLA_HD int first_request(const int32_t* starts, int batch, const Cta& c) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= c.begin) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The first non-empty request from i that has a tile in [begin, end), or -1.
MLA_HD int next_request(const int32_t* starts, int batch, int i, const Cta& c) {
  while (i < batch && starts[i + 1] == starts[i]) ++i;
  return i < batch && starts[i] < c.end && c.begin < c.end ? i : -1;
}

// Request b's segment on this CTA: its local tiles [first, last).
MLA_HD int32_t segment_first(const int32_t* starts, int b, const Cta& c) {
  return (c.begin > starts[b] ? c.begin : starts[b]) - starts[b];
}
MLA_HD int32_t segment_last(const int32_t* starts, int b, const Cta& c) {
  return (c.end < starts[b + 1] ? c.end : starts[b + 1]) - starts[b];
}

// Whether this CTA serves request b's first tile (then it records b's partials for post), the
// partial a segment writes, and the number of partials of request b (recorded by that CTA).
MLA_HD bool opens(const int32_t* starts, int b, const Cta& c) { return starts[b] >= c.begin; }
MLA_HD int64_t partial(int cta, int b) { return int64_t(cta) + b; }
MLA_HD int32_t partial_count(const int32_t* starts, int b, const Cta& c, int cta) {
  return (starts[b + 1] - 1) / c.per_cta - cta + 1;
}

// Whether host-known lengths are even enough that fixed splits balance as well as the flat plan:
// all within 1/8 of the longest (none known: false). The many-rows kernel keeps fixed splits then
// (CudaBackend::attend: its segment switches cost more than the flat plan's balance brings).
inline bool lengths_even(const int32_t* lens, int64_t n) {
  if (n <= 0) return false;
  int32_t lo = lens[0], hi = lens[0];
  for (int64_t i = 1; i < n; ++i) lo = lens[i] < lo ? lens[i] : lo, hi = lens[i] > hi ? lens[i] : hi;
  return int64_t(hi - lo) * 8 <= hi;
}

#ifdef __CUDACC__
// Every key-CTA computes the plan itself: starts[i] = request i's first tile (an exclusive scan of
// the requests' tile counts by warp 0: a lane sums a run of requests, then the runs), starts[batch]
// = T; CTA 0 reports invalid lengths. Every thread of the CTA calls it (two CTA barriers).
template <int kThreads>
__device__ void scan_tiles(int32_t* starts, const AttendParams& p, int tile_keys, int tid) {
  const int batch = p.batch, lane = tid % 32;
  for (int i = tid; i < batch; i += kThreads) {
    starts[i] = request_tiles(p.seq_lens[i], p.qlen, tile_keys);  // the count, made the prefix below
    const int32_t len = p.seq_lens[i];
    if (blockIdx.x == 0 && len != 0 && len < p.qlen) atomicOr(p.error, kBadSeqLen);
  }
  __syncthreads();
  if (tid < 32) {
    const int per = (batch + 31) / 32, lo = min(batch, lane * per), hi = min(batch, lo + per);
    int32_t run = 0;
    for (int i = lo; i < hi; ++i) run += starts[i];
    int32_t before = run;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int32_t v = __shfl_up_sync(~0u, before, off);
      if (lane >= off) before += v;
    }
    before -= run;
    for (int i = lo; i < hi; ++i) {  // each lane its own slots
      const int32_t t = starts[i];
      starts[i] = before;  // request i's first tile
      before += t;
    }
    if (lane == 31) starts[batch] = before;
  }
  __syncthreads();
}
#endif

}  // namespace mla::cuda::flat

