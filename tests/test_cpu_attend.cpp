// cpu::attend against the float64 ref::attend from the same inputs (SPEC.md, attend; tolerances:
// f32 o relative L2 < 1e-4, bf16 o < 1e-2, lse within 1e-3, -inf exactly where nothing is visible).
// Inputs are built here rather than through synth::make_scenario so that every row a query can see
// is filled (pre has not run), and so that G, DCP rank and the output views can be chosen freely.
// Adversarial: shuffled page tables, NaN in unused pages, page tails, spare pages in the table and
// the query's head pad; outputs poisoned before, checked fully written, their pads untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "cpu/attend_kernels.hpp"
#include "cpu/stages.hpp"
#include "mla/dcp.hpp"
#include "mla/formats.hpp"
#include "reference/reference.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

struct CaseSpec {
  std::string preset = "kimi-k3";
  int g = 12;  // gathered heads G = N*W
  int qlen = 1;
  int page_size = 16;
  std::vector<int32_t> seq_lens;
  DType q_dtype = DType::fp8_e4m3;
  DType kv_dtype = DType::fp8_e4m3;
  DType o_dtype = DType::f32;
  DcpInfo dcp{};
  int q_head_pad = 0;     // extra (NaN) heads in the query buffer
  int page_pad = 0;       // extra elements per page: page stride > page_size * 576
  bool strided_out = false;
  int splits = 0;         // > 0: rank-4 split outputs with this many chunks
  int num_splits = 1;     // LayerOptions.num_splits for rank-3 outputs
  int threads = 1;
  double score_scale = 1;  // query magnitude: scores have a spread of about 1.7 * score_scale
  bool random_fp8_codes = false;  // cache filled with uniformly random non-NaN fp8 codes
  uint64_t seed = 1;

  std::string describe() const {
    std::ostringstream os;
    int64_t total = 0;
    for (int32_t l : seq_lens) total += l;
    os << preset << " G=" << g << " Q=" << qlen << " page=" << page_size << " B=" << seq_lens.size()
       << " total=" << total << " q=" << dtype_name(q_dtype) << " kv=" << dtype_name(kv_dtype)
       << " o=" << dtype_name(o_dtype) << " dcp=" << dcp.rank << "/" << dcp.size << " I=" << dcp.interleave
       << " pad=" << q_head_pad << " splits=" << splits << " num_splits=" << num_splits
       << " threads=" << threads << " seed=" << seed << " lens=[";
    for (size_t b = 0; b < seq_lens.size() && b < 12; ++b) os << (b ? "," : "") << seq_lens[b];
    os << (seq_lens.size() > 12 ? ",...]" : "]");
    return os.str();
  }
};

constexpr int kRow = 576, kWidth = 512;
constexpr uint8_t kOutPad = 0xAB;  // bytes of the output buffers outside the views

// One attend call's inputs and outputs, owned; the views point into the buffers.
class Case {
 public:
  explicit Case(const CaseSpec& spec) : spec(spec), rng(spec.seed) {
    cfg = LayerConfig::preset(spec.preset);
    cfg.tp_size = 1;
    cfg.total_heads = spec.g / spec.dcp.size;
    opts.dcp = spec.dcp;
    opts.num_splits = spec.num_splits;
    opts.q_dtype = spec.q_dtype;
    build_cache();
    build_query();
    build_outputs();
  }
  Case(const Case&) = delete;

