#pragma once
// Fixed splits skewed toward the CTAs the GPU places first (s33a; by default from B = 2 since
// session 33: B 1.6-2.8%, C 1.2% faster on the H200; MLA_ATTEND_SKEW=0 off, =1 at B = 1 too): the
// 16-row kernel's default TMA instance at even batches, where the planner's one wave puts two CTAs
// on each SM.
//
// Why: session 21's timeline (docs/attention.md) found that of an SM's two CTAs the one placed first
// (blockIdx below the SM count) streams its tiles 8-9% faster than the second for equal work (2.20
// vs 2.40 us a tile at B64, 2.30 vs 2.48 at A, 2.13 vs 2.29 at B), and that a CTA left alone is no
// faster, so an SM's second CTA ends its last tiles at half the SM's rate. s21b gave the first CTAs
// more tiles through the flat plan and lost 6-12%: its ranges crossed requests, and every segment
// switch cost ~8 us. Here no range crosses a request: splits come in pairs (2k, 2k + 1) of one
// request, the grid's first half holds the even splits (placed first wherever the grid is at most
// two CTAs an SM) and its second half the odd ones, and the even split takes the share of the pair's
// whole chunks that best balances the two rates (kSkewFirst : kSkewSecond). Post merges the
// partials by their LSE whatever their ranges (SPEC.md's chunking binds only a caller's partials,
// which this kernel never writes: AttendParams.step_partials).
//
// Shared by the kernel (CtaWork, KeyStream) and a host test of its invariants
// (tests/gpu/test_skew_plan.cpp: the grid a bijection onto (work, row tile), every request's keys
// covered once, in whole units, by contiguous ranges).
#include <cstdint>

#include "cuda/fast_div.hpp"
#include "mla/host_device.hpp"

namespace mla::cuda::skew {

// The rates of an SM's first and second CTAs (session 21: 1.078-1.09 apart at B64, A, B).
inline constexpr int kSkewFirst = 27, kSkewSecond = 25;

// Whole units (chunk_align keys) of a pair's `units` the first CTA takes: the L that minimizes the
// pair's time max(L / first, (units - L) / second), the smaller L on a tie.
MLA_HD int64_t first_units(int64_t units) {
  const int64_t l0 = units * kSkewFirst / (kSkewFirst + kSkewSecond);
  auto span = [&](int64_t l) {
    const int64_t a = l * kSkewSecond, b = (units - l) * kSkewFirst;
    return a > b ? a : b;
  };
  return l0 + 1 <= units && span(l0 + 1) < span(l0) ? l0 + 1 : l0;
}

// Keys [begin, end) of split `split` of a request with n_local keys over `splits` (even) splits:
// chunks as KeyStream's unskewed ones (ceil(n / splits) rounded up to chunk_align), the pair
// (2k, 2k + 1) covering chunks 2k and 2k + 1 and divided by first_units.
struct Range {
  int64_t begin, end;
};
MLA_HD Range split_range(int64_t n_local, int splits, int split, int chunk_align) {
  const int64_t chunk = ((n_local + splits - 1) / splits + chunk_align - 1) / chunk_align * chunk_align;
  const int64_t pair_begin = n_local < int64_t(split & ~1) * chunk ? n_local : int64_t(split & ~1) * chunk;
  const int64_t pair_end = n_local < pair_begin + 2 * chunk ? n_local : pair_begin + 2 * chunk;
  const int64_t units = (pair_end - pair_begin + chunk_align - 1) / chunk_align;
  const int64_t cut_keys = pair_begin + first_units(units) * chunk_align;
  const int64_t cut = cut_keys < pair_end ? cut_keys : pair_end;
  return (split & 1) == 0 ? Range{pair_begin, cut} : Range{cut, pair_end};
}

// What CTA x of a grid of `ctas` (= works x m_tiles, works = batch x splits, splits even) serves:
// work = request x splits + split and its row tile. The first half of the grid takes the even splits
// (pair index u / m_tiles, row tile u % m_tiles for u = x), the second half the odd ones of the same
// pairs (u = x - ctas / 2), so each pair's row tiles stay adjacent within a half (L2 sharing, as
// attend_launch_grid's order) and the first half is placed first where ctas / 2 <= the SM count.
struct Cta {
  int work, m_tile;
};
MLA_HD Cta cta_of(int x, int ctas, int m_tiles) {
  const int half = ctas / 2, second = x >= half ? 1 : 0;
  const int u = x - second * half;
  const int pair = u / m_tiles;
  return {2 * pair + second, u - pair * m_tiles};
}
// The same with u / m_tiles by the host's multiply-shift (fast_div.hpp; the FastDivs instance).
MLA_HD Cta cta_of_fast(int x, int ctas, int m_tiles, uint64_t m_tiles_magic) {
  const int half = ctas / 2, second = x >= half ? 1 : 0;
  const int u = x - second * half;
  const int pair = fast_div(u, m_tiles_magic);
  return {2 * pair + second, u - pair * m_tiles};
}

// Where the skew applies to a fixed-split launch of `ctas` CTAs on `sms` SMs: splits even, and the
// grid at most two CTAs an SM (so its first half is placed first) and more than one (else no SM
// holds two).
MLA_HD bool applies(int splits, int64_t ctas, int sms) {
  return sms > 0 && splits >= 2 && splits % 2 == 0 && ctas > sms && ctas <= 2 * int64_t(sms);
}

}  // namespace mla::cuda::skew
