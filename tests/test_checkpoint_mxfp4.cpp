// Checkpoints whose kv_b is already MXFP4, in the gpt-oss layout Hugging Face transformers reads:
// kv_b_proj.weight_blocks U8 [rows, L/32, 16] + kv_b_proj.weight_scales U8 [rows, L/32]. W_UV's codes
// and scales must reach the prepared weights bit for bit; W_UK is the project's own packing (blocks
// along P) of the exactly dequantized rows; a step on loaded weights equals one built in memory; each
// malformed MXFP4 tensor is its own error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "core/checkpoint/safetensors.hpp"
#include "core/synthetic.hpp"
#include "mla/checkpoint.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "mla/layer.hpp"
#include "support/checkpoint_tests.hpp"
#include "support/checkpoint_writer.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

using testing::CheckpointSpec;
using testing::error_of;

#define EXPECT_ERROR_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg)

LayerConfig small_model(int heads, GateLayout gate) {
  LayerConfig c = testing::tiny_model(heads, RopeType::yarn, gate);
  c.qk_nope_dim = 64;  // two MXFP4 blocks along P, the blocks W_UK is re-packed in
  c.validate();
  return c;
}

// E2M1 times 2^(e-127), decoded from first principles (not through formats.hpp).
float mx_decode(const MxFp4Matrix& m, int64_t row, int64_t col) {
  const uint8_t byte = m.codes[size_t(row * (m.cols / 2) + col / 2)];
  const int code = (col % 2) ? byte >> 4 : byte & 0xF;
  static const float kMag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  const float mag = kMag[code & 7] * std::ldexp(1.0f, int(m.scales[size_t(row * (m.cols / 32) + col / 32)]) - 127);
  return (code & 8) ? -mag : mag;
}

// Random codes (every E2M1 code) and scales: mostly 2^-6..2^-4, which gives entries of about the
// size of a trained layer's (RMS 0.05..0.18; `mla run --check` then holds its tolerances), with a few
// far-off exponents (code 0: 2^-127; 2^-2) mixed in. The spread makes W_UK's re-packing along P
// round: its new blocks gather 32 rows of different scales.
MxFp4Matrix random_kv_b(int64_t rows, int64_t L, uint64_t seed) {
  std::mt19937_64 rng(seed);
  MxFp4Matrix m{.batch = 1, .rows = int(rows), .cols = int(L), .codes = {}, .scales = {}};
  m.codes.resize(size_t(rows * L / 2));
  m.scales.resize(size_t(rows * L / 32));
  for (auto& c : m.codes) c = uint8_t(rng());
  for (auto& s : m.scales) {
    const uint64_t r = rng() % 1000;
    s = r == 0 ? 0 : r == 1 ? uint8_t(125) : uint8_t(121 + rng() % 3);
  }
  return m;
}

// Rows [row0, row0 + n) of m.
MxFp4Matrix rows_of(const MxFp4Matrix& m, int64_t row0, int64_t n) {
  const int64_t cb = m.cols / 2, sb = m.cols / 32;
  MxFp4Matrix s{.batch = 1, .rows = int(n), .cols = m.cols, .codes = {}, .scales = {}};
  s.codes.assign(m.codes.begin() + row0 * cb, m.codes.begin() + (row0 + n) * cb);
  s.scales.assign(m.scales.begin() + row0 * sb, m.scales.begin() + (row0 + n) * sb);
  return s;
}

// The tensors of one .safetensors file, editable, written back by write().
struct FileTensors {
  struct T {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, T> t;

