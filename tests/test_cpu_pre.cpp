// The CPU pre stage against the float64 reference (tests/reference/pre.cpp) from the same inputs:
// random configurations over the presets, gate layouts, query and cache formats, qlen, page
// sizes and head-padded / row-padded query views, with every output poisoned before the call and
// the cache byte-compared outside the rows this step writes.
#include <gtest/gtest.h>

#include <cstring>
#include <string_view>
#include <vector>

#include "mla/mla.hpp"
#include "reference/reference.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

constexpr uint8_t kPadByte = 0xAB;  // outside the views: must survive the call

// A buffer of `rows` rows of `row_elems` elements whose view covers the first `cols` x `inner`
// elements of each row ([rows, cols, inner] with row stride row_elems): the rest is pad.
struct PaddedBuffer {
  std::vector<uint8_t> bytes;
  TensorView view;
};
PaddedBuffer padded(DType dt, int64_t rows, int64_t cols, int64_t inner, int64_t row_elems) {
  PaddedBuffer b;
  b.bytes.assign(size_t(rows * row_elems) * dtype_size(dt) + 64, kPadByte);
  b.view = TensorView::strided(b.bytes.data(), dt, {rows, cols, inner}, {row_elems, inner, 1});
  return b;
}

// The sub-view of heads [h0, h0+n) and columns [c0, c0+nc) of a [S, H, C] view.
TensorView slice(const TensorView& v, int64_t h0, int64_t n, int64_t c0, int64_t nc) {
  TensorView s = v;
  s.data = static_cast<uint8_t*>(v.data) + (h0 * v.stride[1] + c0 * v.stride[2]) * int64_t(dtype_size(v.dtype));
  s.shape[1] = n;
  s.shape[2] = nc;
  return s;
}

// Byte mask of the elements a view addresses, relative to `base`.
std::vector<bool> footprint(const TensorView& v, const void* base, size_t bytes) {
  std::vector<bool> mask(bytes, false);
  const int64_t es = int64_t(dtype_size(v.dtype));
  const int64_t off0 = static_cast<const uint8_t*>(v.data) - static_cast<const uint8_t*>(base);
  for (int64_t i = 0; i < v.shape[0]; ++i)
    for (int64_t j = 0; j < (v.rank > 1 ? v.shape[1] : 1); ++j)
      for (int64_t k = 0; k < (v.rank > 2 ? v.shape[2] : 1); ++k) {
        const int64_t e = i * v.stride[0] + (v.rank > 1 ? j * v.stride[1] : 0) + (v.rank > 2 ? k * v.stride[2] : 0);
        for (int64_t b = 0; b < es; ++b) mask[size_t(off0 + e * es + b)] = true;
      }
  return mask;
}

// The reference value as the stage stores it: fp8 code value of x / scale, or bf16.
double stored(double x, DType dt, double scale) {
  if (dt == DType::fp8_e4m3) return fp8e4m3_to_float(float_to_fp8e4m3(float(x / scale)));
  return round_bf16(float(x));
}

struct PreRun {
  LayerConfig cfg;
  PreparedWeights w;
  synth::Scenario sc;
  DType q_dtype = DType::fp8_e4m3;
  int q_head_pad = 0;  // > G: the query buffer has more heads than G
  int row_pad = 0;     // extra elements per token row of the query and gate buffers
};

// The relative L2 bound of an output stored as dt, against the reference rounded to dt: the
// reference mirrors the rounding points, so only the rare value that lands on the other side of a
// rounding boundary differs, by one unit in the last place: 1/16 to 1/8 for fp8, 1/256 for bf16
// (measured: at most 2.6e-3 for fp8 over these cases, most cases 0).
double tolerance(DType dt) { return dt == DType::fp8_e4m3 ? 1e-2 : 4e-3; }