  cpu::Context context() const { return {cfg, opts, w, spec.threads}; }
  void run() { cpu::attend(context(), q, kv, meta, out); }
  ref::AttendResult reference() const {
    return ref::attend(cfg, q, spec.g, w.q_scale, kv, w.k_scale, meta, spec.dcp);
  }
  std::vector<ref::AttendResult> reference_splits() const {
    return ref::attend_splits(cfg, q, spec.g, w.q_scale, kv, w.k_scale, meta, spec.dcp, spec.splits);
  }
  int tokens() const { return int(spec.seq_lens.size()) * spec.qlen; }
  // Split c of a rank-4 output as a rank-3 view.
  AttendOutputs split(int c) const {
    auto drop = [c](const TensorView& v) {
      TensorView r = v;
      r.data = static_cast<char*>(v.data) + c * v.stride[0] * int64_t(dtype_size(v.dtype));
      r.rank = v.rank - 1;
      for (int d = 0; d < r.rank; ++d) {
        r.shape[d] = v.shape[d + 1];
        r.stride[d] = v.stride[d + 1];
      }
      r.shape[r.rank] = r.stride[r.rank] = 0;
      return r;
    };
    return {drop(out.o), drop(out.lse)};
  }
  // True when every byte of the output buffers outside the views still holds kOutPad.
  bool pads_intact() const {
    auto check = [](const std::vector<uint8_t>& buf, const TensorView& v) {
      std::vector<bool> inside(buf.size(), false);
      const size_t es = dtype_size(v.dtype);
      for (int64_t i = 0; i < v.numel(); ++i) {
        int64_t off = 0, rest = i;
        for (int d = v.rank - 1; d >= 0; --d) {
          off += (rest % v.shape[d]) * v.stride[d];
          rest /= v.shape[d];
        }
        for (size_t k = 0; k < es; ++k) inside[size_t(off) * es + k] = true;
      }
      for (size_t k = 0; k < buf.size(); ++k)
        if (!inside[k] && buf[k] != kOutPad) return false;
      return true;
    };
    return check(o_buf, out.o) && check(lse_buf, out.lse);
  }

  CaseSpec spec;
  std::mt19937_64 rng;
  LayerConfig cfg;
  LayerOptions opts;
  PreparedWeights w;
  std::vector<int32_t> seq_lens, kv_indptr, kv_indices;
  std::vector<uint8_t> cache_buf, q_buf, o_buf, lse_buf;
  TensorView q;
  KVCache kv;
  StepMeta meta;
  AttendOutputs out;

 private:
  double normal() { return std::normal_distribution<double>(0, 1)(rng); }
  double factor() { return std::uniform_real_distribution<double>(0.8, 1.25)(rng); }