  static DType dtype_of(const std::string& tag) {
    if (tag == "BF16") return DType::bf16;
    if (tag == "F16") return DType::f16;
    if (tag == "F32") return DType::f32;
    if (tag == "F8_E4M3") return DType::fp8_e4m3;
    if (tag == "U8") return DType::u8;
    detail::fail("FileTensors: unexpected dtype ", tag);
  }
  explicit FileTensors(const std::string& path) {
    const safetensors::File file(path);
    for (const auto& i : file.header().tensors) {
      const auto b = file.bytes(i);
      t[i.name] = T{dtype_of(i.dtype), i.shape, std::vector<uint8_t>(b.begin(), b.end())};
    }
  }  // unmapped here, before anything rewrites the file
  void write(const std::string& path) const {
    safetensors::Writer wr;
    for (const auto& [name, x] : t) wr.add_bytes(name, x.dtype, x.shape, x.bytes.data());
    wr.write(path);
  }
};

// A checkpoint of spec.cfg (all heads) whose kv_b is `kv_b` in MXFP4 (layer spec.layer; the next
// layer gets the negated codes), the other weights from `w`. Returns what load_layer must give for
// tp 1 (kv_b empty, kv_b_mxfp4 = kv_b). shards 2: an index sends the MXFP4 tensors to a second file.
CheckpointWeights write_mxfp4_checkpoint(const std::string& dir, const CheckpointSpec& spec,
                                         const CheckpointWeights& w, const MxFp4Matrix& kv_b, int shards = 1) {
  CheckpointSpec one = spec;
  one.shards = 1;
  CheckpointWeights out = testing::write_checkpoint(dir, one, w);
  out.kv_b.clear();
  out.kv_b_mxfp4 = kv_b;
  const int64_t rows = kv_b.rows, nb = kv_b.cols / 32;
  FileTensors main(dir + "/model.safetensors"), mx(dir + "/model.safetensors");
  mx.t.clear();
  for (int layer : {spec.layer, spec.layer + 1}) {
    const std::string base = spec.prefix + "layers." + std::to_string(layer) + ".self_attn.kv_b_proj.weight";
    main.t.erase(base);
    std::vector<uint8_t> codes = kv_b.codes;
    if (layer != spec.layer)
      for (auto& c : codes) c ^= 0x88;  // both nibbles negated
    mx.t[base + "_blocks"] = {DType::u8, {rows, nb, 16}, codes};
    mx.t[base + "_scales"] = {DType::u8, {rows, nb}, kv_b.scales};
  }
  if (shards == 1) {
    main.t.insert(mx.t.begin(), mx.t.end());
    main.write(dir + "/model.safetensors");
    return out;
  }
  std::filesystem::remove(dir + "/model.safetensors");
  const std::string f1 = "model-00001-of-00002.safetensors", f2 = "model-00002-of-00002.safetensors";
  main.write(dir + "/" + f1);
  mx.write(dir + "/" + f2);
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [name, x] : main.t) map[name] = f1;
  for (const auto& [name, x] : mx.t) map[name] = f2;
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"metadata", {}}, {"weight_map", map}}.dump();
  return out;
}

// What load_layer(.., tp, rank) must give: the rank's rows of `w` and of the MXFP4 kv_b.
CheckpointWeights slice_heads(const LayerConfig& full, const CheckpointWeights& w, const MxFp4Matrix& kv_b, int tp,
                              int rank) {
  const int64_t head_rows = full.qk_nope_dim + full.v_head_dim, N = full.total_heads / tp;
  CheckpointWeights dense = w;  // testing::slice_heads slices a bf16 kv_b: give it a placeholder
  dense.kv_b_mxfp4.reset();
  dense.kv_b.assign(size_t(kv_b.rows) * size_t(kv_b.cols), 0);
  CheckpointWeights s = testing::slice_heads(full, dense, tp, rank);
  s.kv_b.clear();
  s.kv_b_mxfp4 = rows_of(kv_b, rank * N * head_rows, N * head_rows);
  return s;
}

struct Fixture {
  CheckpointSpec spec;
  CheckpointWeights written;  // all heads
  MxFp4Matrix kv_b;           // all heads, [H*(P+V), L]
  std::string dir;
};