// Runs pre and checks every output against the reference.
void check_pre(const PreRun& run) {
  const LayerConfig& cfg = run.cfg;
  const int64_t S = run.sc.tokens();
  const int N = cfg.heads(), L = cfg.kv_lora_rank, R = cfg.qk_rope_dim, row = cfg.row_dim();
  // W = 1 here (the DCP tests cover W > 1): G = N, this rank's heads from head 0.
  const int G = N, Hq = run.q_head_pad > 0 ? run.q_head_pad : G, gate_dim = cfg.gate_dim();
  const int head0 = 0;

  PaddedBuffer q = padded(run.q_dtype, S, Hq, row, int64_t(Hq) * row + run.row_pad);
  const TensorView q_mine = slice(q.view, head0, N, 0, row);  // this rank's heads: all written
  testing::poison(q_mine);
  PaddedBuffer gate;
  TensorView gate_view;
  if (gate_dim > 0) {
    gate = padded(DType::bf16, S, 1, gate_dim, gate_dim + run.row_pad);
    gate_view = TensorView::strided(gate.bytes.data(), DType::bf16, {S, gate_dim}, {gate_dim + run.row_pad, 1});
    testing::poison(gate_view);
  }
  const std::vector<uint8_t> q_before = q.bytes, gate_before = gate.bytes;
  const KVCache cache = run.sc.kv();
  const std::vector<uint8_t> cache_before = testing::snapshot(cache.pages);
  const StepMeta meta = run.sc.meta();
  const PreOutputs out{.q = q.view, .gate = gate_view};

  Layer layer(cfg, run.w, {.backend = Backend::cpu, .q_dtype = run.q_dtype,
                           .max_tokens = int(std::max<int64_t>(S, 1)), .q_head_pad = run.q_head_pad});
  layer.pre(run.sc.hidden, meta, cache, out);

  // Everything of this rank's heads and of the gate written; nothing else in the buffers touched.
  EXPECT_EQ(testing::count_poison(q_mine), 0) << "query elements left unwritten";
  const std::vector<bool> q_mask = footprint(q_mine, q.bytes.data(), q.bytes.size());
  size_t q_stray = 0;
  for (size_t i = 0; i < q.bytes.size(); ++i) q_stray += !q_mask[i] && q.bytes[i] != q_before[i];
  EXPECT_EQ(q_stray, 0u) << "bytes outside this rank's heads of the query view changed";
  if (gate_dim > 0) {
    EXPECT_EQ(testing::count_poison(gate_view), 0) << "gate elements left unwritten";
    const std::vector<bool> g_mask = footprint(gate_view, gate.bytes.data(), gate.bytes.size());
    size_t g_stray = 0;
    for (size_t i = 0; i < gate.bytes.size(); ++i) g_stray += !g_mask[i] && gate.bytes[i] != gate_before[i];
    EXPECT_EQ(g_stray, 0u) << "bytes outside the gate view changed";
  }

  const ref::Weights64 w64 = ref::dequantize(cfg, run.w);
  const ref::PreResult ref = ref::pre(cfg, w64, run.sc.hidden, meta);

  // Query: ql_nope and q_pe compared separately (their magnitudes differ).
  std::vector<double> ql_nope(size_t(S) * N * L), q_pe(size_t(S) * N * R);
  for (int64_t s = 0; s < S; ++s)
    for (int n = 0; n < N; ++n) {
      const double* r = &ref.q[size_t((s * N + n) * row)];
      for (int c = 0; c < L; ++c) ql_nope[size_t((s * N + n) * L + c)] = stored(r[c], run.q_dtype, run.w.q_scale);
      for (int c = 0; c < R; ++c) q_pe[size_t((s * N + n) * R + c)] = stored(r[L + c], run.q_dtype, run.w.q_scale);
    }
  const testing::Compare c_nope = testing::compare(slice(q.view, head0, N, 0, L), ql_nope.data());
  EXPECT_TRUE(c_nope.ok(tolerance(run.q_dtype))) << "ql_nope: rel_l2 " << c_nope.rel_l2 << " " << c_nope.why;
  if (R > 0) {
    const testing::Compare c_pe = testing::compare(slice(q.view, head0, N, L, R), q_pe.data());
    EXPECT_TRUE(c_pe.ok(tolerance(run.q_dtype))) << "q_pe: rel_l2 " << c_pe.rel_l2 << " " << c_pe.why;
  }

  if (gate_dim > 0) {
    std::vector<double> g(ref.gate.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = round_bf16(float(ref.gate[i]));
    const testing::Compare c_gate = testing::compare(gate_view, g.data());
    EXPECT_TRUE(c_gate.ok(tolerance(DType::bf16))) << "gate: rel_l2 " << c_gate.rel_l2 << " " << c_gate.why;
  }

  // Cache: the rows of tokens with a slot hold the stored [kv_c | k_pe]; every other byte is unchanged.
  const TensorView& pages = cache.pages;
  const std::vector<uint8_t> cache_after = testing::snapshot(pages);
  const int64_t es = int64_t(dtype_size(pages.dtype)), ps = cache.page_size();
  std::vector<bool> written(cache_after.size(), false);
  std::vector<double> rows_ref;
  std::vector<uint8_t> rows_got;
  const auto* slots = meta.slot_mapping.ptr<const int64_t>();
  for (int64_t s = 0; s < S; ++s) {
    if (slots[s] < 0) continue;
    const int64_t off = ((slots[s] / ps) * pages.stride[0] + (slots[s] % ps) * pages.stride[1]) * es;
    for (int64_t b = 0; b < row * es; ++b) {
      written[size_t(off + b)] = true;
      rows_got.push_back(cache_after[size_t(off + b)]);
    }
    for (int c = 0; c < row; ++c) rows_ref.push_back(stored(ref.kv_row[size_t(s * row + c)], pages.dtype, run.w.k_scale));
  }
  size_t cache_stray = 0;
  for (size_t i = 0; i < cache_after.size(); ++i) cache_stray += !written[i] && cache_after[i] != cache_before[i];
  EXPECT_EQ(cache_stray, 0u) << "cache bytes outside this step's slots changed";
  if (!rows_ref.empty()) {
    const TensorView got = TensorView::contiguous(rows_got.data(), pages.dtype, {int64_t(rows_ref.size())});
    const testing::Compare c_rows = testing::compare(got, rows_ref.data());
    EXPECT_TRUE(c_rows.ok(tolerance(pages.dtype))) << "cache rows: rel_l2 " << c_rows.rel_l2 << " " << c_rows.why;
  }
}

PreRun make_run(const testing::RandomCase& rc, int row_pad) {
  PreRun run;
  run.cfg = rc.spec.cfg;
  run.w = prepare_weights(run.cfg, random_checkpoint_weights(run.cfg, rc.spec.seed * 7919 + 1));
  run.sc = synth::make_scenario(rc.spec, run.w.k_scale);
  run.q_dtype = rc.q_dtype;
  run.q_head_pad = rc.q_head_pad;
  run.row_pad = row_pad;
  return run;
}

// Many small configurations: up to 8 requests of qlen 1..8 (S <= 64).
TEST(CpuPre, RandomSmallConfigs) {
  const testing::RandomCaseLimits limits{.max_batch = 8, .max_context = 20000, .max_total_context = 8000,
                                         .empty_fraction = 0.15};
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const testing::RandomCase rc = testing::random_case(1000 + seed, limits);
    SCOPED_TRACE(rc.describe());
    check_pre(make_run(rc, int(seed % 3) * 7));
  }
}

