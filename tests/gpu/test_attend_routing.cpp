// Which attend kernel serves which call (src/cuda/attend_wgmma.cu, attend_wgmma_applies): host
// logic only, so it runs without a GPU too. The policy: the wgmma kernel takes the step's own split
// partials with an fp8 query and cache; every result handed to a caller (a bf16 or f32 o), any bf16
// operand and a misaligned o take the mma.sync kernel. Run with MLA_ATTEND_KERNEL unset (the
// variable is read once per process; device-check sets it only for other test runs).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "cuda/stages.hpp"

namespace mla {
namespace {

cuda::AttendParams step_partials_params(float* o) {
  cuda::AttendParams p{};  // f32 o, one-rounded P
  p.q_fp8 = p.cache_fp8 = p.step_partials = true;
  p.o = o;
  p.o_split_stride = 4 * 12 * 512, p.o_s_stride = 12 * 512, p.o_h_stride = 512;
  return p;
}

// The same over a 16-byte aligned cache of 100 pages of 576-byte rows in 4 splits (each test sets
// the page size and stride). aligned_cache + 8 is a base that is not 16-byte aligned.
alignas(16) uint8_t aligned_cache[32];
cuda::AttendParams cache_params(float* o) {
  cuda::AttendParams p = step_partials_params(o);
  p.cache = aligned_cache;
  p.row_stride = 576, p.num_pages = 100, p.splits = 4;
  return p;
}

TEST(AttendRouting, WgmmaServesOnlyTheStepsFp8Partials) {
  if (std::getenv("MLA_ATTEND_KERNEL")) GTEST_SKIP() << "MLA_ATTEND_KERNEL is set: the default policy is not in force";
  if (std::getenv("MLA_ATTEND_TMA")) GTEST_SKIP() << "MLA_ATTEND_TMA is set: the bf16-query splits need TMA or row copies";
  std::vector<float> o(8);
  const cuda::AttendParams step = step_partials_params(o.data());
  EXPECT_TRUE(cuda::attend_wgmma_applies(step));

  cuda::AttendParams caller_bf16 = step;  // attend() into a caller's bf16 o
  caller_bf16.step_partials = false;
  caller_bf16.o_bf16 = true;
  EXPECT_FALSE(cuda::attend_wgmma_applies(caller_bf16));

  cuda::AttendParams caller_f32 = step;  // attend() into a caller's f32 o: hi + lo P
  caller_f32.step_partials = false;
  caller_f32.exact_p = true;
  EXPECT_FALSE(cuda::attend_wgmma_applies(caller_f32));

  cuda::AttendParams bf16_q = cache_params(o.data());  // a bf16 query over page-64 TMA boxes of an fp8
  bf16_q.page_size = 64, bf16_q.page_stride = 64 * 576;  // cache: the 16-row kernel's split only under
  bf16_q.q_fp8 = false;                                  // MLA_ATTEND_Q_SPLIT=1
  EXPECT_EQ(cuda::attend_wgmma_applies(bf16_q), cuda::attend_q_split_enabled());
  EXPECT_EQ(cuda::attend_wgmma_q_split(bf16_q), cuda::attend_q_split_enabled());
  cuda::AttendParams bf16_q_rows = bf16_q;  // many rows: the many-rows kernel's split only under
  bf16_q_rows.many_rows = true;             // the default (MLA_ROWS_Q_SPLIT=0: the mma.sync kernel)
  EXPECT_EQ(cuda::attend_wgmma_applies(bf16_q_rows), cuda::attend_rows_q_split_enabled());
  EXPECT_EQ(cuda::attend_rows_q_split(bf16_q_rows), cuda::attend_rows_q_split_enabled());
  EXPECT_FALSE(cuda::attend_wgmma_q_split(bf16_q_rows));
  EXPECT_FALSE(cuda::attend_rows_q_split(bf16_q));  // (not where the planner asked for 16 rows)
  cuda::AttendParams bf16_q_rows_page3 = bf16_q_rows;  // pages no box takes: mma.sync under either
  bf16_q_rows_page3.page_size = 3, bf16_q_rows_page3.page_stride = 3 * 576;
  EXPECT_FALSE(cuda::attend_wgmma_applies(bf16_q_rows_page3));
  cuda::AttendParams bf16_q_page1 = bf16_q;  // pages TMA does not box for it: the split's bulk row copies
  bf16_q_page1.page_size = 1, bf16_q_page1.page_stride = 576;
  EXPECT_EQ(cuda::attend_wgmma_applies(bf16_q_page1), cuda::attend_q_split_enabled());
  cuda::AttendParams bf16_both = bf16_q;  // a bf16 query and cache: the 16-row kernel's kBf16 only under
  bf16_both.cache_fp8 = false;            // MLA_ATTEND_BF16_16ROW=1, and not where the planner asks for many rows
  EXPECT_EQ(cuda::attend_wgmma_applies(bf16_both), cuda::attend_bf16_16row_enabled());
  bf16_both.many_rows = true;
  EXPECT_FALSE(cuda::attend_wgmma_applies(bf16_both));
  cuda::AttendParams bf16_q_unaligned = bf16_q_page1;  // rows no 16-byte copy can take: the mma.sync kernel
  bf16_q_unaligned.cache = aligned_cache + 8;
  EXPECT_FALSE(cuda::attend_wgmma_applies(bf16_q_unaligned));
  cuda::AttendParams bf16_cache = step;
  bf16_cache.cache_fp8 = false;
  EXPECT_FALSE(cuda::attend_wgmma_applies(bf16_cache));

  cuda::AttendParams odd_stride = step;  // o rows written as pairs of dims need even strides
  odd_stride.o_h_stride = 513;
  EXPECT_FALSE(cuda::attend_wgmma_applies(odd_stride));
  cuda::AttendParams odd_base = step;
  odd_base.o = o.data() + 1;
  EXPECT_FALSE(cuda::attend_wgmma_applies(odd_base));
}

// The wgmma kernel loads whole pages by TMA where the cache is one [rows, 576] matrix with pages of a
// power of two rows (1, 2 and 4 only for a bf16 cache, whose kernel takes TMA tiles only) and the partials may be
// chunked by whole tiles; else by bulk row copies (an fp8 cache, AttendRouting.RowCopies...) or cp.async.
TEST(AttendRouting, TmaTilesOnlyWhereWholePagesCanBeBoxes) {
  if (std::getenv("MLA_ATTEND_TMA")) GTEST_SKIP() << "MLA_ATTEND_TMA is set: the default policy is not in force";
  std::vector<float> o(8);
  cuda::AttendParams p = cache_params(o.data());
  for (int page : {8, 16, 32, 64, 128}) {
    p.page_size = page, p.page_stride = int64_t(page) * 576;
    EXPECT_TRUE(cuda::attend_wgmma_uses_tma(p)) << "page " << page;
  }
  p.page_size = 64, p.page_stride = 64 * 576;
  cuda::AttendParams q = p;
  for (int page : {1, 2, 4}) {
    q.page_size = page, q.page_stride = int64_t(page) * 576;
    q.cache_fp8 = true;
    EXPECT_FALSE(cuda::attend_wgmma_uses_tma(q)) << "page " << page;
    q.cache_fp8 = false;
    EXPECT_TRUE(cuda::attend_wgmma_uses_tma(q)) << "page " << page << ", bf16 cache";
    q.cache_fp8 = true;
  }
  for (int page : {3, 6, 12, 48}) {
    q.page_size = page, q.page_stride = int64_t(page) * 576;
    EXPECT_FALSE(cuda::attend_wgmma_uses_tma(q)) << "page " << page;
  }
  q = p;
  q.page_stride += 576;  // a gap between pages
  EXPECT_FALSE(cuda::attend_wgmma_uses_tma(q));
  q = p;
  q.row_stride = 584, q.page_stride = 64 * 584;  // rows not 16-byte aligned
  EXPECT_FALSE(cuda::attend_wgmma_uses_tma(q));
  q = p;
  q.cache = aligned_cache + 1;
  EXPECT_FALSE(cuda::attend_wgmma_uses_tma(q));
  q = p;  // a caller's split partials keep SPEC's chunks: cp.async
  q.step_partials = false;
  EXPECT_FALSE(cuda::attend_wgmma_uses_tma(q));
  q.splits = 1;  // one split: the same chunk either way
  EXPECT_TRUE(cuda::attend_wgmma_uses_tma(q));
}

// Where TMA cannot box an fp8 cache's pages, the 16-row kernel copies a tile a key row at a time with
// bulk copies (v24): any page size or page stride with 16-byte aligned rows, whole-tile chunks; never
// where boxes apply, for a bf16 cache, or for many rows a key (attend_rows.cu gathers those).
TEST(AttendRouting, RowCopiesWhereTmaCannotBoxAnFp8Cache) {
  if (std::getenv("MLA_ATTEND_TMA")) GTEST_SKIP() << "MLA_ATTEND_TMA is set: the default policy is not in force";
  std::vector<float> o(8);
  cuda::AttendParams p = cache_params(o.data());
  for (int page : {1, 2, 4, 3, 6, 12, 48}) {
    p.page_size = page, p.page_stride = int64_t(page) * 576;
    EXPECT_TRUE(cuda::attend_wgmma_row_copies(p)) << "page " << page;
    EXPECT_FALSE(cuda::attend_wgmma_uses_tma(p)) << "page " << page;
  }
  p.page_size = 64, p.page_stride = 64 * 576;  // TMA boxes
  EXPECT_FALSE(cuda::attend_wgmma_row_copies(p));
  p.page_stride += 576;  // a gap between pages: no boxes, rows
  EXPECT_TRUE(cuda::attend_wgmma_row_copies(p));
  cuda::AttendParams q = p;
  q.page_size = 1, q.page_stride = 576;
  q.cache_fp8 = false;  // a bf16 cache: one-row TMA boxes (or the mma.sync kernel)
  EXPECT_FALSE(cuda::attend_wgmma_row_copies(q));
  q.cache_fp8 = true;
  q.many_rows = true;  // attend_rows.cu gathers
  EXPECT_FALSE(cuda::attend_wgmma_row_copies(q));
  q.many_rows = false;
  q.cache = aligned_cache + 8;  // rows not 16-byte aligned
  EXPECT_FALSE(cuda::attend_wgmma_row_copies(q));
  q.cache = aligned_cache;
  q.row_stride = 584, q.page_stride = 584;
  EXPECT_FALSE(cuda::attend_wgmma_row_copies(q));
  q.row_stride = 576, q.page_stride = 584 + 8;  // pages 16-byte aligned apart, rows too
  EXPECT_TRUE(cuda::attend_wgmma_row_copies(q));
  q.page_stride = 584;
  EXPECT_FALSE(cuda::attend_wgmma_row_copies(q));
  q.page_stride = 576;
  q.step_partials = false;  // a caller's split partials keep SPEC's chunks: cp.async
  EXPECT_FALSE(cuda::attend_wgmma_row_copies(q));
  q.splits = 1;
  EXPECT_TRUE(cuda::attend_wgmma_row_copies(q));
}

// The bf16 many-rows kernel (attend_rows_bf16.cu): the step's partials with a bf16 query and cache
// where the planner asked for many rows and the pages can be TMA boxes; anything else a bf16
// operand meets goes to the mma.sync kernel.
TEST(AttendRouting, Bf16ManyRowsOnlyForTheStepsBf16PartialsOnTmaPages) {
  if (std::getenv("MLA_ATTEND_KERNEL") || std::getenv("MLA_ATTEND_TMA"))
    GTEST_SKIP() << "MLA_ATTEND_KERNEL or MLA_ATTEND_TMA is set: the default policy is not in force";
  std::vector<float> o(8);
  cuda::AttendParams p = cache_params(o.data());
  p.q_fp8 = p.cache_fp8 = false;
  p.page_size = 64, p.page_stride = 64 * 576;
  p.many_rows = true;
  EXPECT_TRUE(cuda::attend_rows_bf16_applies(p));
  EXPECT_FALSE(cuda::attend_wgmma_applies(p));

  cuda::AttendParams q = p;
  q.many_rows = false;  // few rows a key: the mma.sync kernel
  EXPECT_FALSE(cuda::attend_rows_bf16_applies(q));
  q = p;
  q.cache_fp8 = true;  // a bf16 query over an fp8 cache
  EXPECT_FALSE(cuda::attend_rows_bf16_applies(q));
  q = p;
  q.q_fp8 = q.cache_fp8 = true;  // fp8: attend_rows.cu through attend_wgmma_applies
  EXPECT_FALSE(cuda::attend_rows_bf16_applies(q));
  q = p;
  q.page_size = 48, q.page_stride = 48 * 576;  // no TMA boxes
  EXPECT_FALSE(cuda::attend_rows_bf16_applies(q));
  q.page_size = 1, q.page_stride = 576;  // one-row boxes: a bf16 cache takes them
  EXPECT_TRUE(cuda::attend_rows_bf16_applies(q));
  q = p;
  q.step_partials = false, q.exact_p = true;  // a caller's f32 o: hi + lo P
  EXPECT_FALSE(cuda::attend_rows_bf16_applies(q));
  q = p;
  q.o_h_stride = 513;
  EXPECT_FALSE(cuda::attend_rows_bf16_applies(q));
}


// The fp8 many-rows kernel's gathered tiles: pages TMA cannot box (not a power of two; 1-4 rows
// are boxed for it since session 24, one box a key row), 16-byte aligned rows, chunks that may be
// rounded to whole tiles.
TEST(AttendRouting, ManyRowsGatherWhereTmaCannot) {
  if (std::getenv("MLA_ATTEND_TMA")) GTEST_SKIP() << "MLA_ATTEND_TMA is set: the default policy is not in force";
  std::vector<float> o(8);
  cuda::AttendParams p = cache_params(o.data());
  for (int page : {1, 2, 4, 3, 6, 12, 48}) {  // (1, 2, 4: an fp8 cache, even or uneven)
    p.page_size = page, p.page_stride = int64_t(page) * 576;
    EXPECT_TRUE(cuda::attend_rows_gathers(p)) << "page " << page;
  }
  p.cache_fp8 = false;  // a bf16 cache: one-row TMA boxes
  p.page_size = 1, p.page_stride = 576;
  EXPECT_FALSE(cuda::attend_rows_gathers(p));
  p.cache_fp8 = true;
  if (!std::getenv("MLA_ROWS_SMALL_BOXES")) {  // the fp8 many-rows kernel boxes pages of 1-4 rows (session 24)
    cuda::AttendParams m = p;
    m.many_rows = true;
    for (int page : {1, 2, 4}) {
      m.page_size = page, m.page_stride = int64_t(page) * 576;
      EXPECT_TRUE(cuda::attend_wgmma_uses_tma(m)) << "page " << page;
      EXPECT_FALSE(cuda::attend_rows_gathers(m)) << "page " << page;
      m.q_fp8 = false;  // an fp8 cache under a bf16 query: the many-rows split's (unless MLA_ROWS_Q_SPLIT=0)
      EXPECT_EQ(cuda::attend_wgmma_uses_tma(m), cuda::attend_rows_q_split_enabled()) << "page " << page << ", bf16 query";
      m.q_fp8 = true;
    }
    for (int page : {3, 6, 12, 48}) {  // not a power of two: gathered
      m.page_size = page, m.page_stride = int64_t(page) * 576;
      EXPECT_TRUE(cuda::attend_rows_gathers(m)) << "page " << page;
    }
  }
  p.page_size = 64, p.page_stride = 64 * 576;  // TMA boxes
  EXPECT_FALSE(cuda::attend_rows_gathers(p));
  cuda::AttendParams q = p;
  q.page_size = 1, q.page_stride = 576;
  q.cache = aligned_cache + 8;  // rows not 16-byte aligned
  EXPECT_FALSE(cuda::attend_rows_gathers(q));
  q.cache = aligned_cache;
  q.step_partials = false;  // a caller's split partials keep SPEC's chunks
  EXPECT_FALSE(cuda::attend_rows_gathers(q));
  q.splits = 1;
  EXPECT_TRUE(cuda::attend_rows_gathers(q));
}

}  // namespace
}  // namespace mla
