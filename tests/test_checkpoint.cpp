// Loading one MLA layer from a Hugging Face style checkpoint (include/mla/checkpoint.hpp): files
// written in the real format, read back element by element, a decode step on loaded weights, and
// config.json parsing. Malformed safetensors files and fuzzing: test_checkpoint_safetensors.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sys/wait.h>
#include <filesystem>
#include <fstream>

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
using testing::tiny_model;

void expect_same_bits(const char* what, const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], want[i]) << what << "[" << i << "]: got " << bf16_to_float(got[i]) << ", want "
                               << bf16_to_float(want[i]);
}

void expect_same_weights(const CheckpointWeights& got, const CheckpointWeights& want) {
  expect_same_bits("qkv_a", got.qkv_a, want.qkv_a);
  expect_same_bits("g_proj", got.g_proj, want.g_proj);
  expect_same_bits("q_a_norm", got.q_a_norm, want.q_a_norm);
  expect_same_bits("kv_a_norm", got.kv_a_norm, want.kv_a_norm);
  expect_same_bits("q_b", got.q_b, want.q_b);
  expect_same_bits("kv_b", got.kv_b, want.kv_b);
  EXPECT_EQ(got.q_scale, want.q_scale);
  EXPECT_EQ(got.k_scale, want.k_scale);
}

void expect_same_config(const LayerConfig& got, const LayerConfig& want, int tp) {
  EXPECT_EQ(got.hidden, want.hidden);
  EXPECT_EQ(got.q_lora_rank, want.q_lora_rank);
  EXPECT_EQ(got.kv_lora_rank, want.kv_lora_rank);
  EXPECT_EQ(got.qk_nope_dim, want.qk_nope_dim);
  EXPECT_EQ(got.qk_rope_dim, want.qk_rope_dim);
  EXPECT_EQ(got.v_head_dim, want.v_head_dim);
  EXPECT_EQ(got.total_heads, want.total_heads);
  EXPECT_EQ(got.tp_size, tp);
  EXPECT_EQ(got.gate, want.gate);
  EXPECT_EQ(got.rope, want.rope);
  EXPECT_EQ(got.rms_eps, want.rms_eps);
  if (want.rope == RopeType::yarn) {
    EXPECT_EQ(got.yarn.theta, want.yarn.theta);
    EXPECT_EQ(got.yarn.factor, want.yarn.factor);
    EXPECT_EQ(got.yarn.original_max_position, want.yarn.original_max_position);
    EXPECT_EQ(got.yarn.beta_fast, want.yarn.beta_fast);
    EXPECT_EQ(got.yarn.beta_slow, want.yarn.beta_slow);
    EXPECT_EQ(got.yarn.mscale, want.yarn.mscale);
    EXPECT_EQ(got.yarn.mscale_all_dim, want.yarn.mscale_all_dim);
  }
}

struct LoadCase {
  const char* name;
  int heads;
  RopeType rope;
  GateLayout gate;
  bool fp8;
  int block_rows, block_cols;
  int shards;
  const char* prefix;
  bool text_config;
  int tp;
};

class CheckpointLoad : public ::testing::TestWithParam<LoadCase> {};