  void build_cache() {
    const int batch = int(spec.seq_lens.size()), ps = spec.page_size;
    seq_lens = spec.seq_lens;
    std::vector<int64_t> local(batch);
    kv_indptr.assign(1, 0);
    for (int b = 0; b < batch; ++b) {
      local[b] = dcp::local_length(spec.dcp, seq_lens[b]);
      // Now and then a spare page at the end of a request's table: attend must not read it.
      const int64_t pages = (local[b] + ps - 1) / ps + (std::uniform_int_distribution<int>(0, 3)(rng) == 0);
      kv_indptr.push_back(kv_indptr.back() + int32_t(pages));
    }
    const int64_t used = kv_indptr.back(), num_pages = used + 3;  // 3 pages nobody owns
    std::vector<int32_t> ids(num_pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    kv_indices.assign(ids.begin(), ids.begin() + used);

    const bool fp8 = spec.kv_dtype == DType::fp8_e4m3;
    const size_t es = fp8 ? 1 : 2;
    const int64_t page_stride = int64_t(ps) * kRow + spec.page_pad;
    cache_buf.resize(size_t(num_pages * page_stride) * es);
    // NaN everywhere first: unused pages, page tails and the page pad stay NaN.
    for (size_t i = 0; i < cache_buf.size() / es; ++i) {
      if (fp8) cache_buf[i] = 0x7F;
      else reinterpret_cast<uint16_t*>(cache_buf.data())[i] = 0x7FC0;
    }
    w.k_scale = float(4.5 / 448 * factor());
    for (int b = 0; b < batch; ++b)
      for (int64_t j = 0; j < local[b]; ++j) {
        const int64_t page = kv_indices[kv_indptr[b] + j / ps];
        const int64_t at = page * page_stride + (j % ps) * kRow;
        for (int c = 0; c < kRow; ++c) {
          if (fp8 && spec.random_fp8_codes) {
            uint8_t code;
            do code = uint8_t(rng()); while ((code & 0x7F) == 0x7F);
            cache_buf[at + c] = code;
            continue;
          }
          const float x = float(normal());
          if (fp8) cache_buf[at + c] = float_to_fp8e4m3(x / w.k_scale);
          else reinterpret_cast<uint16_t*>(cache_buf.data())[at + c] = float_to_bf16(x);
        }
      }
    kv.pages = TensorView::strided(cache_buf.data(), spec.kv_dtype, {num_pages, ps, kRow}, {page_stride, kRow, 1});
    meta.qlen = spec.qlen;
    meta.seq_lens = TensorView::contiguous(seq_lens.data(), DType::i32, {batch});
    meta.kv_indptr = TensorView::contiguous(kv_indptr.data(), DType::i32, {batch + 1});
    meta.kv_indices = TensorView::contiguous(kv_indices.data(), DType::i32, {used});
    meta.seq_lens_host = seq_lens;
  }

  void build_query() {
    const int s = tokens(), hq = spec.g + spec.q_head_pad;
    const bool fp8 = spec.q_dtype == DType::fp8_e4m3;
    const size_t es = fp8 ? 1 : 2;
    q_buf.resize(size_t(s) * hq * kRow * es);
    w.q_scale = float(4.5 * spec.score_scale / 448 * factor());
    for (int t = 0; t < s; ++t)
      for (int h = 0; h < hq; ++h)
        for (int c = 0; c < kRow; ++c) {
          const size_t at = (size_t(t) * hq + h) * kRow + c;
          const bool pad = h >= spec.g;  // NaN: attend must read only the first G heads
          const float x = pad ? NAN : float(normal() * spec.score_scale);
          if (fp8) q_buf[at] = float_to_fp8e4m3(x / w.q_scale);
          else reinterpret_cast<uint16_t*>(q_buf.data())[at] = float_to_bf16(x);
        }
    q = TensorView::strided(q_buf.data(), spec.q_dtype, {s, spec.g, kRow}, {int64_t(hq) * kRow, kRow, 1});
  }

  void build_outputs() {
    const int64_t s = tokens(), g = spec.g;
    const int64_t gp = spec.strided_out ? g + 3 : g, lp = spec.strided_out ? kWidth + 8 : kWidth;
    const int64_t splits = std::max(spec.splits, 1);
    const size_t es = dtype_size(spec.o_dtype);
    o_buf.assign(size_t(splits * s * gp * lp) * es, kOutPad);
    lse_buf.assign(size_t(splits * s * gp) * 4, kOutPad);
    if (spec.splits > 0) {
      out.o = TensorView::strided(o_buf.data(), spec.o_dtype, {splits, s, g, kWidth}, {s * gp * lp, gp * lp, lp, 1});
      out.lse = TensorView::strided(lse_buf.data(), DType::f32, {splits, s, g}, {s * gp, gp, 1});
    } else {
      out.o = TensorView::strided(o_buf.data(), spec.o_dtype, {s, g, kWidth}, {gp * lp, lp, 1});
      out.lse = TensorView::strided(lse_buf.data(), DType::f32, {s, g}, {gp, 1});
    }
    testing::poison(out.o);
    testing::poison(out.lse);
  }
};

double o_tolerance(DType o) { return o == DType::f32 ? 1e-4 : 1e-2; }

// o and lse of a rank-3 output against a float64 result.
void expect_matches(const AttendOutputs& got, const ref::AttendResult& want, const std::string& what) {
  EXPECT_EQ(testing::count_poison(got.o), 0) << what << ": o not fully written";
  EXPECT_EQ(testing::count_poison(got.lse), 0) << what << ": lse not fully written";
  const testing::Compare co = testing::compare(got.o, want.o.data());
  EXPECT_TRUE(co.ok(o_tolerance(got.o.dtype))) << what << ": o rel_l2 " << co.rel_l2 << " " << co.why;
  const testing::Compare cl = testing::compare(got.lse, want.lse.data());
  EXPECT_TRUE(cl.why.empty() && cl.max_abs <= 1e-3) << what << ": lse max_abs " << cl.max_abs << " " << cl.why;
  for (int64_t i = 0; i < got.o.numel(); ++i)
    if (std::isnan(testing::element(got.o, i))) {
      ADD_FAILURE() << what << ": NaN in o at " << i;
      break;
    }
}

void check_case(const CaseSpec& spec) {
  SCOPED_TRACE(spec.describe());
  Case c(spec);
  c.run();
  EXPECT_TRUE(c.pads_intact()) << "attend wrote outside its output views";
  if (spec.splits == 0) {
    expect_matches(c.out, c.reference(), "merged");
    return;
  }
  const std::vector<ref::AttendResult> want = c.reference_splits();
  for (int k = 0; k < spec.splits; ++k) expect_matches(c.split(k), want[k], "split " + std::to_string(k));
  // The partials merge to the whole attention: the split chunking is exactly SPEC.md's.
  std::vector<ref::AttendResult> got(spec.splits);
  for (int k = 0; k < spec.splits; ++k) {
    const AttendOutputs part = c.split(k);
    got[k].o = testing::to_doubles(part.o);
    got[k].lse = testing::to_doubles(part.lse);
  }
  const ref::AttendResult merged = ref::merge(got), whole = c.reference();
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < whole.o.size(); ++i) {
    diff2 += (merged.o[i] - whole.o[i]) * (merged.o[i] - whole.o[i]);
    ref2 += whole.o[i] * whole.o[i];
  }
  EXPECT_LE(std::sqrt(diff2 / std::max(ref2, 1e-300)), o_tolerance(spec.o_dtype)) << "merged partials vs whole";
  for (size_t i = 0; i < whole.lse.size(); ++i) {
    if (std::isinf(whole.lse[i])) EXPECT_EQ(merged.lse[i], whole.lse[i]) << "lse " << i;
    else EXPECT_NEAR(merged.lse[i], whole.lse[i], 1e-3) << "lse " << i;
  }
}

