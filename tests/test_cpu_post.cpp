// The CPU post stage against the float64 reference (tests/reference/post.cpp, ref::merge) from
// the same inputs: merged o (f32 / bf16, head- and row-padded views) and split partials with
// empty chunks, the three gate layouts (W = 1; the DCP tests cover W > 1). Values that post must
// not read (the o of empty partials, pads) hold NaN, so reading them shows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "mla/mla.hpp"
#include "reference/reference.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A float buffer (f32 or bf16) of n elements, NaN everywhere until set.
struct FloatBuffer {
  DType dtype;
  std::vector<uint8_t> bytes;
  FloatBuffer(DType dt, int64_t n) : dtype(dt), bytes(size_t(n) * dtype_size(dt)) {
    for (int64_t i = 0; i < n; ++i) set(i, kNaN);
  }
  // Stores x and returns the value as stored.
  double set(int64_t i, double x) {
    if (dtype == DType::f32) {
      reinterpret_cast<float*>(bytes.data())[i] = float(x);
      return float(x);
    }
    reinterpret_cast<uint16_t*>(bytes.data())[i] = float_to_bf16(float(x));
    return round_bf16(float(x));
  }
  void* data() { return bytes.data(); }
};

struct PostCase {
  int splits = 0;              // 0: merged o [S, G, L]; else partials [splits, S, G, L]
  DType o_dtype = DType::f32;
  int head_pad = 0;            // o / lse buffers have G + head_pad heads
  int row_pad = 0;             // extra elements per token row of o, gate and out
  double empty_fraction = 0;   // share of (chunk, token, head) partials with lse = -inf
};

void check_post(const testing::RandomCase& rc, const PostCase& pc, double tol) {
  const LayerConfig& cfg = rc.spec.cfg;
  const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, rc.spec.seed * 31 + 3));
  const synth::Scenario sc = synth::make_scenario(rc.spec, w.k_scale);
  const int64_t S = sc.tokens();
  const int N = cfg.heads(), L = cfg.kv_lora_rank, V = cfg.v_head_dim, G = N, gate_dim = cfg.gate_dim();
  const int chunks = std::max(pc.splits, 1);
  const int64_t hp = G + pc.head_pad, token_stride = hp * L + pc.row_pad, chunk_stride = S * token_stride;
  std::mt19937_64 rng(rc.spec.seed * 0x9E3779B97F4A7C15ull + 99);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0, 1);

  // o and lse: values only in this rank's heads; an empty partial's o stays NaN.
  FloatBuffer o(pc.o_dtype, chunks * chunk_stride);
  FloatBuffer lse(DType::f32, chunks * S * hp);
  std::vector<ref::AttendResult> parts(static_cast<size_t>(chunks));
  for (int c = 0; c < chunks; ++c) {
    ref::AttendResult& part = parts[size_t(c)];
    part.o.assign(size_t(S * G * L), 0.0);
    part.lse.assign(size_t(S * G), kNegInf);
    for (int64_t s = 0; s < S; ++s)
      for (int n = 0; n < N; ++n) {
        const int64_t h = n;
        const bool empty = uniform(rng) < pc.empty_fraction;
        part.lse[size_t(s * G + h)] = lse.set(c * S * hp + s * hp + h, empty ? kNegInf : 3 * normal(rng));
        if (empty) {
          // attend's merged o of an empty row is 0; an empty partial's o may be anything.
          if (pc.splits == 0)
            for (int l = 0; l < L; ++l) o.set(s * token_stride + h * L + l, 0.0);
          continue;
        }
        for (int l = 0; l < L; ++l)
          part.o[size_t((s * G + h) * L + l)] = o.set(c * chunk_stride + s * token_stride + h * L + l, normal(rng));
      }
  }
  AttendOutputs attn;
  if (pc.splits > 0) {
    attn.o = TensorView::strided(o.data(), pc.o_dtype, {pc.splits, S, G, L}, {chunk_stride, token_stride, L, 1});
    attn.lse = TensorView::strided(lse.data(), DType::f32, {pc.splits, S, G}, {S * hp, hp, 1});
  } else {
    attn.o = TensorView::strided(o.data(), pc.o_dtype, {S, G, L}, {token_stride, L, 1});
    attn.lse = TensorView::strided(lse.data(), DType::f32, {S, G}, {hp, 1});
  }

  // gate: sigmoid-like values in (0, 1); out poisoned, its pad kept.
  FloatBuffer gate(DType::bf16, S * (gate_dim + pc.row_pad));
  std::vector<double> gate_ref;
  TensorView gate_view;
  if (gate_dim > 0) {
    for (int64_t s = 0; s < S; ++s)
      for (int j = 0; j < gate_dim; ++j)
        gate_ref.push_back(gate.set(s * (gate_dim + pc.row_pad) + j, 1 / (1 + std::exp(-normal(rng)))));
    gate_view = TensorView::strided(gate.data(), DType::bf16, {S, gate_dim}, {gate_dim + pc.row_pad, 1});
  }
  const int64_t out_stride = int64_t(N) * V + pc.row_pad;
  std::vector<uint16_t> out_buf(size_t(S * out_stride), 0x1234);
  const TensorView out = TensorView::strided(out_buf.data(), DType::bf16, {S, int64_t(N) * V}, {out_stride, 1});
  testing::poison(out);

  Layer layer(cfg, w, {.backend = Backend::cpu, .max_tokens = int(std::max<int64_t>(S, 1))});
  layer.post(attn, gate_view, sc.meta(), out);

  EXPECT_EQ(testing::count_poison(out), 0) << "out elements left unwritten";
  size_t pad_changed = 0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t j = int64_t(N) * V; j < out_stride; ++j) pad_changed += out_buf[size_t(s * out_stride + j)] != 0x1234;
  EXPECT_EQ(pad_changed, 0u) << "out's row pad changed";

  const ref::AttendResult merged = pc.splits > 0 ? ref::merge(parts) : parts[0];
  std::vector<double> want = ref::post(cfg, ref::dequantize(cfg, w), merged, gate_ref, 0);
  for (double& x : want) x = round_bf16(float(x));
  const testing::Compare cmp = testing::compare(out, want.data());
  EXPECT_TRUE(cmp.ok(tol)) << "out: rel_l2 " << cmp.rel_l2 << " max_abs " << cmp.max_abs << " " << cmp.why;
}

