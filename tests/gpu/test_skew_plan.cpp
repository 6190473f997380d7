// The skewed fixed splits' arithmetic (src/cuda/skew_plan.hpp, s33a), the same functions the 16-row
// wgmma kernel runs under MLA_ATTEND_SKEW=1, checked on the host (no GPU needed): the grid maps one
// to one onto (work, row tile) with the even splits in its first half, each pair of splits covers
// exactly the keys of the unskewed pair, in whole units, contiguously and in order, and the first
// CTA's share is the best whole number for the two rates. The kernel itself is checked against the
// CPU backend by the GPU tests under the switch (scripts/device-check skew).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/fast_div.hpp"
#include "cuda/skew_plan.hpp"

namespace mla {
namespace {

namespace skew = cuda::skew;

TEST(SkewPlan, GridMapsOneToOneWithTheEvenSplitsFirst) {
  for (int batch : {1, 2, 3, 7, 64, 128})
    for (int splits : {2, 4, 6, 8, 256})
      for (int m_tiles : {1, 2, 3, 8}) {
        const int works = batch * splits, ctas = works * m_tiles;
        SCOPED_TRACE(::testing::Message() << "B " << batch << ", splits " << splits << ", m_tiles " << m_tiles);
        std::vector<int> seen(size_t(ctas), 0);
        const uint64_t magic = cuda::div_magic(uint32_t(m_tiles));
        for (int x = 0; x < ctas; ++x) {
          const skew::Cta c = skew::cta_of(x, ctas, m_tiles), f = skew::cta_of_fast(x, ctas, m_tiles, magic);
          ASSERT_EQ(c.work, f.work) << "x " << x;
          ASSERT_EQ(c.m_tile, f.m_tile) << "x " << x;
          ASSERT_GE(c.work, 0);
          ASSERT_LT(c.work, works);
          ASSERT_GE(c.m_tile, 0);
          ASSERT_LT(c.m_tile, m_tiles);
          ASSERT_EQ(c.work % splits % 2 == 0, x < ctas / 2) << "x " << x << ": the even splits fill the first half";
          ++seen[size_t(c.work) * m_tiles + c.m_tile];
          if (x > 0 && x != ctas / 2) {  // a pair's row tiles adjacent within a half
            const skew::Cta prev = skew::cta_of(x - 1, ctas, m_tiles);
            if (c.m_tile > 0) ASSERT_EQ(prev.work, c.work) << "x " << x;
          }
        }
        for (int i = 0; i < ctas; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "(work, row tile) " << i;
      }
}

// The unskewed chunking of KeyStream::split_range.
skew::Range plain_range(int64_t n, int splits, int split, int align) {
  const int64_t chunk = ((n + splits - 1) / splits + align - 1) / align * align;
  const int64_t begin = std::min(n, int64_t(split) * chunk);
  return {begin, std::min(n, begin + chunk)};
}

void check_ranges(int64_t n, int splits, int align) {
  SCOPED_TRACE(::testing::Message() << "n " << n << ", splits " << splits << ", align " << align);
  int64_t next = 0;
  for (int s = 0; s < splits; ++s) {
    const skew::Range r = skew::split_range(n, splits, s, align);
    ASSERT_EQ(r.begin, next) << "split " << s << ": keys skipped or served twice";
    ASSERT_LE(r.begin, r.end) << "split " << s;
    ASSERT_TRUE(r.begin % align == 0 || r.begin == n) << "split " << s << " begins inside a unit: " << r.begin;
    next = r.end;
    if (s % 2 == 1) {  // the pair covers the unskewed pair's keys, the first CTA at least half of them
      const skew::Range even = skew::split_range(n, splits, s - 1, align);
      ASSERT_EQ(even.begin, plain_range(n, splits, s - 1, align).begin) << "split " << s - 1;
      ASSERT_EQ(r.end, plain_range(n, splits, s, align).end) << "split " << s;
      ASSERT_GE(even.end - even.begin + align - 1, r.end - r.begin) << "split " << s - 1 << " takes less";
    }
  }
  ASSERT_EQ(next, n) << "the splits end before the request";
}

TEST(SkewPlan, PairsCoverTheirKeysOnceInWholeUnits) {
  for (int64_t n : {0, 1, 63, 64, 65, 127, 1000, 4096, 8192, 16384, 131072, 1 << 30})
    for (int splits : {2, 4, 6, 8, 42, 256})
      for (int align : {1, 64, 128}) check_ranges(n, splits, align);
  std::mt19937 rng(33);
  for (int i = 0; i < 2000; ++i) {
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 1 << 20)(rng);
    const int splits = 2 * std::uniform_int_distribution<int>(1, 128)(rng);
    check_ranges(n, splits, std::uniform_int_distribution<int>(0, 1)(rng) ? 64 : 1);
  }
}

TEST(SkewPlan, FirstShareIsTheBestWholeNumber) {
  // Time of a pair with L of its units on the first CTA (rate kSkewFirst) and the rest on the
  // second (kSkewSecond), both scaled by kSkewFirst * kSkewSecond.
  auto span = [](int64_t units, int64_t l) {
    return std::max(l * skew::kSkewSecond, (units - l) * skew::kSkewFirst);
  };
  for (int64_t units = 0; units <= 5000; ++units) {
    const int64_t l = skew::first_units(units);
    ASSERT_GE(l, 0);
    ASSERT_LE(l, units);
    for (int64_t other = 0; other <= units; ++other)
      ASSERT_LE(span(units, l), span(units, other)) << units << " units: " << l << " vs " << other;
    ASSERT_GE(l, units - l) << units << " units: the first CTA takes the larger share";
  }
  // B64's pairs (ctx 8192, 4 splits: 32 tiles) and B's (ctx 16384, 2 splits: 256 tiles).
  EXPECT_EQ(skew::first_units(32), 17);
  EXPECT_EQ(skew::first_units(256), 133);
}

TEST(SkewPlan, AppliesToOneOrTwoCtasAnSm) {
  EXPECT_TRUE(skew::applies(4, 256, 132));    // B64, A: 64 x 4 splits
  EXPECT_TRUE(skew::applies(2, 256, 132));    // B, C: 128 x 2
  EXPECT_FALSE(skew::applies(43, 43, 132));   // B = 1: odd splits, under an SM each
  EXPECT_FALSE(skew::applies(3, 192, 132));   // odd splits
  EXPECT_FALSE(skew::applies(2, 132, 132));   // one CTA an SM: no SM holds two
  EXPECT_FALSE(skew::applies(4, 268, 132));   // past two an SM: the first half is not all placed first
  EXPECT_FALSE(skew::applies(2, 256, 0));     // off
}

}  // namespace
}  // namespace mla
