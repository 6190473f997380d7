#include "mla/weights.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <span>

#include "mla/error.hpp"
#include "mla/formats.hpp"

namespace mla {

namespace {

const char* gate_name(GateLayout g) {
  switch (g) {
    case GateLayout::none: return "none";
    case GateLayout::merged: return "merged";
    case GateLayout::separate: return "separate";
  }
  return "?";
}

void require_size(const char* tensor, size_t actual, int64_t rows, int64_t cols, const char* shape) {
  const int64_t expected = rows * cols;
  MLA_REQUIRE(int64_t(actual) == expected, "prepare_weights: ", tensor, ": expected ", shape, " = [", rows,
              ", ", cols, "] = ", expected, " elements, got ", actual);
}

void require_scale(const char* name, float s) {
  MLA_REQUIRE(std::isfinite(s) && s > 0, "prepare_weights: ", name, ": expected a finite scale > 0, got ", s);
}

// A pre-quantized kv_b: [1, rows, L] with consistent buffers, no bf16 kv_b, and scales <= 252, the
// largest the project's packer makes: 6 * 2^(253-127) overflows float (0xFF is NaN).
void require_mxfp4_kv_b(const MxFp4Matrix& m, size_t bf16_size, int64_t rows, int64_t L) {
  MLA_REQUIRE(bf16_size == 0, "prepare_weights: kv_b: expected no bf16 tensor when kv_b_mxfp4 is given, got ",
              bf16_size, " elements");
  MLA_REQUIRE(m.batch == 1 && m.rows == rows && m.cols == L,
              "prepare_weights: kv_b_mxfp4: expected [1, N*(P+V), L] = [1, ", rows, ", ", L, "], got [", m.batch,
              ", ", m.rows, ", ", m.cols, "]");
  MLA_REQUIRE(int64_t(m.codes.size()) == rows * L / 2, "prepare_weights: kv_b_mxfp4.codes: expected [",
              rows, ", ", L / 2, "] = ", rows * L / 2, " bytes, got ", m.codes.size());
  MLA_REQUIRE(int64_t(m.scales.size()) == rows * L / kMxBlock, "prepare_weights: kv_b_mxfp4.scales: expected [",
              rows, ", ", L / kMxBlock, "] = ", rows * L / kMxBlock, " bytes, got ", m.scales.size());
  const int64_t blocks = L / kMxBlock;
  for (size_t i = 0; i < m.scales.size(); ++i) {
    MLA_REQUIRE(m.scales[i] <= 252, "prepare_weights: kv_b_mxfp4.scales[", int64_t(i) / blocks, ", ",
                int64_t(i) % blocks, "]: expected an E8M0 scale <= 252 (larger ones overflow float, 255 is NaN), got ",
                int(m.scales[i]));
  }
}

// Packs `batch` matrices [rows, cols] of MXFP4 whose element (b, r, c) is value(b, r, c); blocks of
// 32 run along cols, the dimension the product reduces over.
template <class Value>
MxFp4Matrix pack_mxfp4(int batch, int rows, int cols, Value value) {
  MxFp4Matrix m;
  m.batch = batch;
  m.rows = rows;
  m.cols = cols;
  const int64_t row_count = int64_t(batch) * rows;
  const int blocks = cols / kMxBlock;
  m.codes.resize(size_t(row_count) * cols / 2);
  m.scales.resize(size_t(row_count) * blocks);
#pragma omp parallel for schedule(static)
  for (int64_t br = 0; br < row_count; ++br) {
    const int b = int(br / rows), r = int(br % rows);
    std::array<float, kMxBlock> x;
    for (int k = 0; k < blocks; ++k) {
      for (int i = 0; i < kMxBlock; ++i) x[i] = value(b, r, k * kMxBlock + i);
      const size_t block = size_t(br) * blocks + k;
      quantize_mxfp4_block(x, std::span<uint8_t, kMxBlock / 2>(m.codes.data() + block * (kMxBlock / 2), kMxBlock / 2),
                           m.scales[block]);
    }
  }
  return m;
}

}  // namespace

float MxFp4Matrix::at(int b, int r, int c) const {
  const size_t row = size_t(b) * rows + r;
  return mxfp4_at(codes.data() + row * (cols / 2), scales.data() + row * (cols / kMxBlock), c);
}

PreparedWeights prepare_weights(const LayerConfig& cfg, const CheckpointWeights& ckpt) {
  cfg.validate();
  const int64_t D = cfg.hidden, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank, P = cfg.qk_nope_dim,
                R = cfg.qk_rope_dim, V = cfg.v_head_dim, N = cfg.heads();
  const int64_t base_rows = Rq + L + R, gate_rows = cfg.gate_dim();

  // Everything is checked before anything is built.
  if (cfg.gate == GateLayout::merged) {
    require_size("qkv_a", ckpt.qkv_a.size(), base_rows + gate_rows, D, "[Rq + L + R + N*V, D] (gate merged)");
  } else {
    require_size("qkv_a", ckpt.qkv_a.size(), base_rows, D,
                 cfg.gate == GateLayout::none ? "[Rq + L + R, D] (no gate)" : "[Rq + L + R, D] (gate separate)");
  }
  if (cfg.gate == GateLayout::separate) {
    require_size("g_proj", ckpt.g_proj.size(), gate_rows, D, "[N*V, D]");
  } else {
    MLA_REQUIRE(ckpt.g_proj.empty(), "prepare_weights: g_proj: expected no tensor with gate layout ",
                gate_name(cfg.gate), ", got ", ckpt.g_proj.size(), " elements");
  }
  require_size("q_a_norm", ckpt.q_a_norm.size(), 1, Rq, "[Rq]");
  require_size("kv_a_norm", ckpt.kv_a_norm.size(), 1, L, "[L]");
  require_size("q_b", ckpt.q_b.size(), N * (P + R), Rq, "[N*(P+R), Rq]");
  if (ckpt.kv_b_mxfp4) {
    require_mxfp4_kv_b(*ckpt.kv_b_mxfp4, ckpt.kv_b.size(), N * (P + V), L);
  } else {
    require_size("kv_b", ckpt.kv_b.size(), N * (P + V), L, "[N*(P+V), L]");
  }
  require_scale("q_scale", ckpt.q_scale);
  require_scale("k_scale", ckpt.k_scale);
  // MXFP4 would turn inf into a NaN block silently far from its source: name it here instead.
  for (size_t i = 0; i < ckpt.kv_b.size(); ++i) {
    MLA_REQUIRE((ckpt.kv_b[i] & 0x7F80) != 0x7F80, "prepare_weights: kv_b[", i / L, ", ", i % L,
                "]: expected a finite value, got bf16 bits 0x", std::hex, ckpt.kv_b[i]);
  }

  PreparedWeights w;
  w.qkv_a.reserve(size_t((base_rows + gate_rows) * D));
  w.qkv_a.assign(ckpt.qkv_a.begin(), ckpt.qkv_a.end());  // merged, none: [q_a | kv_a | k_pe (| gate)]
  if (cfg.gate == GateLayout::separate) w.qkv_a.insert(w.qkv_a.end(), ckpt.g_proj.begin(), ckpt.g_proj.end());
  w.q_a_norm.resize(Rq);
  for (int64_t i = 0; i < Rq; ++i) w.q_a_norm[i] = bf16_to_float(ckpt.q_a_norm[i]);
  w.kv_a_norm.resize(L);
  for (int64_t i = 0; i < L; ++i) w.kv_a_norm[i] = bf16_to_float(ckpt.kv_a_norm[i]);
  w.q_b = ckpt.q_b;

  // kv_b head n: rows n*(P+V) .. +P are W_UK[n] [P, L], the next V rows W_UV[n] [V, L].
  if (ckpt.kv_b_mxfp4) {
    // A checkpoint's MXFP4 kv_b has its blocks along L. W_UV reduces over L: its codes and scales
    // are taken as they are, bit for bit. W_UK reduces over P (SPEC.md: blocks along the reduced
    // dimension), so its blocks must be re-formed along P: the checkpoint's values are dequantized
    // exactly (E2M1 times a power of two is exact in float) and packed again, the one rounding of
    // an MXFP4 kv_b (a value whose new block has a larger amax can lose low bits or flush to 0).
    const MxFp4Matrix& kv_b = *ckpt.kv_b_mxfp4;
    w.w_uk = pack_mxfp4(int(N), int(L), int(P),
                        [&](int n, int l, int p) { return kv_b.at(0, int(n * (P + V) + p), l); });
    w.w_uv = MxFp4Matrix{.batch = int(N), .rows = int(V), .cols = int(L), .codes = {}, .scales = {}};
    w.w_uv.codes.reserve(size_t(N * V * L / 2));
    w.w_uv.scales.reserve(size_t(N * V * L / kMxBlock));
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = n * (P + V) + P;  // W_UV[n]'s first row: V rows of L/2 codes, L/32 scales
      w.w_uv.codes.insert(w.w_uv.codes.end(), kv_b.codes.begin() + row * L / 2,
                          kv_b.codes.begin() + (row + V) * L / 2);
      w.w_uv.scales.insert(w.w_uv.scales.end(), kv_b.scales.begin() + row * (L / kMxBlock),
                           kv_b.scales.begin() + (row + V) * (L / kMxBlock));
    }
  } else {
    const uint16_t* kv_b = ckpt.kv_b.data();
    auto kv_b_at = [=](int64_t row, int64_t col) { return bf16_to_float(kv_b[row * L + col]); };
    // W_UK stored transposed, [N, L, P], so that its blocks run along P (ql_nope reduces over P).
    w.w_uk = pack_mxfp4(int(N), int(L), int(P), [&](int n, int l, int p) { return kv_b_at(n * (P + V) + p, l); });
    w.w_uv = pack_mxfp4(int(N), int(V), int(L),
                        [&](int n, int v, int l) { return kv_b_at(n * (P + V) + P + v, l); });
  }
  w.q_scale = ckpt.q_scale;
  w.k_scale = ckpt.k_scale;
  return w;
}