// Every rank's slice of a written layer reads back bit for bit (fp8: the dequantized values).
TEST_P(CheckpointLoad, EveryRankReadsBackItsHeadsElementByElement) {
  const LoadCase& lc = GetParam();
  CheckpointSpec spec;
  spec.cfg = tiny_model(lc.heads, lc.rope, lc.gate);
  spec.layer = 2;
  spec.fp8 = lc.fp8;
  spec.block_rows = lc.block_rows;
  spec.block_cols = lc.block_cols;
  spec.shards = lc.shards;
  spec.prefix = lc.prefix;
  spec.text_config = lc.text_config;
  const std::string dir = testing::fresh_dir(std::string("load_") + lc.name);
  const CheckpointWeights full = random_checkpoint_weights(spec.cfg, 1000 + lc.heads * 7 + lc.tp);
  const CheckpointWeights written = testing::write_checkpoint(dir, spec, full);
  if (lc.fp8) {  // fp8 really rounded something, so the comparison is not bf16 against itself
    EXPECT_NE(written.q_b, full.q_b);
  }
  for (int rank = 0; rank < lc.tp; ++rank) {
    SCOPED_TRACE("tp " + std::to_string(lc.tp) + " rank " + std::to_string(rank));
    const CheckpointLayer got = load_layer(dir, spec.layer, lc.tp, rank);
    expect_same_config(got.config, spec.cfg, lc.tp);
    expect_same_weights(got.weights, testing::slice_heads(spec.cfg, written, lc.tp, rank));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoint, CheckpointLoad,
    ::testing::Values(
        LoadCase{"bf16_single", 4, RopeType::yarn, GateLayout::none, false, 128, 128, 1, "model.", false, 1},
        LoadCase{"bf16_sharded_tp2", 4, RopeType::yarn, GateLayout::none, false, 128, 128, 3, "model.", false, 2},
        LoadCase{"fp8_single_tp4", 4, RopeType::yarn, GateLayout::none, true, 128, 128, 1, "model.", false, 4},
        // Ragged blocks that head slices cross: 40-row blocks against 96- and 64-row heads.
        LoadCase{"fp8_ragged_sharded_tp2", 6, RopeType::yarn, GateLayout::none, true, 40, 64, 4, "model.", false, 2},
        // Kimi K3 style: NoPE, output gate, fields in text_config, "language_model.model." names.
        LoadCase{"k3_fp8_gate_tp3", 3, RopeType::none, GateLayout::separate, true, 128, 128, 2,
                 "language_model.model.", true, 3},
        LoadCase{"k3_bf16_gate_tp1", 2, RopeType::none, GateLayout::separate, false, 128, 128, 1,
                 "language_model.model.", true, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// F16 / F32 tensors convert to bf16; without q_scale / k_scale tensors both scales are 1.
TEST(Checkpoint, OtherFloatDtypesAndMissingScales) {
  CheckpointSpec spec;
  spec.cfg = tiny_model(2, RopeType::yarn, GateLayout::none);
  spec.write_scales = false;
  spec.dtype_of = {{"q_a_layernorm", DType::f32},
                   {"kv_a_layernorm", DType::f16},
                   {"q_a_proj", DType::f16},
                   {"kv_b_proj", DType::f32},
                   {"q_b_proj", DType::fp8_e4m3}};
  const std::string dir = testing::fresh_dir("other_dtypes");
  CheckpointWeights full = random_checkpoint_weights(spec.cfg, 77);
  CheckpointWeights written = testing::write_checkpoint(dir, spec, full);
  written.q_scale = written.k_scale = 1.0f;
  const CheckpointLayer got = load_layer(dir, spec.layer, 1, 0);
  expect_same_weights(got.weights, written);
}

// compressed-tensors' fp8-block checkpoints call the block scales weight_scale.
TEST(Checkpoint, Fp8BlockScalesNamedWeightScale) {
  CheckpointSpec spec;
  spec.cfg = tiny_model(2, RopeType::yarn, GateLayout::none);
  spec.fp8 = true;
  spec.scale_suffix = "_scale";
  const std::string dir = testing::fresh_dir("fp8_weight_scale");
  const CheckpointWeights written = testing::write_checkpoint(dir, spec, random_checkpoint_weights(spec.cfg, 55));
  expect_same_weights(load_layer(dir, spec.layer, 2, 1).weights, testing::slice_heads(spec.cfg, written, 2, 1));
}

// A decode step on loaded weights equals one on the same weights built in memory: the loader's
// config (rope, eps, gate, head count) and weights are the ones the model means.
TEST(Checkpoint, StepOnLoadedWeightsEqualsInMemoryWeights) {
  struct Case {
    RopeType rope;
    GateLayout gate;
    bool fp8;
  };
  for (const Case cs : {Case{RopeType::yarn, GateLayout::none, false}, Case{RopeType::none, GateLayout::separate, true}}) {
    SCOPED_TRACE(cs.fp8 ? "fp8 NoPE gate" : "bf16 yarn");
    const int tp = 2, rank = 1;
    CheckpointSpec spec;
    spec.cfg = tiny_model(4, cs.rope, cs.gate);
    spec.fp8 = cs.fp8;
    spec.shards = 2;
    const std::string dir = testing::fresh_dir(cs.fp8 ? "step_fp8" : "step_bf16");
    const CheckpointWeights written =
        testing::write_checkpoint(dir, spec, random_checkpoint_weights(spec.cfg, cs.fp8 ? 31 : 32));
    const CheckpointLayer loaded = load_layer(dir, spec.layer, tp, rank);

    LayerConfig mem_cfg = spec.cfg;
    mem_cfg.tp_size = tp;
    const CheckpointWeights mem = testing::slice_heads(spec.cfg, written, tp, rank);
    ASSERT_NO_FATAL_FAILURE(testing::expect_same_step(loaded.config, loaded.weights, mem_cfg, mem));
  }
}

// --- config.json ------------------------------------------------------------------------------

// DeepSeek-V3's config.json, the fields that matter here, verbatim.
constexpr const char* kDeepSeekV3Config = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "v_head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 10000, "max_position_embeddings": 163840,
  "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}
})";

TEST(CheckpointConfig, DeepSeekV3MatchesThePreset) {
  const LayerConfig got = layer_config_from_json(kDeepSeekV3Config, 8);
  LayerConfig want = LayerConfig::preset("deepseek-v3");
  expect_same_config(got, want, 8);
  EXPECT_EQ(got.heads(), 16);
  EXPECT_EQ(got.sm_scale(), want.sm_scale());
  EXPECT_EQ(got.name, "deepseek_v3");
}

TEST(CheckpointConfig, RopeVariants) {
  const std::string base =
      R"("hidden_size": 64, "num_attention_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 512,
         "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32)";
  // No rope_scaling: plain RoPE as YaRN with factor 1, whose sm_scale is exactly (P+R)^-0.5.
  LayerConfig c = layer_config_from_json("{" + base + R"(, "rope_theta": 50000, "rope_scaling": null})");
  EXPECT_EQ(c.rope, RopeType::yarn);
  EXPECT_EQ(c.yarn.factor, 1.0);
  EXPECT_EQ(c.yarn.theta, 50000.0);
  EXPECT_EQ(c.sm_scale(), 1.0 / std::sqrt(96.0));
  EXPECT_EQ(c.rms_eps, 1e-6);  // the default when the config does not say
  // YaRN with the fields DeepSeek's code defaults: mscale_all_dim 0 leaves sm_scale alone.
  c = layer_config_from_json("{" + base + R"(, "rope_scaling": {"rope_type": "deepseek_yarn", "factor": 4}})");
  EXPECT_EQ(c.yarn.factor, 4.0);
  EXPECT_EQ(c.yarn.original_max_position, 4096.0);
  EXPECT_EQ(c.yarn.beta_fast, 32.0);
  EXPECT_EQ(c.yarn.beta_slow, 1.0);
  EXPECT_EQ(c.yarn.mscale_all_dim, 0.0);
  EXPECT_EQ(c.sm_scale(), 1.0 / std::sqrt(96.0));
  // transformers v5 keeps theta inside rope_parameters.
  c = layer_config_from_json("{" + base +
                             R"(, "rope_parameters": {"rope_type": "yarn", "rope_theta": 777, "factor": 2,
                                 "mscale_all_dim": 1}})");
  EXPECT_EQ(c.yarn.theta, 777.0);
  EXPECT_EQ(c.yarn.factor, 2.0);
  EXPECT_GT(c.sm_scale(), 1.0 / std::sqrt(96.0));
  // NoPE wins over any rope fields; the gate flag gives a separate g_proj.
  c = layer_config_from_json("{" + base + R"(, "mla_use_nope": true, "mla_use_output_gate": true,
                                 "rope_scaling": {"type": "yarn", "factor": 8}})");
  EXPECT_EQ(c.rope, RopeType::none);
  EXPECT_EQ(c.gate, GateLayout::separate);
  EXPECT_EQ(c.sm_scale(), 1.0 / std::sqrt(96.0));
}