// Wide batches of single tokens (S up to 64).
TEST(CpuPre, RandomWideBatches) {
  const testing::RandomCaseLimits limits{.min_batch = 16, .max_batch = 64, .max_context = 3000,
                                         .max_total_context = 8000, .max_qlen = 1};
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const testing::RandomCase rc = testing::random_case(2000 + seed, limits);
    SCOPED_TRACE(rc.describe());
    check_pre(make_run(rc, 0));
  }
}

// Positions far past YaRN's original context (4096), where the interpolated pairs turn slowly
// and the fast ones wrap many times: a wrong frequency or a float32 angle shows here.
// A third, made-up YaRN set has mscale != mscale_all_dim (cos/sin scaled) and another theta.
TEST(CpuPre, YarnLongPositions) {
  for (const char* preset : {"deepseek-v3", "kimi-k2", "custom"}) {
    for (DType q_dtype : {DType::fp8_e4m3, DType::bf16}) {
      testing::RandomCase rc;
      const bool custom = std::string_view(preset) == "custom";
      rc.spec.cfg = testing::small_config(custom ? "deepseek-v3" : preset, GateLayout::none, 2);
      if (custom)
        rc.spec.cfg.yarn = YarnParams{.theta = 20000, .factor = 16, .original_max_position = 8192,
                                      .beta_fast = 24, .beta_slow = 2, .mscale = 0.8, .mscale_all_dim = 0.5};
      rc.spec.seq_lens = {33000, 8, 0, 9000};
      rc.spec.qlen = 8;
      rc.spec.page_size = 64;
      rc.spec.kv_dtype = q_dtype == DType::bf16 ? DType::bf16 : DType::fp8_e4m3;
      rc.spec.seed = 77 + uint64_t(q_dtype == DType::bf16);
      rc.q_dtype = q_dtype;
      SCOPED_TRACE(rc.describe());
      check_pre(make_run(rc, 0));
    }
  }
}

