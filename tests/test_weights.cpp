// Weight preparation: kv_b absorption into W_UK / W_UV (MXFP4), the three gate layouts, validation
// messages, and the synthetic checkpoint generator.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "mla/weights.hpp"

namespace mla {
namespace {

// Small but uneven: 3 heads per rank, P != V, L spanning two MXFP4 blocks.
LayerConfig tiny_config(GateLayout gate) {
  LayerConfig c;
  c.name = "tiny";
  c.hidden = 64;
  c.q_lora_rank = 48;
  c.kv_lora_rank = 64;
  c.qk_nope_dim = 32;
  c.qk_rope_dim = 8;
  c.v_head_dim = 32;
  c.total_heads = 6;
  c.tp_size = 2;
  c.gate = gate;
  return c;
}

// Expects prepare_weights to throw mla::Error whose message contains every one of `parts`.
void expect_rejected(const LayerConfig& cfg, const CheckpointWeights& ckpt, std::initializer_list<std::string> parts) {
  try {
    prepare_weights(cfg, ckpt);
    ADD_FAILURE() << "accepted, expected an error mentioning " << *parts.begin();
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// The same value must come out of W_UK / W_UV for every element: exact where the kv_b values are
// representable, else the MXFP4 quantization of the block of kv_b entries the element belongs to.
TEST(Weights, AbsorptionExactOnRepresentableValues) {
  const LayerConfig cfg = tiny_config(GateLayout::none);
  const int N = cfg.heads(), P = cfg.qk_nope_dim, V = cfg.v_head_dim, L = cfg.kv_lora_rank;
  CheckpointWeights ckpt = random_checkpoint_weights(cfg, 11);
  // E2M1 values, with a +-6 at (r, c) whenever r % 32 == c % 32: every block along P (fixed
  // column, 32 consecutive rows) and along L (fixed row, 32 consecutive columns) then has
  // amax 6, scale 2^0, and holds its values exactly. The codes vary with row and column, so a
  // swapped head, an off-by-P row or a missing transpose changes the values seen.
  for (int r = 0; r < N * (P + V); ++r) {
    for (int c = 0; c < L; ++c) {
      const uint8_t code = r % 32 == c % 32 ? uint8_t(0x7 | ((r & 1) << 3)) : uint8_t((r * 7 + c * 3 + r / 5) % 16);
      ckpt.kv_b[size_t(r) * L + c] = float_to_bf16(e2m1_to_float(code));
    }
  }
  const PreparedWeights w = prepare_weights(cfg, ckpt);
  ASSERT_EQ(w.w_uk.batch, N);
  ASSERT_EQ(w.w_uk.rows, L);
  ASSERT_EQ(w.w_uk.cols, P);
  ASSERT_EQ(w.w_uv.batch, N);
  ASSERT_EQ(w.w_uv.rows, V);
  ASSERT_EQ(w.w_uv.cols, L);
  ASSERT_EQ(w.w_uk.codes.size(), size_t(N) * L * P / 2);
  ASSERT_EQ(w.w_uk.scales.size(), size_t(N) * L * P / 32);
  ASSERT_EQ(w.w_uv.codes.size(), size_t(N) * V * L / 2);
  ASSERT_EQ(w.w_uv.scales.size(), size_t(N) * V * L / 32);
  for (uint8_t s : w.w_uk.scales) ASSERT_EQ(s, 127);
  for (uint8_t s : w.w_uv.scales) ASSERT_EQ(s, 127);
  auto kv_b = [&](int row, int col) { return bf16_to_float(ckpt.kv_b[size_t(row) * L + col]); };
  for (int n = 0; n < N; ++n) {
    for (int l = 0; l < L; ++l) {
      for (int p = 0; p < P; ++p) ASSERT_EQ(w.w_uk.at(n, l, p), kv_b(n * (P + V) + p, l)) << n << " " << l << " " << p;
    }
    for (int v = 0; v < V; ++v) {
      for (int l = 0; l < L; ++l) ASSERT_EQ(w.w_uv.at(n, v, l), kv_b(n * (P + V) + P + v, l)) << n << " " << v << " " << l;
    }
  }
}

TEST(Weights, AbsorptionMatchesBlockQuantization) {
  const LayerConfig cfg = tiny_config(GateLayout::merged);
  const int N = cfg.heads(), P = cfg.qk_nope_dim, V = cfg.v_head_dim, L = cfg.kv_lora_rank;
  CheckpointWeights ckpt = random_checkpoint_weights(cfg, 12);
  // Magnitudes varying by row and by 32-column block, so that neighbouring blocks get different
  // scales (a scale read from the wrong block shows), and some exact zeros.
  for (int r = 0; r < N * (P + V); ++r) {
    for (int c = 0; c < L; ++c) {
      uint16_t& x = ckpt.kv_b[size_t(r) * L + c];
      const int shift = (r * 5 + (c / 32) * 3) % 13 - 6;
      x = (r + c) % 17 == 0 ? uint16_t(0) : float_to_bf16(std::ldexp(bf16_to_float(x), shift));
    }
  }
  const PreparedWeights w = prepare_weights(cfg, ckpt);
  auto kv_b = [&](int row, int col) { return bf16_to_float(ckpt.kv_b[size_t(row) * L + col]); };
  // Quantizes the 32 values value(0..31) and returns element i, dequantized.
  auto quantized = [](const std::function<float(int)>& value, int i) {
    std::array<float, kMxBlock> x;
    for (int k = 0; k < kMxBlock; ++k) x[k] = value(k);
    std::array<uint8_t, kMxBlock / 2> codes;
    uint8_t scale;
    quantize_mxfp4_block(x, codes, scale);
    return mxfp4_at(codes.data(), &scale, i);
  };
  for (int n = 0; n < N; ++n) {
    for (int l = 0; l < L; ++l) {
      for (int p = 0; p < P; ++p) {
        const int p0 = p / kMxBlock * kMxBlock;
        const float expect = quantized([&](int k) { return kv_b(n * (P + V) + p0 + k, l); }, p - p0);
        ASSERT_EQ(w.w_uk.at(n, l, p), expect) << "W_UK " << n << " " << l << " " << p;
      }
    }
    for (int v = 0; v < V; ++v) {
      for (int l = 0; l < L; ++l) {
        const int l0 = l / kMxBlock * kMxBlock;
        const float expect = quantized([&](int k) { return kv_b(n * (P + V) + P + v, l0 + k); }, l - l0);
        ASSERT_EQ(w.w_uv.at(n, v, l), expect) << "W_UV " << n << " " << v << " " << l;
      }
    }
  }
}

// The merged, separate and absent gate layouts prepare to one form: [q_a | kv_a | k_pe | gate].
TEST(Weights, GateLayoutsGiveTheSamePreparedForm) {
  const LayerConfig merged = tiny_config(GateLayout::merged);
  const LayerConfig separate = tiny_config(GateLayout::separate);
  const LayerConfig none = tiny_config(GateLayout::none);
  const int64_t D = merged.hidden;
  const int64_t base = int64_t(merged.q_lora_rank + merged.kv_lora_rank + merged.qk_rope_dim) * D;
  const CheckpointWeights m = random_checkpoint_weights(merged, 21);
  ASSERT_EQ(int64_t(m.qkv_a.size()), base + int64_t(merged.gate_dim()) * D);
  CheckpointWeights s = m;  // the same gate rows, moved to g_proj
  s.g_proj.assign(m.qkv_a.begin() + base, m.qkv_a.end());
  s.qkv_a.resize(size_t(base));
  CheckpointWeights n = s;
  n.g_proj.clear();

  const PreparedWeights pm = prepare_weights(merged, m);
  const PreparedWeights ps = prepare_weights(separate, s);
  const PreparedWeights pn = prepare_weights(none, n);
  EXPECT_EQ(pm.qkv_a, m.qkv_a);
  EXPECT_EQ(ps.qkv_a, pm.qkv_a);
  EXPECT_EQ(int64_t(ps.qkv_a.size()), int64_t(separate.qkv_a_rows()) * D);
  EXPECT_EQ(pn.qkv_a, n.qkv_a);
  EXPECT_EQ(int64_t(pn.qkv_a.size()), int64_t(none.qkv_a_rows()) * D);
  for (const PreparedWeights* p : {&ps, &pn}) {
    EXPECT_EQ(p->q_a_norm, pm.q_a_norm);
    EXPECT_EQ(p->kv_a_norm, pm.kv_a_norm);
    EXPECT_EQ(p->q_b, pm.q_b);
    EXPECT_EQ(p->w_uk.codes, pm.w_uk.codes);
    EXPECT_EQ(p->w_uk.scales, pm.w_uk.scales);
    EXPECT_EQ(p->w_uv.codes, pm.w_uv.codes);
    EXPECT_EQ(p->w_uv.scales, pm.w_uv.scales);
    EXPECT_EQ(p->q_scale, pm.q_scale);
    EXPECT_EQ(p->k_scale, pm.k_scale);
  }
  for (int64_t i = 0; i < merged.q_lora_rank; ++i) EXPECT_EQ(pm.q_a_norm[i], bf16_to_float(m.q_a_norm[i]));
  for (int64_t i = 0; i < merged.kv_lora_rank; ++i) EXPECT_EQ(pm.kv_a_norm[i], bf16_to_float(m.kv_a_norm[i]));

  // The generator draws the gate from its own stream: merged and separate of one seed agree.
  const PreparedWeights gs = prepare_weights(separate, random_checkpoint_weights(separate, 21));
  EXPECT_EQ(gs.qkv_a, pm.qkv_a);
  const CheckpointWeights gn = random_checkpoint_weights(none, 21);
  EXPECT_TRUE(gn.g_proj.empty());
  EXPECT_EQ(gn.qkv_a, n.qkv_a);
}

TEST(Weights, BadShapesAreRejectedNamingTheTensor) {
  for (GateLayout gate : {GateLayout::none, GateLayout::merged, GateLayout::separate}) {
    const LayerConfig cfg = tiny_config(gate);
    const CheckpointWeights good = random_checkpoint_weights(cfg, 31);
    EXPECT_NO_THROW(prepare_weights(cfg, good));
    auto shrunk = [&](std::vector<uint16_t> CheckpointWeights::*t) {
      CheckpointWeights c = good;
      (c.*t).pop_back();
      return c;
    };
    auto grown = [&](std::vector<uint16_t> CheckpointWeights::*t) {
      CheckpointWeights c = good;
      (c.*t).push_back(0);
      return c;
    };
    const int64_t D = cfg.hidden, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank;
    const int64_t qkv = int64_t(cfg.qkv_a_rows() - (gate == GateLayout::separate ? cfg.gate_dim() : 0)) * D;
    expect_rejected(cfg, shrunk(&CheckpointWeights::qkv_a), {"qkv_a", std::to_string(qkv), std::to_string(qkv - 1)});
    expect_rejected(cfg, grown(&CheckpointWeights::qkv_a), {"qkv_a", std::to_string(qkv + 1)});
    expect_rejected(cfg, shrunk(&CheckpointWeights::q_a_norm), {"q_a_norm", std::to_string(Rq), std::to_string(Rq - 1)});
    expect_rejected(cfg, grown(&CheckpointWeights::kv_a_norm), {"kv_a_norm", std::to_string(L), std::to_string(L + 1)});
    const int64_t q_b = int64_t(cfg.heads()) * cfg.qk_head_dim() * Rq;
    expect_rejected(cfg, shrunk(&CheckpointWeights::q_b), {"q_b", std::to_string(q_b), std::to_string(q_b - 1)});
    const int64_t kv_b = int64_t(cfg.heads()) * (cfg.qk_nope_dim + cfg.v_head_dim) * L;
    expect_rejected(cfg, grown(&CheckpointWeights::kv_b), {"kv_b", std::to_string(kv_b), std::to_string(kv_b + 1)});
    if (gate == GateLayout::separate) {
      const int64_t g = int64_t(cfg.gate_dim()) * D;
      expect_rejected(cfg, shrunk(&CheckpointWeights::g_proj), {"g_proj", std::to_string(g), std::to_string(g - 1)});
      CheckpointWeights c = good;
      c.g_proj.clear();
      expect_rejected(cfg, c, {"g_proj", "got 0"});
    } else {
      // A g_proj the config does not expect is a config / checkpoint mismatch, not ignored.
      CheckpointWeights c = good;
      c.g_proj.assign(size_t(cfg.heads() * cfg.v_head_dim * D), 0);
      expect_rejected(cfg, c, {"g_proj"});
    }
  }
  // Merged weights prepared as separate: qkv_a has the gate rows too many.
  const LayerConfig merged = tiny_config(GateLayout::merged);
  expect_rejected(tiny_config(GateLayout::separate), random_checkpoint_weights(merged, 32), {"qkv_a"});
  // The config itself is validated first.
  LayerConfig bad = merged;
  bad.qk_nope_dim = 40;
  expect_rejected(bad, random_checkpoint_weights(merged, 33), {"qk_nope_dim"});
}

TEST(Weights, BadScalesAndValuesAreRejected) {
  const LayerConfig cfg = tiny_config(GateLayout::merged);
  const CheckpointWeights good = random_checkpoint_weights(cfg, 41);
  for (float bad : {0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY}) {
    CheckpointWeights c = good;
    c.q_scale = bad;
    expect_rejected(cfg, c, {"q_scale"});
    c = good;
    c.k_scale = bad;
    expect_rejected(cfg, c, {"k_scale"});
  }
  // A non-finite kv_b entry would vanish into a NaN MXFP4 block: rejected with its position.
  for (uint16_t bits : {uint16_t(0x7F80), uint16_t(0xFF80), uint16_t(0x7FC1)}) {
    CheckpointWeights c = good;
    c.kv_b[size_t(5) * cfg.kv_lora_rank + 7] = bits;
    expect_rejected(cfg, c, {"kv_b[5, 7]"});
  }
}

// Mean and standard deviation of bf16 values.
std::pair<double, double> moments(const std::vector<uint16_t>& v) {
  double sum = 0, sq = 0;
  for (uint16_t b : v) {
    const double x = bf16_to_float(b);
    sum += x;
    sq += x * x;
  }
  const double mean = sum / double(v.size());
  return {mean, std::sqrt(sq / double(v.size()) - mean * mean)};
}

TEST(Weights, RandomWeightsAreDeterministicAndScaled) {
  for (GateLayout gate : {GateLayout::merged, GateLayout::separate}) {
    LayerConfig cfg = tiny_config(gate);
    cfg.hidden = 256;
    cfg.q_lora_rank = 128;
    const CheckpointWeights a = random_checkpoint_weights(cfg, 51);
    const CheckpointWeights b = random_checkpoint_weights(cfg, 51);
    const CheckpointWeights c = random_checkpoint_weights(cfg, 52);
    EXPECT_EQ(a.qkv_a, b.qkv_a);
    EXPECT_EQ(a.g_proj, b.g_proj);
    EXPECT_EQ(a.q_a_norm, b.q_a_norm);
    EXPECT_EQ(a.kv_a_norm, b.kv_a_norm);
    EXPECT_EQ(a.q_b, b.q_b);
    EXPECT_EQ(a.kv_b, b.kv_b);
    EXPECT_EQ(a.q_scale, b.q_scale);
    EXPECT_EQ(a.k_scale, b.k_scale);
    EXPECT_NE(a.qkv_a, c.qkv_a);
    EXPECT_NE(a.q_b, c.q_b);
    EXPECT_NE(a.kv_b, c.kv_b);
    EXPECT_NE(a.q_scale, c.q_scale);
    EXPECT_NO_THROW(prepare_weights(cfg, a));

    const int D = cfg.hidden, Rq = cfg.q_lora_rank, P = cfg.qk_nope_dim, V = cfg.v_head_dim;
    const int L = cfg.kv_lora_rank, N = cfg.heads();
    auto [qkv_mean, qkv_std] = moments(a.qkv_a);
    EXPECT_NEAR(qkv_mean, 0.0, 0.05 / std::sqrt(D));
    EXPECT_NEAR(qkv_std * std::sqrt(D), 1.0, 0.03);
    auto [qb_mean, qb_std] = moments(a.q_b);
    EXPECT_NEAR(qb_std * std::sqrt(Rq), 1.0, 0.03);
    for (const auto* norm : {&a.q_a_norm, &a.kv_a_norm}) {
      for (uint16_t x : *norm) {
        EXPECT_GE(bf16_to_float(x), 0.89f);
        EXPECT_LE(bf16_to_float(x), 1.11f);
      }
      EXPECT_NEAR(moments(*norm).first, 1.0, 0.02);
    }
    // kv_b head by head: the K rows N(0, 1/P), the V rows N(0, 4/L).
    std::vector<uint16_t> k_rows, v_rows;
    for (int n = 0; n < N; ++n) {
      const auto head = a.kv_b.begin() + int64_t(n) * (P + V) * L;
      k_rows.insert(k_rows.end(), head, head + int64_t(P) * L);
      v_rows.insert(v_rows.end(), head + int64_t(P) * L, head + int64_t(P + V) * L);
    }
    EXPECT_NEAR(moments(k_rows).second * std::sqrt(P), 1.0, 0.05);
    EXPECT_NEAR(moments(v_rows).second * std::sqrt(L) / 2, 1.0, 0.05);
    for (float s : {a.q_scale, a.k_scale, c.q_scale, c.k_scale}) {
      EXPECT_GE(s, 6.0f / 448.0f * 0.8f * 0.999f);
      EXPECT_LE(s, 6.0f / 448.0f * 1.25f * 1.001f);
    }
    EXPECT_NE(a.q_scale, a.k_scale);
  }
}

// The real dimensions: every preset generates and prepares, with the documented shapes.
TEST(Weights, PresetsPrepareWithDocumentedShapes) {
  for (const std::string& name : LayerConfig::preset_names()) {
    const LayerConfig cfg = LayerConfig::preset(name);
    const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, 61));
    const int64_t N = cfg.heads(), L = cfg.kv_lora_rank, P = cfg.qk_nope_dim, V = cfg.v_head_dim;
    EXPECT_EQ(int64_t(w.qkv_a.size()), int64_t(cfg.qkv_a_rows()) * cfg.hidden) << name;
    EXPECT_EQ(int64_t(w.q_b.size()), N * cfg.qk_head_dim() * cfg.q_lora_rank) << name;
    EXPECT_EQ(int64_t(w.w_uk.codes.size()), N * L * P / 2) << name;
    EXPECT_EQ(int64_t(w.w_uv.scales.size()), N * V * L / 32) << name;
    for (uint8_t s : w.w_uk.scales) ASSERT_TRUE(s > 100 && s < 140) << name << ": scale " << int(s);
  }
}

}  // namespace
}  // namespace mla