// A random case whose float64 reference stays cheap: sum over requests of local keys * Q * G is
// kept near `budget` (the reference costs about 2200 flops per unit).
CaseSpec random_spec(uint64_t seed, int64_t budget) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 7);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  auto pick = [&](std::vector<int> v) { return v[size_t(uniform(0, int(v.size()) - 1))]; };

  CaseSpec s;
  s.seed = seed;
  s.preset = chance(0.5) ? "kimi-k3" : "deepseek-v3";
  s.g = pick({1, 8, 12, 16, 128});
  std::vector<int> ws{1};
  for (int w : {2, 4, 8})
    if (s.g % w == 0) ws.push_back(w);
  s.dcp.size = chance(0.6) ? 1 : pick(ws);
  s.dcp.rank = uniform(0, s.dcp.size - 1);
  s.dcp.interleave = pick({1, 1, 4, 16, 64});
  s.qlen = uniform(1, 8);
  s.page_size = pick({1, 16, 64, 16, 64, 5});
  s.q_dtype = s.dcp.size == 1 && chance(0.3) ? DType::bf16 : DType::fp8_e4m3;
  s.kv_dtype = chance(0.3) ? DType::bf16 : DType::fp8_e4m3;
  s.o_dtype = chance(0.3) ? DType::bf16 : DType::f32;
  s.q_head_pad = chance(0.4) ? uniform(1, 20) : 0;
  s.page_pad = chance(0.2) ? 64 : 0;
  s.strided_out = chance(0.4);
  s.splits = chance(0.3) ? uniform(1, 5) : 0;
  s.num_splits = pick({0, 1, 2, 3});
  s.threads = uniform(1, 3);

  const int64_t per_key = int64_t(s.qlen) * s.g;
  const int max_batch = int(std::clamp<int64_t>(budget / (per_key * s.qlen * 4), 1, 64));
  const int batch = chance(0.4) ? uniform(1, std::min(4, max_batch)) : uniform(1, max_batch);
  const int64_t max_len = std::clamp<int64_t>(2 * budget / (per_key * batch) * s.dcp.size, s.qlen, 5000);
  for (int b = 0; b < batch; ++b) {
    if (chance(0.12)) s.seq_lens.push_back(0);
    else if (chance(0.25)) s.seq_lens.push_back(uniform(s.qlen, int(std::min<int64_t>(max_len, s.qlen + 2 * s.page_size))));
    else s.seq_lens.push_back(uniform(s.qlen, int(max_len)));
  }
  return s;
}