// The real kimi-k3 dimensions once (D = 7168, Rq = 1536, 12 heads), merged gate.
TEST(CpuPre, FullSizeKimiK3) {
  testing::RandomCase rc;
  rc.spec.cfg = LayerConfig::preset("kimi-k3");
  rc.spec.seq_lens = {3000, 2};
  rc.spec.qlen = 2;
  rc.spec.page_size = 16;
  rc.spec.seed = 5;
  rc.q_head_pad = 16;
  SCOPED_TRACE(rc.describe());
  check_pre(make_run(rc, 0));
}

// The same inputs give bit-identical outputs.
TEST(CpuPre, Deterministic) {
  const testing::RandomCase rc = testing::random_case(4242, {.max_batch = 6, .max_context = 2000});
  const PreRun run = make_run(rc, 0);
  const int64_t S = run.sc.tokens();
  const int G = run.cfg.heads(), gate_dim = run.cfg.gate_dim();
  Layer layer(run.cfg, run.w, {.backend = Backend::cpu, .q_dtype = rc.q_dtype, .max_tokens = int(S)});
  std::vector<std::vector<uint8_t>> results;
  for (int rep = 0; rep < 2; ++rep) {
    Tensor q = Tensor::empty(rc.q_dtype, {S, G, run.cfg.row_dim()});
    Tensor gate = Tensor::empty(DType::bf16, {S, std::max(gate_dim, 1)});
    synth::Scenario sc = synth::make_scenario(rc.spec, run.w.k_scale);  // a fresh cache each time
    layer.pre(sc.hidden, sc.meta(), sc.kv(), {.q = q, .gate = gate_dim > 0 ? gate.view() : TensorView{}});
    std::vector<uint8_t> bytes = testing::snapshot(q);
    const std::vector<uint8_t> cache = testing::snapshot(sc.cache);
    bytes.insert(bytes.end(), cache.begin(), cache.end());
    if (gate_dim > 0) {
      const std::vector<uint8_t> g = testing::snapshot(gate);
      bytes.insert(bytes.end(), g.begin(), g.end());
    }
    results.push_back(std::move(bytes));
  }
  EXPECT_TRUE(results[0] == results[1]);
}

}  // namespace
}  // namespace mla