Fixture make_fixture(const std::string& name, int heads, GateLayout gate, uint64_t seed, int shards = 1) {
  Fixture f;
  f.spec.cfg = small_model(heads, gate);
  f.spec.layer = 1;
  f.dir = testing::fresh_dir("mxfp4_" + name);
  const LayerConfig& c = f.spec.cfg;
  f.kv_b = random_kv_b(int64_t(c.total_heads) * (c.qk_nope_dim + c.v_head_dim), c.kv_lora_rank, seed);
  f.written = write_mxfp4_checkpoint(f.dir, f.spec, random_checkpoint_weights(c, seed), f.kv_b, shards);
  return f;
}

// Each rank's kv_b_mxfp4 is its heads' rows of what was written, byte for byte; W_UV's prepared codes
// and scales are those bytes; W_UK is the project's packing of the exactly dequantized W_UK rows.
TEST(CheckpointMxfp4, HeadSlicesKeepCodesAndScalesAndWukIsRepackedAlongP) {
  for (const int shards : {1, 2}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    const Fixture f = make_fixture("slices" + std::to_string(shards), 4, GateLayout::none, 100 + shards, shards);
    const int tp = 2;
    const int64_t L = f.spec.cfg.kv_lora_rank, P = f.spec.cfg.qk_nope_dim, V = f.spec.cfg.v_head_dim;
    const int64_t N = f.spec.cfg.total_heads / tp;
    int64_t rerounded = 0, wuk_elems = 0;
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const CheckpointLayer got = load_layer(f.dir, f.spec.layer, tp, rank);
      EXPECT_TRUE(got.weights.kv_b.empty());
      ASSERT_TRUE(got.weights.kv_b_mxfp4.has_value());
      const MxFp4Matrix& mx = *got.weights.kv_b_mxfp4;
      const CheckpointWeights slice = slice_heads(f.spec.cfg, f.written, f.kv_b, tp, rank);
      const MxFp4Matrix& want = *slice.kv_b_mxfp4;
      EXPECT_EQ(mx.batch, 1);
      EXPECT_EQ(mx.rows, N * (P + V));
      EXPECT_EQ(mx.cols, L);
      ASSERT_EQ(mx.codes, want.codes);
      ASSERT_EQ(mx.scales, want.scales);
      // The other weights are the rank's rows as before.
      EXPECT_EQ(got.weights.q_b, slice.q_b);
      EXPECT_EQ(got.weights.qkv_a, slice.qkv_a);
      EXPECT_EQ(got.weights.q_scale, slice.q_scale);

      const PreparedWeights pw = prepare_weights(got.config, got.weights);
      ASSERT_EQ(pw.w_uv.batch, N);
      ASSERT_EQ(pw.w_uv.rows, V);
      ASSERT_EQ(pw.w_uv.cols, L);
      for (int64_t n = 0; n < N; ++n) {
        const MxFp4Matrix uv = rows_of(want, n * (P + V) + P, V);
        ASSERT_EQ(0, std::memcmp(pw.w_uv.codes.data() + n * V * L / 2, uv.codes.data(), size_t(V * L / 2)))
            << "W_UV codes of head " << n;
        ASSERT_EQ(0, std::memcmp(pw.w_uv.scales.data() + n * V * L / 32, uv.scales.data(), size_t(V * L / 32)))
            << "W_UV scales of head " << n;
      }
      EXPECT_EQ(pw.w_uv.codes.size(), size_t(N * V * L / 2));
      EXPECT_EQ(pw.w_uv.scales.size(), size_t(N * V * L / 32));

      // W_UK: the same weights with kv_b as the exactly dequantized bf16 rows (every E2M1 times a
      // power of two >= 2^-128 is a bf16) go through the bf16 packer.
      CheckpointWeights dense = got.weights;
      dense.kv_b_mxfp4.reset();
      dense.kv_b.resize(size_t(N * (P + V) * L));
      for (int64_t r = 0; r < N * (P + V); ++r)
        for (int64_t l = 0; l < L; ++l) {
          const float x = mx_decode(want, r, l);
          ASSERT_EQ(bf16_to_float(float_to_bf16(x)), x);
          dense.kv_b[size_t(r * L + l)] = float_to_bf16(x);
        }
      const PreparedWeights pd = prepare_weights(got.config, dense);
      EXPECT_EQ(pw.w_uk.batch, pd.w_uk.batch);
      EXPECT_EQ(pw.w_uk.rows, L);
      EXPECT_EQ(pw.w_uk.cols, P);
      ASSERT_EQ(pw.w_uk.codes, pd.w_uk.codes);
      ASSERT_EQ(pw.w_uk.scales, pd.w_uk.scales);
      // Packing the dequantized W_UV along its own blocks gives the same values (maybe other codes).
      for (int64_t n = 0; n < N; ++n)
        for (int64_t v = 0; v < V; ++v)
          for (int64_t l = 0; l < L; ++l)
            ASSERT_EQ(pw.w_uv.at(int(n), int(v), int(l)), pd.w_uv.at(int(n), int(v), int(l)));
      // The one re-rounding is real: some W_UK values differ from the checkpoint's.
      for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t p = 0; p < P; ++p) {
            ++wuk_elems;
            rerounded += pw.w_uk.at(int(n), int(l), int(p)) != mx_decode(want, n * (P + V) + p, l);
          }
    }
    EXPECT_GT(rerounded, 0) << "of " << wuk_elems;
  }
}