TEST(CpuAttend, RandomConfigs) {
  for (uint64_t seed = 1; seed <= 48; ++seed) check_case(random_spec(seed, 60000));
}

TEST(CpuAttend, LongContexts) {
  for (int page_size : {1, 16, 64}) {
    CaseSpec s{.g = 12, .qlen = page_size == 16 ? 4 : 1, .page_size = page_size, .seq_lens = {5000, 37, 0, 4999},
               .o_dtype = page_size == 64 ? DType::bf16 : DType::f32, .num_splits = 0, .threads = 2,
               .seed = uint64_t(100 + page_size)};
    s.kv_dtype = page_size == 1 ? DType::bf16 : DType::fp8_e4m3;
    check_case(s);
  }
  // Batch 1, long: the internal split across threads and its merge carry the whole request.
  check_case({.g = 16, .qlen = 2, .page_size = 64, .seq_lens = {5000}, .num_splits = 0, .threads = 3, .seed = 7});
  check_case({.g = 8, .qlen = 1, .page_size = 16, .seq_lens = {4097}, .num_splits = 7, .threads = 2, .seed = 8});
}

TEST(CpuAttend, WideHeadsLikeDeepseekDcp8) {
  // G = 128 gathered heads (16 per rank, W = 8), fp8 query, every rank's view of the same lengths.
  for (int rank : {0, 5, 7})
    check_case({.preset = "deepseek-v3", .g = 128, .qlen = 3, .page_size = 16, .seq_lens = {0, 3, 40, 130},
                .dcp = {.size = 8, .rank = rank, .interleave = rank == 5 ? 16 : 1}, .q_head_pad = 4,
                .strided_out = true, .threads = 2, .seed = uint64_t(200 + rank)});
}

TEST(CpuAttend, EmptyRequestsAndRanksWithoutKeys) {
  // All padding: o = 0, lse = -inf everywhere, written through every output layout.
  check_case({.g = 12, .qlen = 2, .seq_lens = {0, 0, 0}, .seed = 11});
  check_case({.g = 12, .qlen = 1, .seq_lens = {0, 0}, .splits = 3, .seed = 12});
  // DCP rank 3 of 4 with interleave 64 holds no key of short requests, and only some queries of a
  // request just past the boundary see its keys: lse = -inf exactly for those.
  check_case({.g = 8, .qlen = 8, .page_size = 16, .seq_lens = {8, 190, 196, 200, 260},
              .dcp = {.size = 4, .rank = 3, .interleave = 64}, .seed = 13});
  check_case({.g = 8, .qlen = 8, .page_size = 1, .seq_lens = {8, 9, 15, 16},
              .dcp = {.size = 8, .rank = 7, .interleave = 1}, .splits = 2, .seed = 14});
}

TEST(CpuAttend, AllFp8CodesAndSubnormals) {
  // Uniformly random cache codes (subnormals, +-0, +-448 included) check the vector decode of the
  // cache against the table decode of the reference; small queries keep the scores moderate.
  check_case({.g = 8, .qlen = 2, .page_size = 16, .seq_lens = {300, 77}, .score_scale = 0.01,
              .random_fp8_codes = true, .seed = 21});
}