// ---- synthetic weights ------------------------------------------------------------------------

namespace {

uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Counter-based: element i of stream `stream` depends on (seed, stream, i) only, so the values
// do not depend on the thread count and a tensor does not shift when another changes size.
struct Streams {
  uint64_t seed;
  uint64_t key(uint64_t stream) const { return mix64(seed ^ mix64(stream * 0x9E3779B97F4A7C15ull + 1)); }
  // Two 24-bit uniforms of draw `i`: u1 in (0, 1], u2 in [0, 1).
  static void uniforms(uint64_t key, uint64_t i, float& u1, float& u2) {
    const uint64_t r = mix64(key + i * 0x9E3779B97F4A7C15ull);
    u1 = float((r >> 40) + 1) * 0x1p-24f;
    u2 = float(r & 0xFFFFFF) * 0x1p-24f;
  }
};

enum Stream : uint64_t { kQkvA = 1, kGate, kQANorm, kKvANorm, kQB, kKvBK, kKvBV, kScales };

// n bf16 values N(0, stddev^2) appended to out (Box-Muller, two values per draw).
void append_normal(std::vector<uint16_t>& out, int64_t n, const Streams& s, Stream stream, float stddev) {
  const size_t base = out.size();
  out.resize(base + size_t(n));
  uint16_t* dst = out.data() + base;
  const uint64_t key = s.key(stream);
  const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pairs; ++i) {
    float u1, u2;
    Streams::uniforms(key, uint64_t(i), u1, u2);
    const float rad = stddev * std::sqrt(-2.0f * std::log(u1));
    const float angle = 6.28318530717958647692f * u2;
    dst[2 * i] = float_to_bf16(rad * std::cos(angle));
    if (2 * i + 1 < n) dst[2 * i + 1] = float_to_bf16(rad * std::sin(angle));
  }
}

