// The flat plan's arithmetic (src/cuda/flat_plan.hpp), the same functions the wgmma attend kernel
// runs, checked on the host (no GPU needed) over random and extreme batches: every key tile of
// every request is served exactly once and in order, segment partials are unique and inside the
// workspace the backend sizes ((CTAs + B) partials), each request's partials are the consecutive
// run [first, first + count) its opening CTA records, and a count never exceeds CTAs + 1 (post's
// bound). The kernel itself is checked against the CPU backend by the GPU tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "cuda/flat_plan.hpp"
#include "cuda/stages.hpp"
#include "gpu/gpu_test_util.hpp"

namespace mla {
namespace {

namespace flat = cuda::flat;
constexpr int kTile = 64;

struct Recorded {
  int opens = 0;
  int64_t first = -1;
  int32_t count = -1;
  std::vector<int64_t> partials;  // in the order of the CTAs that wrote them
  int32_t next_tile = 0;          // tiles served so far, in order
};

// Enumerates every key-CTA's segments exactly as the kernel's loop does and checks the invariants.
void check_plan(const std::vector<int32_t>& lens, int qlen, int ctas) {
  SCOPED_TRACE(::testing::Message() << "B " << lens.size() << ", qlen " << qlen << ", CTAs " << ctas);
  const int batch = int(lens.size());
  std::vector<int32_t> starts(size_t(batch) + 1, 0);
  for (int b = 0; b < batch; ++b)
    starts[size_t(b) + 1] = starts[size_t(b)] + flat::request_tiles(lens[size_t(b)], qlen, kTile);
  std::vector<Recorded> rec(static_cast<size_t>(batch));
  std::set<int64_t> used;
  for (int c = 0; c < ctas; ++c) {
    const flat::Cta range = flat::cta_range(starts.data(), batch, ctas, c);
    ASSERT_GE(range.per_cta, cuda::kMinFlatTiles);
    for (int b = flat::next_request(starts.data(), batch, flat::first_request(starts.data(), batch, range), range);
         b >= 0; b = flat::next_request(starts.data(), batch, b + 1, range)) {
      Recorded& r = rec[size_t(b)];
      const int32_t first = flat::segment_first(starts.data(), b, range);
      const int32_t last = flat::segment_last(starts.data(), b, range);
      ASSERT_LT(first, last) << "request " << b << " CTA " << c << ": an empty segment";
      ASSERT_EQ(first, r.next_tile) << "request " << b << " CTA " << c << ": tiles skipped or served twice";
      r.next_tile = last;
      const int64_t part = flat::partial(c, b);
      ASSERT_TRUE(used.insert(part).second) << "partial " << part << " written twice";
      ASSERT_LT(part, int64_t(ctas) + batch) << "partial outside the workspace";
      r.partials.push_back(part);
      if (flat::opens(starts.data(), b, range)) {
        ++r.opens;
        r.first = part;
        r.count = flat::partial_count(starts.data(), b, range, c);
      }
    }
  }
  for (int b = 0; b < batch; ++b) {
    const Recorded& r = rec[size_t(b)];
    const int32_t tiles = starts[size_t(b) + 1] - starts[size_t(b)];
    ASSERT_EQ(r.next_tile, tiles) << "request " << b << ": not every tile served";
    if (tiles == 0) {
      EXPECT_EQ(r.opens, 0) << "request " << b;  // CTA 0 records a count of 0 for it
      continue;
    }
    ASSERT_EQ(r.opens, 1) << "request " << b << ": opened by " << r.opens << " CTAs";
    ASSERT_EQ(r.count, int32_t(r.partials.size())) << "request " << b;
    ASSERT_LE(r.count, ctas + 1) << "request " << b;
    for (int32_t i = 0; i < r.count; ++i) ASSERT_EQ(r.partials[size_t(i)], r.first + i) << "request " << b;
  }
}

TEST(FlatPlan, EveryTileOnceAndPartialsConsecutive) {
  check_plan({8192, 8192, 8192}, 1, 264);         // even, fewer tiles than CTAs x 2
  check_plan(std::vector<int32_t>(64, 8192), 1, 264);  // issue 4's B64: 32 tiles a CTA
  check_plan(std::vector<int32_t>(64, 16384), 1, 264);  // segments cross requests
  check_plan({131072, 1, 0, 1}, 1, 264);          // one long request among tiny and empty ones
  check_plan({0, 0, 0}, 1, 264);                  // nothing to serve
  check_plan({3, 1, 2}, 4, 88);                   // lengths under qlen: invalid, no tiles
  check_plan({65, 64, 63, 1}, 1, 1);              // one CTA serves everything
  check_plan(std::vector<int32_t>(1000, 100), 1, 264);  // more requests than CTAs
  // The default's even batches (attend_flat_key_ctas, MLA_ATTEND_FLAT=fill): one wave at B = 150, whole waves
  // capped by post's partials at B = 300, two waves of 64-row CTAs at B = 100 x 128 heads
  check_plan(std::vector<int32_t>(150, 4096), 1, 264);
  check_plan(std::vector<int32_t>(300, 4096), 1, cuda::kMaxPostPartials - 1);
  check_plan(std::vector<int32_t>(100, 8192), 1, 132);
  std::mt19937 rng(7);
  for (int k = 0; k < 300; ++k) {
    const int batch = 1 + int(rng() % 300), qlen = 1 + int(rng() % 8), ctas = 1 + int(rng() % 511);
    const int longest = 1 + int(rng() % 40000);
    std::vector<int32_t> lens(static_cast<size_t>(batch));
    for (int32_t& len : lens) len = rng() % 10 == 0 ? 0 : int32_t(rng() % uint32_t(longest));
    check_plan(lens, qlen, ctas);
    if (HasFatalFailure()) return;
  }
}

// The balance the plan exists for: no CTA serves more than K = max(2, ceil(T / CTAs)) tiles,
// whatever the lengths (fixed splits gave the CTA of the longest request its whole chunk).
TEST(FlatPlan, NoCtaServesMoreThanItsShare) {
  std::mt19937 rng(11);
  std::vector<int32_t> lens(64);
  for (int32_t& len : lens) len = 1 + int32_t(rng() % 32768);
  std::vector<int32_t> starts(lens.size() + 1, 0);
  for (size_t b = 0; b < lens.size(); ++b) starts[b + 1] = starts[b] + flat::request_tiles(lens[b], 1, kTile);
  const int ctas = 264;
  const int32_t share = (starts.back() + ctas - 1) / ctas;
  for (int c = 0; c < ctas; ++c) {
    const flat::Cta range = flat::cta_range(starts.data(), int(lens.size()), ctas, c);
    EXPECT_LE(range.end - range.begin, std::max(share, cuda::kMinFlatTiles)) << "CTA " << c;
  }
}

// The 16-row kernel's range (cta_range_fast, s23a: T / CTAs by a multiply-shift where exact, else
// the division) is cta_range's for every CTA, over small and huge tile totals (the fallback past
// x CTAs >= 2^32) and CTA counts.
TEST(FlatPlan, FastRangeMatchesTheDivision) {
  std::mt19937 rng(5);
  for (const int ctas : {1, 2, 3, 7, 132, 256, 264, 528, 1000, 4095}) {
    const uint64_t magic = cuda::div_magic(uint32_t(ctas));
    for (int trial = 0; trial < 200; ++trial) {
      const int32_t total = trial < 100 ? int32_t(rng() % 100000) : int32_t(rng() % uint32_t(INT32_MAX - 8192));
      const int32_t starts[2] = {0, total};
      for (const int c : {0, 1, ctas / 2, ctas - 1}) {
        const flat::Cta a = flat::cta_range(starts, 1, ctas, c), b = flat::cta_range_fast(starts, 1, ctas, c, magic);
        ASSERT_EQ(a.per_cta, b.per_cta) << "total " << total << ", CTAs " << ctas;
        ASSERT_EQ(a.begin, b.begin);
        ASSERT_EQ(a.end, b.end);
      }
    }
  }
}

// The many-rows kernel's choice between fixed splits and the flat plan (flat::lengths_even).
TEST(FlatPlan, EvenLengthsWithinAnEighth) {
  const std::vector<int32_t> even{8192, 8192, 8192}, near{8192, 7168, 8000}, apart{8192, 7167, 8000};
  EXPECT_TRUE(flat::lengths_even(even.data(), 3));
  EXPECT_TRUE(flat::lengths_even(near.data(), 3));    // 1024 * 8 <= 8192
  EXPECT_FALSE(flat::lengths_even(apart.data(), 3));  // 1025 * 8 > 8192
  EXPECT_FALSE(flat::lengths_even(even.data(), 0));   // unknown lengths: the flat plan
  const std::vector<int32_t> empty_and_long{0, 32768};
  EXPECT_FALSE(flat::lengths_even(empty_and_long.data(), 2));
  const std::vector<int32_t> one{5};
  EXPECT_TRUE(flat::lengths_even(one.data(), 1));
}

// The default rule for even batches (attend_fixed_fills_its_waves, MLA_ATTEND_FLAT=fill): fixed
// splits are kept where they fill 2/3 of their waves' slots (16-row kernel) or 85% (many-rows). The
// 16-row kernel at 12-16 heads (one row tile a request, 264 slots on 132 SMs), with the planner's
// split count floor(slots / B): the B = 64 and 128 keep them, and B = 100 (2 splits, 200
// CTAs: slower on the flat plan, H100 session 37); 150 (one, 150) and 300 (one, 300: two waves) take
// the flat plan. The many-rows kernel (132 slots): D (B = 64 x two 64-row CTAs) keeps them, B = 100
// (200 CTAs, 76%) and 67 (134, 51%) do not.
TEST(FlatPlan, FixedSplitsThatFillTheirWaves) {
  constexpr int kSlots = 264;
  auto fixed_ctas = [](int batch) { return int64_t(batch) * std::max(1, kSlots / batch); };
  auto sixteen = [](int64_t ctas) { return cuda::attend_fixed_fills_its_waves(ctas, kSlots, false); };
  EXPECT_TRUE(sixteen(fixed_ctas(64)));    // 256: A, B64
  EXPECT_TRUE(sixteen(fixed_ctas(128)));   // 256: B, C
  EXPECT_TRUE(sixteen(fixed_ctas(80)));    // 240: 91%
  EXPECT_TRUE(sixteen(fixed_ctas(100)));   // 200: 76%
  EXPECT_TRUE(sixteen(fixed_ctas(200)));   // 200: 76%
  EXPECT_FALSE(sixteen(fixed_ctas(150)));  // 150: 57%
  EXPECT_FALSE(sixteen(fixed_ctas(300)));  // 300 of 528: 57%
  EXPECT_TRUE(sixteen(fixed_ctas(500)));   // 500 of 528: 95%
  EXPECT_TRUE(sixteen(176));               // 2/3 exactly
  EXPECT_FALSE(sixteen(175));              // 66.3%
  EXPECT_TRUE(cuda::attend_fixed_fills_its_waves(128, 132, true));   // D: 64 x 2
  EXPECT_FALSE(cuda::attend_fixed_fills_its_waves(200, 132, true));  // 100 x 2: 76%
  EXPECT_FALSE(cuda::attend_fixed_fills_its_waves(134, 132, true));  // 67 x 2: 51%
  EXPECT_TRUE(cuda::attend_fixed_fills_its_waves(113, 132, true));   // 85.6%
  EXPECT_FALSE(cuda::attend_fixed_fills_its_waves(112, 132, true));  // 84.8%
}

// s38a (the default since session 39): the 16-row kernel's share from the memory bandwidth, 0 (the
// exact 2/3 rule, as under MLA_ATTEND_FILL_BW=0) on an H100 SXM, 810 per mille on an H200; then B =
// 70, 100 and 200 at 12 heads (210 and 200 of 264 slots) take the flat plan, B = 56 (224: 85%), A and
// B64 (256: 97%) keep their fixed splits.
TEST(FlatPlan, FillFromBandwidth) {
  EXPECT_EQ(cuda::attend_fill_per_mille(2.0 * 2619e3 * 1e3 * 5120 / 8 / 1e9, 132), 0);  // H100 SXM: 55%: 2/3
  EXPECT_EQ(cuda::attend_fill_per_mille(2.0 * 3201e3 * 1e3 * 6144 / 8 / 1e9, 132), 810);  // H200: 81%
  EXPECT_EQ(cuda::attend_fill_per_mille(4500, 132), 741);                                  // 0.87 x 4500 / 5280
  EXPECT_EQ(cuda::attend_fill_per_mille(4000, 132), 0);                                    // 65.9%: 2/3
  EXPECT_EQ(cuda::attend_fill_per_mille(1000, 0), 850);                                    // (no SM count: the cap)
  EXPECT_FALSE(cuda::attend_fixed_fills_its_waves(200, 264, false, 810));  // B = 100 x 2 splits
  EXPECT_FALSE(cuda::attend_fixed_fills_its_waves(210, 264, false, 810));  // B = 70 x 3
  EXPECT_TRUE(cuda::attend_fixed_fills_its_waves(224, 264, false, 810));   // B = 56 x 4
  EXPECT_TRUE(cuda::attend_fixed_fills_its_waves(256, 264, false, 810));   // A, B64
  EXPECT_TRUE(cuda::attend_fixed_fills_its_waves(214, 264, false, 810));   // 81.06%
  EXPECT_FALSE(cuda::attend_fixed_fills_its_waves(213, 264, false, 810));  // 80.68%
  EXPECT_TRUE(cuda::attend_fixed_fills_its_waves(176, 264, false, 0));     // (the H100's: 2/3 exactly, as without)
  EXPECT_FALSE(cuda::attend_fixed_fills_its_waves(175, 264, false, 0));
  EXPECT_FALSE(cuda::attend_fixed_fills_its_waves(112, 132, true, 500));   // (the many-rows kernel keeps 85%)
}

// The flat plan's key-CTAs: under MLA_ATTEND_FLAT=uneven a wave's slots or one a request, whichever
// is more; by default (=fill) the fewest whole waves with one a request; never past post's partials.
TEST(FlatPlan, KeyCtasMakeWholeWaves) {
  EXPECT_EQ(cuda::attend_flat_key_ctas(64, 1, 264, false), 264);
  EXPECT_EQ(cuda::attend_flat_key_ctas(64, 1, 264, true), 264);
  EXPECT_EQ(cuda::attend_flat_key_ctas(150, 1, 264, true), 264);
  EXPECT_EQ(cuda::attend_flat_key_ctas(100, 2, 132, false), 100);  // 200 CTAs: 1.5 waves
  EXPECT_EQ(cuda::attend_flat_key_ctas(100, 2, 132, true), 132);   // 264 CTAs: 2 waves
  EXPECT_EQ(cuda::attend_flat_key_ctas(64, 2, 132, true), 66);
  EXPECT_EQ(cuda::attend_flat_key_ctas(300, 1, 264, false), 300);
  EXPECT_EQ(cuda::attend_flat_key_ctas(300, 1, 264, true), cuda::kMaxPostPartials - 1);  // (528: capped)
  EXPECT_EQ(cuda::attend_flat_key_ctas(5, 8, 264, true), 33);
}

// Even batches that fill their waves poorly: one request past half a wave of 16-row slots (B = SMs
// + 1 at 12 heads: one split each, ~50% of the slots) and of 64-row ones (B = SMs / 2 + 1 at 128
// heads: two waves, the second ~2 CTAs). The flat plan by default (=fill), fixed splits under
// MLA_ATTEND_FLAT=uneven and 0 (=all: the flat plan for the 16-row one only); the step matches the
// CPU's either way.
TEST(FlatPlan, PoorlyFilledEvenBatchStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the flat plan's step");
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const char* env = std::getenv("MLA_ATTEND_FLAT");
  const std::string mode = env ? env : "";
  for (const bool many : {false, true}) {
    SCOPED_TRACE(std::string(many ? "64-row" : "16-row") + " CTAs, MLA_ATTEND_FLAT=" + mode);
    const testing::Shape shape = many ? testing::Shape{"deepseek-v3", 128, 1, sms / 2 + 1, 16, 300, false}
                                      : testing::Shape{"kimi-k3", 12, 1, sms + 1, 16, 320, false};
    std::optional<bool> flat;  // (fixed splits for an even batch under uneven and 0)
    if (!testing::attend_rerouted()) flat = mode.empty() || mode == "fill" || (mode == "all" && !many);
    testing::steps_match_cpu({shape}, DType::fp8_e4m3, DType::fp8_e4m3, 3700,
                             many ? testing::RowsKernel::kMany : testing::RowsKernel::kSixteen,
                             {.spread = 8, .flat = flat});
  }
}

// An even batch whose two fixed splits a request fill ~76% of the 16-row slots (B = 100 on 132 SMs):
// at page 16 the flat plan where the device's bandwidth raises the share past 2/3 (an H200: 81%; an
// H100 keeps 2/3 and fixed splits), fixed splits under MLA_ATTEND_FILL_BW=0, the flat plan under
// MLA_ATTEND_FLAT=all; at page 1 (the row copies) fixed splits but under =all.
TEST(FlatPlan, FillFromBandwidthStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the bandwidth's fill rule's step");
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int batch = 2 * sms * 38 / 100;  // two splits a request (lengths 280-320): 76% of 2 sms slots
  const char* env = std::getenv("MLA_ATTEND_FLAT");
  const std::string mode = env ? env : "";
  const int per_mille = cuda::attend_fill_per_mille(cuda::device_peak_gbps(0), sms);
  SCOPED_TRACE("B = " + std::to_string(batch) + ", MLA_ATTEND_FLAT=" + mode + ", the device's share " +
               std::to_string(per_mille) + " per mille");
  const bool fill = mode.empty() || mode == "fill";
  for (const int page : {16, 1}) {
    SCOPED_TRACE("page " + std::to_string(page));
    std::optional<bool> flat;
    if (!testing::attend_rerouted() && page == 16)
      flat = mode == "all" || (fill && cuda::attend_fill_from_bandwidth() && per_mille > 0 &&
                               !cuda::attend_fixed_fills_its_waves(2 * int64_t(batch), 2 * sms, false, per_mille));
    if (!testing::attend_rerouted() && page == 1 && fill) flat = false;  // (=all: flat where row copies, unchecked)
    testing::steps_match_cpu({{"kimi-k3", 12, 1, batch, page, 320, false}}, DType::fp8_e4m3, DType::fp8_e4m3,
                             3710 + page, testing::RowsKernel::kSixteen, {.spread = 8, .flat = flat});
  }
}

}  // namespace
}  // namespace mla