TEST(CpuAttend, LargeScoresRescaleStably) {
  // Scores spread over hundreds: the running max moves often and exp underflows for most keys.
  check_case({.g = 12, .qlen = 4, .page_size = 64, .seq_lens = {1500, 700}, .threads = 2, .score_scale = 60,
              .seed = 31});
  check_case({.g = 12, .qlen = 1, .page_size = 16, .seq_lens = {900}, .kv_dtype = DType::bf16, .splits = 3,
              .score_scale = 60, .seed = 32});
}

TEST(CpuAttend, Deterministic) {
  CaseSpec s{.g = 12, .qlen = 3, .page_size = 16, .seq_lens = {3000, 0, 1200, 45}, .num_splits = 0, .threads = 3,
             .seed = 41};
  Case a(s), b(s);
  a.run();
  b.run();
  a.run();  // a second run over the same buffers gives the same bits
  EXPECT_EQ(a.o_buf, b.o_buf);
  EXPECT_EQ(a.lse_buf, b.lse_buf);
}

TEST(CpuAttend, InternalSplitMatchesUnsplit) {
  // Contexts too long for the float64 reference at G*Q = 1024 rows, where the split plan must
  // coarsen its chunks to bound the partials' memory: the split run against the unsplit one.
  for (const CaseSpec& base : {CaseSpec{.preset = "deepseek-v3", .g = 128, .qlen = 8, .page_size = 64,
                                        .seq_lens = {9000}, .threads = 8, .seed = 61},
                               CaseSpec{.g = 12, .qlen = 1, .page_size = 16, .seq_lens = {7000, 0, 20},
                                        .q_dtype = DType::bf16, .threads = 2, .seed = 62}}) {
    CaseSpec split = base, whole = base;
    split.num_splits = 0;
    whole.num_splits = 1;
    SCOPED_TRACE(split.describe());
    Case a(split), b(whole);
    a.run();
    b.run();
    EXPECT_EQ(testing::count_poison(a.out.o), 0);
    EXPECT_EQ(testing::count_poison(a.out.lse), 0);
    const std::vector<double> want_o = testing::to_doubles(b.out.o), want_lse = testing::to_doubles(b.out.lse);
    const testing::Compare co = testing::compare(a.out.o, want_o.data());
    EXPECT_TRUE(co.ok(1e-5)) << co.rel_l2 << " " << co.why;
    const testing::Compare cl = testing::compare(a.out.lse, want_lse.data());
    EXPECT_TRUE(cl.why.empty() && cl.max_abs < 1e-4) << cl.max_abs << " " << cl.why;
  }
}

TEST(CpuAttend, BadMetadataThrowsBeforeWriting) {
  // The stage's own guard on what it reads (Layer validates first; this keeps direct callers from
  // reading outside the cache): a page out of range, a page table too short, a seq_len below qlen.
  const CaseSpec spec{.g = 8, .qlen = 2, .page_size = 16, .seq_lens = {40, 0, 17}, .seed = 51};
  auto expect_rejected = [](Case& c, const char* what) {
    const std::string err = testing::error_of([&] { c.run(); });
    EXPECT_NE(err.find(what), std::string::npos) << err;
    EXPECT_EQ(testing::count_poison(c.out.o), c.out.o.numel()) << "o written before the error";
    EXPECT_EQ(testing::count_poison(c.out.lse), c.out.lse.numel()) << "lse written before the error";
  };
  {
    Case c(spec);
    c.kv_indices[c.kv_indptr[2] + 1] = int32_t(c.kv.num_pages());
    expect_rejected(c, "kv_indices[");
  }
  {
    Case c(spec);
    c.kv_indptr[3] = c.kv_indptr[2] + 1;  // request 2 needs 2 pages for 17 rows
    expect_rejected(c, "needs 2 pages");
  }
  {
    Case c(spec);
    c.seq_lens[2] = 1;
    expect_rejected(c, "seq_lens[2]");
  }
}

