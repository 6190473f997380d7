// The synthetic step generator and the block-table helper: page tables that cover every request,
// rows stored by position under DCP, NaN where nothing is stored.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "core/synthetic.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "mla/step.hpp"
#include "support/testing.hpp"

namespace {

using mla::DType;
using mla::synth::Scenario;
using mla::synth::ScenarioSpec;

// SPEC.md's DCP formulas, written out here independently of the code under test.
int owner_of(int64_t p, const mla::DcpInfo& d) { return int((p / d.interleave) % d.size); }
int64_t local_index_of(int64_t p, const mla::DcpInfo& d) {
  return (p / (int64_t(d.interleave) * d.size)) * d.interleave + p % d.interleave;
}

// Raw bytes of the cache row at `slot`.
const uint8_t* row_bytes(const Scenario& sc, int64_t slot) {
  const int64_t row_bytes = sc.spec.cfg.row_dim() * int64_t(mla::dtype_size(sc.spec.kv_dtype));
  return static_cast<const uint8_t*>(sc.cache.data()) + slot * row_bytes;
}

// Counts NaN and non-NaN values of one row.
std::pair<int, int> nan_count(const Scenario& sc, int64_t slot) {
  const mla::TensorView& c = sc.cache.view();
  int nan = 0, finite = 0;
  const int64_t base = slot * sc.spec.cfg.row_dim();
  for (int64_t k = 0; k < sc.spec.cfg.row_dim(); ++k) {
    const double x = mla::testing::element(c, base + k);
    std::isnan(x) ? ++nan : ++finite;
  }
  return {nan, finite};
}

ScenarioSpec base_spec(uint64_t seed) {
  ScenarioSpec s;
  s.cfg = mla::testing::small_config("kimi-k3", mla::GateLayout::merged, 2);
  s.seq_lens = {0, 1, 5, 17, 64, 65, 200, 3, 0, 130};
  s.qlen = 3;  // seq_lens of 1 is invalid with qlen 3: fixed per test
  s.page_size = 16;
  s.seed = seed;
  return s;
}

TEST(Synthetic, PageTableCoversEveryRequestWithDistinctPagesAndSpares) {
  for (int page_size : {1, 16, 64}) {
    ScenarioSpec s = base_spec(11 + page_size);
    s.qlen = 1;
    s.page_size = page_size;
    s.spare_pages = 3;
    const Scenario sc = mla::synth::make_scenario(s, 0.05f);
    SCOPED_TRACE(page_size);
    const auto* indptr = sc.kv_indptr.ptr<int32_t>();
    const auto* indices = sc.kv_indices.ptr<int32_t>();
    ASSERT_EQ(sc.kv_indptr.view().shape[0], int64_t(s.seq_lens.size()) + 1);
    EXPECT_EQ(indptr[0], 0);
    std::set<int32_t> used;
    for (size_t b = 0; b < s.seq_lens.size(); ++b) {
      const int32_t pages = indptr[b + 1] - indptr[b];
      EXPECT_EQ(pages, (s.seq_lens[b] + page_size - 1) / page_size) << "request " << b;
      for (int32_t k = indptr[b]; k < indptr[b + 1]; ++k) used.insert(indices[k]);
    }
    EXPECT_EQ(int64_t(used.size()), int64_t(indptr[s.seq_lens.size()])) << "a page is used twice";
    const mla::TensorView& cache = sc.cache.view();
    EXPECT_EQ(cache.shape[0], int64_t(used.size()) + s.spare_pages);
    EXPECT_EQ(cache.shape[1], page_size);
    EXPECT_EQ(cache.shape[2], 576);
    EXPECT_EQ(cache.dtype, DType::fp8_e4m3);
    // Spare pages hold NaN only.
    for (int32_t page = 0; page < cache.shape[0]; ++page) {
      if (used.count(page)) continue;
      for (int r = 0; r < page_size; ++r) EXPECT_EQ(nan_count(sc, int64_t(page) * page_size + r).second, 0);
    }
  }
}

TEST(Synthetic, ShuffledPageTableIsAPermutationNotTheIdentity) {
  ScenarioSpec s = base_spec(5);
  s.qlen = 1;
  s.page_size = 1;
  s.seq_lens = {300, 200};
  const Scenario sc = mla::synth::make_scenario(s, 0.05f);
  const auto* indices = sc.kv_indices.ptr<int32_t>();
  int in_place = 0;
  for (int k = 0; k < 500; ++k) in_place += indices[k] == k;
  EXPECT_LT(in_place, 20);
  s.shuffle_pages = false;
  const Scenario ordered = mla::synth::make_scenario(s, 0.05f);
  for (int k = 0; k < 500; ++k) ASSERT_EQ(ordered.kv_indices.ptr<int32_t>()[k], k);
}

// Every rank's cache holds exactly the rows of the positions it owns: history rows finite and equal
// to the W = 1 scenario's row of the same position, this step's rows, page tails and spare pages
// NaN; slot_mapping points at the row of each owned new token and is -1 elsewhere.
TEST(Synthetic, RowsAreStoredByPositionUnderDcp) {
  for (auto [w, interleave, qlen, page_size] :
       {std::tuple{1, 1, 1, 16}, std::tuple{2, 1, 4, 16}, std::tuple{4, 16, 8, 1}, std::tuple{8, 1, 3, 64},
        std::tuple{2, 64, 2, 16}, std::tuple{4, 3, 5, 7}}) {
    ScenarioSpec s = base_spec(100 + w * 7 + interleave);
    s.qlen = qlen;
    s.page_size = page_size;
    s.seq_lens = {0, qlen, qlen + 1, 17, 64, 65, 200, 0, 130};
    s.kv_dtype = w % 4 == 0 ? DType::bf16 : DType::fp8_e4m3;
    const Scenario whole = mla::synth::make_scenario(s, 0.05f);  // W = 1: every position
    std::vector<int64_t> held(s.seq_lens.size(), 0);
    for (int rank = 0; rank < w; ++rank) {
      SCOPED_TRACE(testing::Message() << "W=" << w << " I=" << interleave << " rank=" << rank << " Q=" << qlen
                                      << " page=" << page_size);
      ScenarioSpec rs = s;
      rs.dcp = {.size = w, .rank = rank, .interleave = interleave};
      const Scenario sc = mla::synth::make_scenario(rs, 0.05f);
      const auto* indptr = sc.kv_indptr.ptr<int32_t>();
      const auto* indices = sc.kv_indices.ptr<int32_t>();
      const auto* slots = sc.slot_mapping.ptr<int64_t>();
      const auto* whole_indices = whole.kv_indices.ptr<int32_t>();
      const auto* whole_indptr = whole.kv_indptr.ptr<int32_t>();
      const size_t row_size = 576 * mla::dtype_size(s.kv_dtype);
      for (size_t b = 0; b < s.seq_lens.size(); ++b) {
        const int64_t len = s.seq_lens[b];
        // Walk the request's global positions; those of this rank must appear at their local index.
        int64_t local = 0;
        for (int64_t p = 0; p < len; ++p) {
          if (owner_of(p, rs.dcp) != rank) continue;
          const int64_t j = local_index_of(p, rs.dcp);
          ASSERT_EQ(j, local) << "local indices follow position order";
          ++local;
          const int64_t slot = int64_t(indices[indptr[b] + j / page_size]) * page_size + j % page_size;
          const auto [nan, finite] = nan_count(sc, slot);
          if (p < len - qlen) {
            EXPECT_EQ(nan, 0) << "history row of request " << b << " position " << p;
            const int64_t whole_slot =
                int64_t(whole_indices[whole_indptr[b] + p / page_size]) * page_size + p % page_size;
            EXPECT_EQ(std::memcmp(row_bytes(sc, slot), row_bytes(whole, whole_slot), row_size), 0)
                << "request " << b << " position " << p << " differs from the W = 1 row";
          } else {
            EXPECT_EQ(finite, 0) << "this step's row of request " << b << " position " << p;
            EXPECT_EQ(slots[b * qlen + (p - (len - qlen))], slot) << "request " << b << " position " << p;
          }
        }
        held[b] += local;
        EXPECT_GE(int64_t(indptr[b + 1] - indptr[b]) * page_size, local);
        EXPECT_LT(int64_t(indptr[b + 1] - indptr[b] - 1) * page_size, std::max<int64_t>(local, 1));
        // Page tail beyond the local length: NaN.
        for (int64_t j = local; j < int64_t(indptr[b + 1] - indptr[b]) * page_size; ++j) {
          const int64_t slot = int64_t(indices[indptr[b] + j / page_size]) * page_size + j % page_size;
          EXPECT_EQ(nan_count(sc, slot).second, 0) << "page tail of request " << b << " local " << j;
        }
        // New tokens this rank does not own (or of an empty request) have slot -1.
        for (int i = 0; i < qlen; ++i) {
          const int64_t p = len - qlen + i;
          if (len == 0 || owner_of(p, rs.dcp) != rank) {
            EXPECT_EQ(slots[b * qlen + i], -1) << b << "," << i;
          }
        }
      }
    }
    for (size_t b = 0; b < s.seq_lens.size(); ++b) EXPECT_EQ(held[b], s.seq_lens[b]) << "request " << b;
  }
}

TEST(Synthetic, HistoryRowsAreUnitScaleAndQuantizedWithKScale) {
  ScenarioSpec s = base_spec(3);
  s.qlen = 1;
  s.seq_lens = {400, 300};
  s.spare_pages = 0;
  s.page_size = 1;
  const float k_scale = 0.0173f;
  const Scenario fp8 = mla::synth::make_scenario(s, k_scale);
  s.kv_dtype = DType::bf16;
  const Scenario bf16 = mla::synth::make_scenario(s, k_scale);
  for (const Scenario* sc : {&fp8, &bf16}) {
    const double scale = sc->spec.kv_dtype == DType::fp8_e4m3 ? k_scale : 1.0;
    double sum = 0, sum2 = 0;
    int64_t n = 0;
    const std::vector<double> v = mla::testing::to_doubles(sc->cache.view());
    for (double x : v) {
      if (std::isnan(x)) continue;
      sum += x * scale;
      sum2 += x * scale * x * scale;
      ++n;
    }
    EXPECT_EQ(n, int64_t(698) * 576);  // every row but the step's two
    const double mean = sum / n, var = sum2 / n - mean * mean;
    EXPECT_NEAR(mean, 0.0, 0.02);
    EXPECT_NEAR(var, 1.0, 0.1);
  }
}

TEST(Synthetic, HiddenRowsHaveUnitRms) {
  ScenarioSpec s = base_spec(9);
  s.qlen = 2;
  s.seq_lens = {2, 0, 50};
  const Scenario sc = mla::synth::make_scenario(s, 0.05f);
  const mla::TensorView& h = sc.hidden.view();
  ASSERT_EQ(h.shape[0], 6);
  ASSERT_EQ(h.shape[1], s.cfg.hidden);
  EXPECT_EQ(h.dtype, DType::bf16);
  std::set<double> firsts;
  for (int64_t r = 0; r < 6; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < h.shape[1]; ++c) {
      const double x = mla::testing::element(h, r * h.shape[1] + c);
      ss += x * x;
    }
    EXPECT_NEAR(std::sqrt(ss / double(h.shape[1])), 1.0, 0.01) << "row " << r;
    firsts.insert(mla::testing::element(h, r * h.shape[1]));
  }
  EXPECT_GT(firsts.size(), 3u) << "rows should differ";
}