TEST(CheckpointConfig, ErrorsNameTheField) {
  const std::string base =
      R"("hidden_size": 64, "num_attention_heads": 4, "kv_lora_rank": 512,
         "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32)";
  struct Bad {
    std::string json;
    int tp;
    const char* expect;
  };
  const Bad cases[] = {
      {"{" + base + R"(, "q_lora_rank": null})", 1, "not supported yet"},
      {"{" + base + "}", 1, "not supported yet"},
      {R"({"q_lora_rank": 32})", 1, "missing 'hidden_size'"},
      {"{" + base + R"(, "q_lora_rank": 32.5})", 1, "'q_lora_rank' must be an integer"},
      {"{" + base + R"(, "q_lora_rank": 32})", 3, "tp: expected a divisor"},
      {"{" + base + R"(, "q_lora_rank": 32})", 0, "tp: expected >= 1"},
      {"{" + base + R"(, "q_lora_rank": 32, "rope_scaling": {"type": "linear", "factor": 2}})", 1,
       "rope_scaling type 'linear' is not supported"},
      {"{" + base + R"(, "q_lora_rank": 32, "mla_use_nope": "yes"})", 1, "'mla_use_nope' must be true or false"},
      {"{" + base + R"(, "q_lora_rank": 32, "rms_norm_eps": "small"})", 1, "'rms_norm_eps' must be a finite number"},
      {"{" + base + R"(, "q_lora_rank": 32, "quantization_config": {"weight_block_size": [128]}})", 1,
       "weight_block_size must be two positive integers"},
      {"{" + base, 1, "not valid JSON"},
      {"[1, 2]", 1, "expected a JSON object"},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.json);
    const std::string msg = error_of([&] { layer_config_from_json(b.json, b.tp); });
    EXPECT_NE(msg.find(b.expect), std::string::npos) << "message: " << msg;
  }
}