testing::RandomCase small_case(uint64_t seed, int max_batch, int max_qlen) {
  // Short contexts: post does not read the cache, the scenario only supplies the step's metadata.
  return testing::random_case(seed, {.max_batch = max_batch, .max_context = 40, .max_qlen = max_qlen});
}

TEST(CpuPost, MergedRandomConfigs) {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    const testing::RandomCase rc = small_case(5000 + seed, 8, 8);
    const PostCase pc{.o_dtype = seed % 2 ? DType::f32 : DType::bf16, .head_pad = int(seed % 3) * 3,
                      .row_pad = int(seed % 4) * 5, .empty_fraction = seed % 3 == 0 ? 0.2 : 0.0};
    SCOPED_TRACE(rc.describe() + " o=" + dtype_name(pc.o_dtype));
    check_post(rc, pc, 4e-3);
  }
}

// Split partials merged in post, with empty chunks (lse = -inf, o = NaN) and all-empty rows.
TEST(CpuPost, SplitPartialsRandomConfigs) {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    const testing::RandomCase rc = small_case(6000 + seed, 8, 8);
    const PostCase pc{.splits = 1 + int(seed % 4), .o_dtype = seed % 3 ? DType::f32 : DType::bf16,
                      .head_pad = int(seed % 2) * 4, .row_pad = int(seed % 3) * 3,
                      .empty_fraction = seed % 4 == 0 ? 0.9 : 0.3};
    SCOPED_TRACE(rc.describe() + " splits=" + std::to_string(pc.splits) + " o=" + dtype_name(pc.o_dtype));
    check_post(rc, pc, 4e-3);
  }
}

// Every partial empty: o = 0 merged, out = 0 exactly, no NaN.
TEST(CpuPost, AllEmptyGivesZero) {
  const testing::RandomCase rc = small_case(7001, 4, 4);
  SCOPED_TRACE(rc.describe());
  check_post(rc, {.splits = 3, .empty_fraction = 1.0}, 0.0);
}

TEST(CpuPost, WideBatches) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const testing::RandomCase rc = small_case(8000 + seed, 64, 1);
    SCOPED_TRACE(rc.describe());
    check_post(rc, {.splits = int(seed % 2) * 2, .empty_fraction = 0.1}, 4e-3);
  }
}

TEST(CpuPost, FullSizeKimiK3) {
  testing::RandomCase rc;
  rc.spec.cfg = LayerConfig::preset("kimi-k3");
  rc.spec.seq_lens = {10, 3, 0};
  rc.spec.qlen = 3;
  rc.spec.seed = 11;
  SCOPED_TRACE(rc.describe());
  check_post(rc, {.splits = 2, .o_dtype = DType::bf16, .empty_fraction = 0.2}, 4e-3);
}

}  // namespace
}  // namespace mla