// Every kernel set this CPU runs (attend_kernels.hpp): AVX2 always, AVX-512 where present.
std::vector<const cpu::AttendKernels*> kernel_sets() {
  std::vector<const cpu::AttendKernels*> sets{&cpu::attend_kernels_avx2()};
  for (const cpu::AttendKernels* k : {cpu::attend_kernels_avx512(), cpu::attend_kernels_avx512_bf16()})
    if (k) sets.push_back(k);
  return sets;
}

struct ForceKernels {
  explicit ForceKernels(const cpu::AttendKernels* k) { cpu::set_attend_kernels_for_testing(k); }
  ~ForceKernels() { cpu::set_attend_kernels_for_testing(nullptr); }
};

TEST(CpuAttend, EveryKernelSetMatchesReference) {
  // RandomConfigs runs the automatic choice; here each set in turn runs a few cases of its own.
  for (const cpu::AttendKernels* k : kernel_sets()) {
    SCOPED_TRACE(k->name);
    ForceKernels force(k);
    for (uint64_t seed = 1001; seed <= 1010; ++seed) check_case(random_spec(seed, 40000));
  }
}

TEST(CpuAttend, KernelDequantizesEveryCode) {
  // All 256 fp8 codes (NaN codes stay NaN) and a spread of bf16 patterns, at an odd scale.
  std::vector<uint8_t> fp8(256 + 64);
  for (int c = 0; c < int(fp8.size()); ++c) fp8[c] = uint8_t(c < 256 ? c : c * 37);
  std::vector<uint16_t> bf16(fp8.size());
  for (size_t c = 0; c < bf16.size(); ++c) bf16[c] = uint16_t(c * 2654435761u >> 13);
  const float scale = 0.0173f;
  for (const cpu::AttendKernels* k : kernel_sets()) {
    std::vector<float> got(fp8.size());
    k->dequant_row(DType::fp8_e4m3, fp8.data(), 1, int(fp8.size()), scale, got.data());
    for (size_t c = 0; c < fp8.size(); ++c) {
      const float want = fp8e4m3_to_float(fp8[c]) * scale;
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(got[c])) << k->name << " code " << int(fp8[c]);
      else EXPECT_EQ(got[c], want) << k->name << " code " << int(fp8[c]);
    }
    if (k->bf16_row) {
      // The raw values in bf16, exact, for the scores and P.V; bf16 rows unchanged.
      std::vector<uint16_t> raw(fp8.size());
      k->bf16_row(DType::fp8_e4m3, fp8.data(), 1, int(fp8.size()), raw.data());
      for (size_t c = 0; c < fp8.size(); ++c) {
        const float value = fp8e4m3_to_float(fp8[c]);
        if (std::isnan(value)) {
          EXPECT_TRUE(std::isnan(bf16_to_float(raw[c]))) << k->name << " code " << int(fp8[c]);
          continue;
        }
        EXPECT_EQ(bf16_to_float(raw[c]), value) << k->name << " raw code " << int(fp8[c]);
        EXPECT_EQ(raw[c] >> 15, fp8[c] >> 7) << k->name << " sign, code " << int(fp8[c]);
      }
      k->bf16_row(DType::bf16, bf16.data(), 1, int(bf16.size()), raw.data());
      EXPECT_EQ(raw, bf16) << k->name;
    }
    k->dequant_row(DType::bf16, bf16.data(), 1, int(bf16.size()), 1.0f, got.data());
    for (size_t c = 0; c < bf16.size(); ++c) {
      const float want = bf16_to_float(bf16[c]);
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(got[c])) << k->name;
      else EXPECT_EQ(got[c], want) << k->name << " bits " << bf16[c];
    }
  }
}

}  // namespace
}  // namespace mla