TEST(Synthetic, DeterministicPerSeedAndMetaViewsMatch) {
  ScenarioSpec s = base_spec(21);
  s.qlen = 1;
  const Scenario a = mla::synth::make_scenario(s, 0.05f);
  const Scenario b = mla::synth::make_scenario(s, 0.05f);
  EXPECT_EQ(mla::testing::snapshot(a.cache.view()), mla::testing::snapshot(b.cache.view()));
  EXPECT_EQ(mla::testing::snapshot(a.hidden.view()), mla::testing::snapshot(b.hidden.view()));
  s.seed = 22;
  const Scenario c = mla::synth::make_scenario(s, 0.05f);
  EXPECT_NE(mla::testing::snapshot(a.hidden.view()), mla::testing::snapshot(c.hidden.view()));

  const mla::StepMeta meta = a.meta();
  EXPECT_EQ(meta.qlen, 1);
  EXPECT_EQ(meta.batch(), int(s.seq_lens.size()));
  EXPECT_EQ(meta.tokens(), a.tokens());
  EXPECT_EQ(meta.seq_lens.data, a.seq_lens.data());
  EXPECT_EQ(meta.slot_mapping.dtype, DType::i64);
  ASSERT_EQ(meta.seq_lens_host.size(), s.seq_lens.size());
  for (size_t k = 0; k < s.seq_lens.size(); ++k) EXPECT_EQ(meta.seq_lens_host[k], s.seq_lens[k]);
  EXPECT_EQ(a.kv().pages.data, a.cache.data());
  EXPECT_EQ(a.kv().page_size(), s.page_size);
}