// --- checkpoint-level errors ------------------------------------------------------------------

class CheckpointErrors : public ::testing::Test {
 protected:
  // A valid fp8 sharded checkpoint; each test breaks one thing.
  void SetUp() override {
    spec_.cfg = tiny_model(4, RopeType::yarn, GateLayout::none);
    spec_.fp8 = true;
    spec_.shards = 2;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = testing::fresh_dir(std::string("errors_") + info->name());
    testing::write_checkpoint(dir_, spec_, random_checkpoint_weights(spec_.cfg, 9));
  }
  std::string load_error(int layer = 0, int tp = 1, int rank = 0) {
    return error_of([&] { load_layer(dir_, layer, tp, rank); });
  }
  nlohmann::json read_json(const std::string& file) {
    std::ifstream in(dir_ + "/" + file);
    return nlohmann::json::parse(in);
  }
  void write_json(const std::string& file, const nlohmann::json& j) { std::ofstream(dir_ + "/" + file) << j.dump(); }
  std::string shard_of(const std::string& name) { return read_json("model.safetensors.index.json")["weight_map"][name]; }

  CheckpointSpec spec_;
  std::string dir_;
};

#define EXPECT_ERROR_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg)

TEST_F(CheckpointErrors, ValidCheckpointLoads) { EXPECT_EQ(load_error(), ""); }

TEST_F(CheckpointErrors, TensorMissingFromItsShard) {
  // The index sends kv_b_proj to a shard that does not hold it.
  const std::string name = "model.layers.0.self_attn.kv_b_proj.weight";
  nlohmann::json index = read_json("model.safetensors.index.json");
  const std::string other = index["weight_map"][name] == "model-00001-of-00002.safetensors"
                                ? "model-00002-of-00002.safetensors"
                                : "model-00001-of-00002.safetensors";
  index["weight_map"][name] = other;
  write_json("model.safetensors.index.json", index);
  const std::string msg = load_error();
  EXPECT_ERROR_HAS(msg, "maps tensor '" + name + "' to '" + other + "', which does not contain it");
}

TEST_F(CheckpointErrors, TensorMissingFromTheIndex) {
  nlohmann::json index = read_json("model.safetensors.index.json");
  index["weight_map"].erase("model.layers.0.self_attn.q_b_proj.weight");
  write_json("model.safetensors.index.json", index);
  EXPECT_ERROR_HAS(load_error(), "no tensor 'model.layers.0.self_attn.q_b_proj.weight'");
}