// A decode step on loaded MXFP4 weights equals one on the same weights built in memory.
TEST(CheckpointMxfp4, StepOnLoadedWeightsEqualsInMemoryWeights) {
  const Fixture f = make_fixture("step", 4, GateLayout::separate, 7, 2);
  const int tp = 2, rank = 1;
  const LayerConfig& full = f.spec.cfg;
  const CheckpointLayer loaded = load_layer(f.dir, f.spec.layer, tp, rank);

  LayerConfig mem_cfg = full;
  mem_cfg.tp_size = tp;
  const CheckpointWeights mem = slice_heads(full, f.written, f.kv_b, tp, rank);
  testing::expect_same_step(loaded.config, loaded.weights, mem_cfg, mem);
}

// `mla run --checkpoint` on an MXFP4 kv_b: every rank's step passes --check (fp8 query and cache).
TEST(CheckpointMxfp4, CliRunChecksEveryRank) {
  const std::string mla = std::string(MLA_BINARY_DIR) + "/mla";
  if (!std::filesystem::exists(mla)) GTEST_SKIP() << "the mla command is not built at " << mla;
  const Fixture f = make_fixture("cli", 4, GateLayout::separate, 11, 2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = f.dir + "/run" + std::to_string(rank) + ".txt";
    const std::string run = "'" + mla + "' run --checkpoint '" + f.dir + "' --layer 1 --tp 2 --rank " +
                            std::to_string(rank) + " --backend cpu --threads 1 --context 300,17 --qlen 2" +
                            " --page-size 16 --check > '" + log + "' 2>&1";
    EXPECT_EQ(std::system(run.c_str()), 0) << "see " << log;
  }
}

// --- malformed MXFP4 tensors ------------------------------------------------------------------

class CheckpointMxfp4Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    f_ = make_fixture(std::string("err_") + info->name(), 2, GateLayout::none, 3);
    EXPECT_EQ(error_of([&] { load_layer(f_.dir, f_.spec.layer); }), "");
  }
  // Edits the checkpoint's tensors, then returns load_layer's error (rank `rank` of `tp`).
  std::string error_after(const std::function<void(std::map<std::string, FileTensors::T>&)>& edit, int tp = 1,
                          int rank = 0) {
    FileTensors file(path());
    edit(file.t);
    file.write(path());
    return error_of([&] { load_layer(f_.dir, f_.spec.layer, tp, rank); });
  }
  std::string path() const { return f_.dir + "/model.safetensors"; }
  std::string name(const std::string& suffix) const { return "model.layers.1.self_attn.kv_b_proj.weight" + suffix; }

  Fixture f_;
};