TEST(Synthetic, WithoutNanFillUnstoredRowsAreZero) {
  ScenarioSpec s = base_spec(4);
  s.qlen = 1;
  s.nan_fill = false;
  const Scenario sc = mla::synth::make_scenario(s, 0.05f);
  for (double x : mla::testing::to_doubles(sc.cache.view())) ASSERT_FALSE(std::isnan(x));
}

TEST(Synthetic, RejectsBadSpecsByName) {
  ScenarioSpec s = base_spec(1);  // seq_lens[1] = 1 < qlen 3
  EXPECT_NE(mla::testing::error_of([&] { mla::synth::make_scenario(s, 0.05f); }).find("seq_lens[1]"),
            std::string::npos);
  s.qlen = 9;
  EXPECT_NE(mla::testing::error_of([&] { mla::synth::make_scenario(s, 0.05f); }).find("qlen"), std::string::npos);
  s.qlen = 1;
  EXPECT_NE(mla::testing::error_of([&] { mla::synth::make_scenario(s, 0.0f); }).find("k_scale"),
            std::string::npos);
  s.page_size = 0;
  EXPECT_NE(mla::testing::error_of([&] { mla::synth::make_scenario(s, 0.05f); }).find("page_size"),
            std::string::npos);
}

// --- page_table_from_block_table ---------------------------------------------------------------