TEST_F(CheckpointErrors, ShardFileMissing) {
  std::filesystem::remove(dir_ + "/" + shard_of("model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_ERROR_HAS(load_error(), "cannot open");
}

TEST_F(CheckpointErrors, ShardPathOutsideTheDirectory) {
  nlohmann::json index = read_json("model.safetensors.index.json");
  index["weight_map"]["model.layers.0.self_attn.q_a_proj.weight"] = "../model-00001-of-00002.safetensors";
  write_json("model.safetensors.index.json", index);
  EXPECT_ERROR_HAS(load_error(), "is not a file name inside the checkpoint directory");
}

TEST_F(CheckpointErrors, TruncatedShard) {
  const std::string shard = dir_ + "/" + shard_of("model.layers.0.self_attn.q_a_proj.weight");
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 1);
  EXPECT_ERROR_HAS(load_error(), "outside the data section");
}

TEST_F(CheckpointErrors, ShapeDisagreesWithConfig) {
  nlohmann::json cfg = read_json("config.json");
  cfg["q_lora_rank"] = 64;
  write_json("config.json", cfg);
  EXPECT_ERROR_HAS(load_error(), "'model.layers.0.self_attn.q_a_proj.weight' has shape [80, 96], expected [64, 96]");
}

TEST_F(CheckpointErrors, BlockSizeDisagreesWithScales) {
  nlohmann::json cfg = read_json("config.json");
  cfg["quantization_config"]["weight_block_size"] = {64, 64};
  write_json("config.json", cfg);
  EXPECT_ERROR_HAS(load_error(), "_scale_inv' has shape");
}

TEST_F(CheckpointErrors, Fp8WithoutScales) {
  nlohmann::json index = read_json("model.safetensors.index.json");
  index["weight_map"].erase("model.layers.0.self_attn.kv_b_proj.weight_scale_inv");
  write_json("model.safetensors.index.json", index);
  EXPECT_ERROR_HAS(load_error(), "has no block scales 'model.layers.0.self_attn.kv_b_proj.weight_scale_inv'");
}

TEST_F(CheckpointErrors, RankLayerAndTpOutOfRange) {
  EXPECT_ERROR_HAS(load_error(0, 2, 2), "rank: expected in [0, 2), got 2");
  EXPECT_ERROR_HAS(load_error(0, 3, 0), "tp: expected a divisor");
  EXPECT_ERROR_HAS(load_error(4, 1, 0), "layer: expected < 4");
  EXPECT_ERROR_HAS(load_error(-1, 1, 0), "layer: expected >= 0");
  EXPECT_ERROR_HAS(load_error(3, 1, 0), "layer 3 is not an MLA layer");  // in range, never written
}

TEST_F(CheckpointErrors, KdaLayerOfAHybridModel) {
  nlohmann::json cfg = read_json("config.json");
  cfg["linear_attn_config"] = {{"kda_layers", {1, 2, 3}}, {"full_attn_layers", {4}}};
  write_json("config.json", cfg);
  EXPECT_ERROR_HAS(load_error(0), "is a linear-attention (KDA) layer");
}

TEST_F(CheckpointErrors, GateFlagWithoutGateWeightAndTheReverse) {
  nlohmann::json cfg = read_json("config.json");
  cfg["mla_use_output_gate"] = true;
  write_json("config.json", cfg);
  EXPECT_ERROR_HAS(load_error(), "sets mla_use_output_gate but there is no");
  // A g_proj the config does not announce is not silently ignored either.
  const std::string dir = testing::fresh_dir("errors_unannounced_gate");
  CheckpointSpec spec = spec_;
  spec.cfg.gate = GateLayout::separate;
  testing::write_checkpoint(dir, spec, random_checkpoint_weights(spec.cfg, 4));
  nlohmann::json gated = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  gated.erase("mla_use_output_gate");
  std::ofstream(dir + "/config.json") << gated.dump();
  EXPECT_ERROR_HAS(error_of([&] { load_layer(dir, 0); }), "does not set mla_use_output_gate");
}

TEST_F(CheckpointErrors, UnsupportedWeightDtype) {
  const std::string dir = testing::fresh_dir("errors_int_weight");
  CheckpointSpec spec = spec_;
  spec.shards = 1;
  testing::write_checkpoint(dir, spec, random_checkpoint_weights(spec.cfg, 3));
  // Rewrite the file with q_b_proj as I32 of the same byte count.
  safetensors::Writer wr;
  {
    const safetensors::File file(dir + "/model.safetensors");
    for (const auto& t : file.header().tensors) {
      DType dt = t.dtype == "BF16" ? DType::bf16 : t.dtype == "F32" ? DType::f32 : DType::fp8_e4m3;
      if (t.name == "model.layers.0.self_attn.q_b_proj.weight") dt = DType::u8;
      wr.add_bytes(t.name, dt, t.shape, file.bytes(t).data());
    }
  }  // unmapped before the file is rewritten
  wr.write(dir + "/model.safetensors");
  const std::string msg = error_of([&] { load_layer(dir, 0); });
  EXPECT_ERROR_HAS(msg, "has dtype U8, expected BF16, F16, F32 or F8_E4M3");
}

TEST(CheckpointErrorsMisc, NonFiniteWeights) {
  CheckpointSpec spec;
  spec.cfg = tiny_model(2, RopeType::yarn, GateLayout::none);
  CheckpointWeights w = random_checkpoint_weights(spec.cfg, 12);
  w.kv_b[1000] = 0x7FC0;  // NaN, in head 0
  const std::string dir = testing::fresh_dir("non_finite");
  testing::write_checkpoint(dir, spec, w);
  EXPECT_ERROR_HAS(error_of([&] { load_layer(dir, 0, 1, 0); }),
                   "'model.layers.0.self_attn.kv_b_proj.weight' element 1000 is nan, expected a finite weight");
  EXPECT_EQ(error_of([&] { load_layer(dir, 0, 2, 1); }), "") << "head 1 does not read the NaN";
  // The same check covers the bf16 tensors of an fp8 checkpoint (and fp8 NaN codes, decoded first).
  spec.fp8 = true;
  w.kv_b[1000] = 0x3F80;
  w.q_a_norm[3] = 0x7F80;  // inf in a bf16 norm of an fp8 checkpoint
  testing::write_checkpoint(dir, spec, w);
  EXPECT_ERROR_HAS(error_of([&] { load_layer(dir, 0, 1, 0); }), "q_a_layernorm.weight' element 3 is inf");
}

TEST(CheckpointErrorsMisc, QProjInsteadOfQLoraIsNotSupportedYet) {
  const std::string dir = testing::fresh_dir("q_proj");
  safetensors::Writer wr;
  std::vector<uint16_t> zeros(64 * 64);
  wr.add_bytes("model.layers.0.self_attn.q_proj.weight", DType::bf16, {64, 64}, zeros.data());
  wr.write(dir + "/model.safetensors");
  nlohmann::json cfg = {{"hidden_size", 64},      {"num_attention_heads", 1}, {"q_lora_rank", 32},
                        {"kv_lora_rank", 512},    {"qk_nope_head_dim", 32},   {"qk_rope_head_dim", 64},
                        {"v_head_dim", 32}};
  std::ofstream(dir + "/config.json") << cfg.dump();
  EXPECT_ERROR_HAS(error_of([&] { load_layer(dir, 0); }), "not supported yet");
  cfg["q_lora_rank"] = nullptr;  // what such a model's config really says
  std::ofstream(dir + "/config.json") << cfg.dump();
  EXPECT_ERROR_HAS(error_of([&] { load_layer(dir, 0); }), "not supported yet");
}

TEST(CheckpointErrorsMisc, DirectoryWithoutSafetensors) {
  const std::string dir = testing::fresh_dir("empty_dir");
  EXPECT_ERROR_HAS(error_of([&] { load_layer(dir, 0); }), "cannot read");  // no config.json
  CheckpointSpec spec;
  spec.cfg = tiny_model(2, RopeType::yarn, GateLayout::none);
  std::ofstream(dir + "/config.json") << testing::checkpoint_config_json(spec).dump();
  EXPECT_ERROR_HAS(error_of([&] { load_layer(dir, 0); }), "neither model.safetensors.index.json nor any");
}


// --- mla run --checkpoint ---------------------------------------------------------------------

// `mla run --checkpoint DIR --layer N --tp T --rank R --check` runs and checks a loaded layer; a
// layer the checkpoint lacks is one clear error line, exit 2.
TEST(CheckpointCli, RunChecksALoadedLayer) {
  const std::string mla = std::string(MLA_BINARY_DIR) + "/mla";
  if (!std::filesystem::exists(mla)) GTEST_SKIP() << "the mla command is not built at " << mla;
  CheckpointSpec spec;
  spec.cfg = tiny_model(4, RopeType::none, GateLayout::separate);
  spec.fp8 = true;
  spec.shards = 2;
  const std::string dir = testing::fresh_dir("cli_run");
  testing::write_checkpoint(dir, spec, random_checkpoint_weights(spec.cfg, 71));
  const std::string run = "'" + mla + "' run --checkpoint '" + dir + "' --tp 2 --rank 1 --backend cpu --threads 1" +
                          " --context 40,0,100 --qlen 2 --page-size 16 --check";
  ASSERT_EQ(std::system((run + " --layer 0 --json '" + dir + "/run.json' > '" + dir + "/out.txt' 2>&1").c_str()), 0)
      << "see " << dir << "/out.txt";
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/run.json"));
  EXPECT_EQ(j["config"]["heads"], 2);
  EXPECT_EQ(j["config"]["gate"], "separate");
  EXPECT_EQ(j["config"]["rope"], "none");
  EXPECT_EQ(j["check"]["ok"], true);

  const int status = std::system((run + " --layer 3 > '" + dir + "/bad.txt' 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
  std::ifstream in(dir + "/bad.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("layer 3 is not an MLA layer"), std::string::npos) << text;
}

}  // namespace
}  // namespace mla