TEST_F(CheckpointMxfp4Errors, BlocksWithoutScales) {
  const std::string msg = error_after([&](auto& t) { t.erase(name("_scales")); });
  EXPECT_ERROR_HAS(msg, "MXFP4 tensor '" + name("_blocks") + "' has no scales '" + name("_scales") + "'");
}

TEST_F(CheckpointMxfp4Errors, ScalesWithoutBlocks) {
  const std::string msg = error_after([&](auto& t) { t.erase(name("_blocks")); });
  EXPECT_ERROR_HAS(msg, "MXFP4 scales '" + name("_scales") + "' have no blocks '" + name("_blocks") + "'");
}

TEST_F(CheckpointMxfp4Errors, BlocksOfTheWrongShape) {
  // 32 codes of a block as [rows, L/32, 32] nibble-per-byte: the same bytes would not be the same tensor.
  const std::string msg = error_after([&](auto& t) {
    auto& b = t.at(name("_blocks"));
    b.shape = {b.shape[0], b.shape[1] / 2, 32};
  });
  EXPECT_ERROR_HAS(msg, "MXFP4 blocks '" + name("_blocks") + "' have shape [192, 8, 32], expected [192, 16, 16]");
}

TEST_F(CheckpointMxfp4Errors, FewerRowsThanTheHeadsNeed) {
  const std::string msg = error_after([&](auto& t) {
    for (auto* x : {&t.at(name("_blocks")), &t.at(name("_scales"))}) {
      x->shape[0] -= 1;
      x->bytes.resize(x->bytes.size() / 192 * 191);
    }
  });
  EXPECT_ERROR_HAS(msg, "have shape [191, 16, 16], expected [192, 16, 16]");
}

TEST_F(CheckpointMxfp4Errors, ScalesOfTheWrongShape) {
  const std::string msg = error_after([&](auto& t) {
    auto& s = t.at(name("_scales"));
    s.shape = {s.shape[0] * 2, s.shape[1] / 2};
  });
  EXPECT_ERROR_HAS(msg, "MXFP4 scales '" + name("_scales") + "' have shape [384, 8], expected [192, 16]");
}

TEST_F(CheckpointMxfp4Errors, BlocksOfTheWrongDtype) {
  const std::string msg = error_after([&](auto& t) {
    auto& b = t.at(name("_blocks"));
    b.dtype = DType::bf16;
    b.shape[2] /= 2;
  });
  EXPECT_ERROR_HAS(msg, "MXFP4 blocks '" + name("_blocks") + "' have dtype BF16, expected U8");
}

TEST_F(CheckpointMxfp4Errors, BothFormsOfKvB) {
  const std::string msg = error_after([&](auto& t) {
    t[name("")] = {DType::bf16, {192, 512}, std::vector<uint8_t>(192 * 512 * 2, 0)};
  });
  EXPECT_ERROR_HAS(msg, "has both '" + name("") + "' and MXFP4");
}

TEST_F(CheckpointMxfp4Errors, NanScaleInTheRanksRowsOnly) {
  // Row 150 lies in head 1 (rows 96..191): rank 1 of 2 reads it, rank 0 does not.
  const auto put_nan = [&](auto& t) { t.at(name("_scales")).bytes[150 * 16 + 3] = 0xFF; };
  EXPECT_ERROR_HAS(error_after(put_nan, 2, 1), "element [150, 3] is 255 (NaN), expected an E8M0 scale <= 252");
  EXPECT_EQ(error_of([&] { load_layer(f_.dir, f_.spec.layer, 2, 0); }), "");
}

TEST_F(CheckpointMxfp4Errors, ScaleThatOverflowsFloat) {
  // 6 * 2^(253 - 127) is beyond float's range; 252 is fine.
  const auto put = [&](uint8_t e) { return [&, e](auto& t) { t.at(name("_scales")).bytes[7] = e; }; };
  EXPECT_ERROR_HAS(error_after(put(253)), "element [0, 7] is 253, expected an E8M0 scale <= 252");
  EXPECT_EQ(error_after(put(252)), "");
}