// n bf16 values uniform in [lo, hi).
std::vector<uint16_t> uniform_bf16(int64_t n, const Streams& s, Stream stream, float lo, float hi) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  const uint64_t key = s.key(stream);
  for (int64_t i = 0; i < n; ++i) {
    float u1, u2;
    Streams::uniforms(key, uint64_t(i), u1, u2);
    out[i] = float_to_bf16(lo + (hi - lo) * u2);
  }
  return out;
}

}  // namespace

CheckpointWeights random_checkpoint_weights(const LayerConfig& cfg, uint64_t seed) {
  cfg.validate();
  const int64_t D = cfg.hidden, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank, P = cfg.qk_nope_dim,
                R = cfg.qk_rope_dim, V = cfg.v_head_dim, N = cfg.heads();
  const Streams s{seed};
  CheckpointWeights w;

  // y = hidden @ qkv_a^T with unit-RMS hidden rows: N(0, 1/D) gives unit-variance q_c, kv_c, k_pe
  // and gate logits. The gate rows come from their own stream, so the merged and separate layouts
  // of one seed hold the same gate and prepare to the same weights.
  w.qkv_a.reserve(size_t((Rq + L + R + cfg.gate_dim()) * D));
  append_normal(w.qkv_a, (Rq + L + R) * D, s, kQkvA, 1.0f / std::sqrt(float(D)));
  if (cfg.gate == GateLayout::merged) append_normal(w.qkv_a, N * V * D, s, kGate, 1.0f / std::sqrt(float(D)));
  if (cfg.gate == GateLayout::separate) append_normal(w.g_proj, N * V * D, s, kGate, 1.0f / std::sqrt(float(D)));
  w.q_a_norm = uniform_bf16(Rq, s, kQANorm, 0.9f, 1.1f);
  w.kv_a_norm = uniform_bf16(L, s, kKvANorm, 0.9f, 1.1f);
  // q = q_c @ q_b^T from unit-variance q_c: N(0, 1/Rq) keeps q_nope and q_pe at unit variance.
  append_normal(w.q_b, N * (P + R) * Rq, s, kQB, 1.0f / std::sqrt(float(Rq)));
  // kv_b head by head: W_UK rows N(0, 1/P) keep ql_nope = q_nope @ W_UK at unit variance. The W_UV
  // rows multiply o, a softmax average of cache rows whose entries shrink as attention spreads
  // over more keys; N(0, 4/L) keeps out near unit scale for moderately peaked attention.
  std::vector<uint16_t> k_part, v_part;
  append_normal(k_part, N * P * L, s, kKvBK, 1.0f / std::sqrt(float(P)));
  append_normal(v_part, N * V * L, s, kKvBV, 2.0f / std::sqrt(float(L)));
  w.kv_b.reserve(size_t(N * (P + V) * L));
  for (int64_t n = 0; n < N; ++n) {
    w.kv_b.insert(w.kv_b.end(), k_part.begin() + n * P * L, k_part.begin() + (n + 1) * P * L);
    w.kv_b.insert(w.kv_b.end(), v_part.begin() + n * V * L, v_part.begin() + (n + 1) * V * L);
  }

  // Query and cache rows have unit variance: amax about 6 sigma, 448 the largest fp8 value; a
  // random factor in [0.8, 1.25] (log-uniform) keeps the scales off powers of two.
  float u1, u2;
  Streams::uniforms(s.key(kScales), 0, u1, u2);
  const float lo = std::log(0.8f), hi = std::log(1.25f);
  w.q_scale = 6.0f / 448.0f * std::exp(lo + (hi - lo) * u1);
  w.k_scale = 6.0f / 448.0f * std::exp(lo + (hi - lo) * u2);
  return w;
}

}  // namespace mla