TEST(PageTable, FromBlockTableTakesTheNeededPagesInOrder) {
  // 3 requests, 4 pages each in the block table; page size 16.
  const std::vector<int32_t> block = {7, 3, 9, -1,  //
                                      -1, -1, -1, -1,  //
                                      2, 5, 1, 0};
  const std::vector<int32_t> lens = {33, 0, 64};
  const mla::PageTable t = mla::page_table_from_block_table(block, 3, 4, lens, 16);
  EXPECT_EQ(t.kv_indptr, (std::vector<int32_t>{0, 3, 3, 7}));
  EXPECT_EQ(t.kv_indices, (std::vector<int32_t>{7, 3, 9, 2, 5, 1, 0}));
  const mla::PageTable one = mla::page_table_from_block_table(block, 3, 4, std::vector<int32_t>{1, 0, 49}, 16);
  EXPECT_EQ(one.kv_indptr, (std::vector<int32_t>{0, 1, 1, 5}));
}

TEST(PageTable, FromBlockTableRejectsBadInputByName) {
  const std::vector<int32_t> block = {7, 3, -1, 2};
  auto err = [&](std::vector<int32_t> lens, int page_size, int max_pages = 2) {
    return mla::testing::error_of(
        [&] { mla::page_table_from_block_table(block, 2, max_pages, lens, page_size); });
  };
  EXPECT_NE(err({33, 1}, 16).find("local_seq_lens[0]"), std::string::npos);  // 3 pages > max_pages 2
  EXPECT_NE(err({1, 1}, 16).find("block_table[1, 0]"), std::string::npos);    // -1 page
  EXPECT_NE(err({-1, 1}, 16).find("local_seq_lens[0]"), std::string::npos);
  EXPECT_NE(err({1, 1}, 0).find("page_size"), std::string::npos);
  EXPECT_NE(err({1}, 16).find("local_seq_lens"), std::string::npos);
  EXPECT_NE(err({1, 1}, 16, 3).find("block_table"), std::string::npos);  // 4 entries < 2*3
  EXPECT_EQ(err({32, 0}, 16), "");  // request 1 needs no page: its -1 is never read
}

}  // namespace