TEST_F(CheckpointMxfp4Errors, KvLoraRankNotAMultipleOf32) {
  // L = 500 cannot hold blocks of 32: the config is refused before any tensor is read.
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(f_.dir + "/config.json"));
  cfg["kv_lora_rank"] = 500;
  std::ofstream(f_.dir + "/config.json") << cfg.dump();
  EXPECT_ERROR_HAS(error_of([&] { load_layer(f_.dir, f_.spec.layer); }),
                   "kv_lora_rank: expected a multiple of 32, got 500");
}

TEST_F(CheckpointMxfp4Errors, RowsOfTheFileHoldOtherThanLCodes) {
  // 15 blocks a row (480 codes) against L = 512 from config.json.
  const std::string msg = error_after([&](auto& t) {
    for (auto* x : {&t.at(name("_blocks")), &t.at(name("_scales"))}) {
      x->shape[1] = 15;
      x->bytes.resize(x->bytes.size() / 16 * 15);
    }
  });
  EXPECT_ERROR_HAS(msg, "have shape [192, 15, 16], expected [192, 16, 16] ([rows, cols/32, 16] of [192, 512]");
}

// prepare_weights checks a pre-quantized kv_b itself too.
TEST(CheckpointMxfp4Prepare, MalformedKvBMxfp4) {
  const LayerConfig cfg = small_model(2, GateLayout::none);
  const int64_t rows = 2 * (cfg.qk_nope_dim + cfg.v_head_dim), L = cfg.kv_lora_rank;
  CheckpointWeights good = random_checkpoint_weights(cfg, 5);
  good.kv_b.clear();
  good.kv_b_mxfp4 = random_kv_b(rows, L, 6);
  EXPECT_EQ(error_of([&] { prepare_weights(cfg, good); }), "");

  CheckpointWeights w = good;
  w.kv_b = random_checkpoint_weights(cfg, 5).kv_b;
  EXPECT_ERROR_HAS(error_of([&] { prepare_weights(cfg, w); }),
                   "kv_b: expected no bf16 tensor when kv_b_mxfp4 is given, got 98304 elements");
  w = good;
  w.kv_b_mxfp4->rows -= 1;
  EXPECT_ERROR_HAS(error_of([&] { prepare_weights(cfg, w); }), "kv_b_mxfp4: expected [1, N*(P+V), L] = [1, 192, 512], got [1, 191, 512]");
  w = good;
  w.kv_b_mxfp4->cols = 500;
  EXPECT_ERROR_HAS(error_of([&] { prepare_weights(cfg, w); }), "got [1, 192, 500]");
  w = good;
  w.kv_b_mxfp4->codes.pop_back();
  EXPECT_ERROR_HAS(error_of([&] { prepare_weights(cfg, w); }), "kv_b_mxfp4.codes: expected [192, 256] = 49152 bytes, got 49151");
  w = good;
  w.kv_b_mxfp4->scales.push_back(127);
  EXPECT_ERROR_HAS(error_of([&] { prepare_weights(cfg, w); }), "kv_b_mxfp4.scales: expected [192, 16] = 3072 bytes, got 3073");
  w = good;
  w.kv_b_mxfp4->scales[17] = 0xFF;
  EXPECT_ERROR_HAS(error_of([&] { prepare_weights(cfg, w); }), "kv_b_mxfp4.scales[1, 1]: expected an E8M0 scale <= 252");
  w.kv_b_mxfp4->scales[17] = 253;
  EXPECT_ERROR_HAS(error_of([&] { prepare_weights(cfg, w); }), "got 253");
  w.kv_b_mxfp4->scales[17] = 252;
  EXPECT_EQ(error_of([&] { prepare_weights(cfg, w); }), "");
}

}  // namespace
}  // namespace mla
