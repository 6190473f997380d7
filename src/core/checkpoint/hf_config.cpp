#include "core/checkpoint/hf_config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint_dir.hpp"
#include "mla/checkpoint.hpp"
#include "mla/error.hpp"

namespace mla::checkpoint {

namespace {

using nlohmann::json;

// Reads fields of one JSON object, naming `what` and the key in every error.
struct Fields {
  const json& j;
  std::string_view what;

  const json* find(const char* key) const {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int integer(const char* key) const {
    const json* v = find(key);
    MLA_REQUIRE(v != nullptr, what, ": missing '", key, "'");
    return to_int(key, *v);
  }
  int integer_or(const char* key, int fallback) const {
    const json* v = find(key);
    return v ? to_int(key, *v) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    MLA_REQUIRE(v->is_number() && std::isfinite(v->get<double>()), what, ": '", key,
                "' must be a finite number, got ", v->dump());
    return v->get<double>();
  }
  bool flag(const char* key) const {
    const json* v = find(key);
    if (!v) return false;
    MLA_REQUIRE(v->is_boolean(), what, ": '", key, "' must be true or false, got ", v->dump());
    return v->get<bool>();
  }
  int to_int(const char* key, const json& v) const {
    MLA_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<int>::min() &&
                    v.get<int64_t>() <= std::numeric_limits<int>::max(),
                what, ": '", key, "' must be an integer, got ", v.dump());
    return int(v.get<int64_t>());
  }
  std::vector<int> int_list(const json& parent, const char* key) const {
    std::vector<int> out;
    const auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) return out;
    MLA_REQUIRE(it->is_array(), what, ": '", key, "' must be a list of integers, got ", it->dump());
    for (const auto& v : *it) out.push_back(to_int(key, v));
    return out;
  }
};

// rope_scaling (or rope_parameters) -> cfg.rope / cfg.yarn. theta comes from the caller.
void parse_rope(const Fields& f, const json* scaling, double theta, double max_positions, LayerConfig& cfg) {
  // Plain RoPE is YaRN with factor 1: both frequency sets coincide and every mscale is 1.
  cfg.rope = RopeType::yarn;
  cfg.yarn = YarnParams{.theta = theta, .factor = 1, .original_max_position = max_positions,
                        .beta_fast = 32, .beta_slow = 1, .mscale = 1, .mscale_all_dim = 0};
  if (scaling == nullptr) return;
  MLA_REQUIRE(scaling->is_object(), f.what, ": 'rope_scaling' must be an object or null, got ", scaling->dump());
  const Fields s{*scaling, f.what};
  std::string type = "default";
  for (const char* key : {"type", "rope_type"}) {
    if (const json* t = s.find(key)) {
      MLA_REQUIRE(t->is_string(), f.what, ": rope_scaling '", key, "' must be a string, got ", t->dump());
      type = t->get<std::string>();
    }
  }
  if (type == "default") return;
  MLA_REQUIRE(type == "yarn" || type == "deepseek_yarn", f.what, ": rope_scaling type '", type,
              "' is not supported (expected yarn, deepseek_yarn or default)");
  // Defaults of DeepSeek's DeepseekV3YarnRotaryEmbedding and of its softmax_scale (mscale_all_dim 0).
  cfg.yarn.factor = s.number_or("factor", 1.0);
  cfg.yarn.original_max_position = s.number_or("original_max_position_embeddings", 4096);
  cfg.yarn.beta_fast = s.number_or("beta_fast", 32);
  cfg.yarn.beta_slow = s.number_or("beta_slow", 1);
  cfg.yarn.mscale = s.number_or("mscale", 1);
  cfg.yarn.mscale_all_dim = s.number_or("mscale_all_dim", 0);
}

}  // namespace

HfConfig parse_hf_config(std::string_view text, int tp, std::string_view what) {
  const json top = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  MLA_REQUIRE(!top.is_discarded(), what, ": not valid JSON");
  MLA_REQUIRE(top.is_object(), what, ": expected a JSON object, got ", top.type_name());
  // Multimodal checkpoints (Kimi K2.5 / K3) keep the language model's fields in text_config.
  const auto tc = top.find("text_config");
  const json& model = tc != top.end() && tc->is_object() && !top.contains("hidden_size") ? *tc : top;
  const Fields f{model, what};

  HfConfig out;
  LayerConfig& cfg = out.layer;
  const json* model_type = f.find("model_type");
  cfg.name = model_type && model_type->is_string() ? model_type->get<std::string>() : "checkpoint";
  cfg.hidden = f.integer("hidden_size");
  cfg.total_heads = f.integer("num_attention_heads");
  MLA_REQUIRE(f.find("q_lora_rank") != nullptr, what,
              ": q_lora_rank is null or missing (the model projects q with q_proj, not q_a_proj/q_b_proj): "
              "not supported yet");
  cfg.q_lora_rank = f.integer("q_lora_rank");
  cfg.kv_lora_rank = f.integer("kv_lora_rank");
  cfg.qk_nope_dim = f.integer("qk_nope_head_dim");
  cfg.qk_rope_dim = f.integer("qk_rope_head_dim");
  cfg.v_head_dim = f.integer("v_head_dim");
  cfg.rms_eps = f.number_or("rms_norm_eps", 1e-6);
  cfg.gate = f.flag("mla_use_output_gate") ? GateLayout::separate : GateLayout::none;

  const double max_positions = f.number_or("max_position_embeddings", 4096);
  if (const json* params = f.find("rope_parameters")) {  // transformers v5: theta inside
    MLA_REQUIRE(params->is_object(), what, ": 'rope_parameters' must be an object, got ", params->dump());
    parse_rope(f, params, Fields{*params, what}.number_or("rope_theta", 10000), max_positions, cfg);
  } else {
    parse_rope(f, f.find("rope_scaling"), f.number_or("rope_theta", 10000), max_positions, cfg);
  }
  if (f.flag("mla_use_nope")) cfg.rope = RopeType::none;

  MLA_REQUIRE(tp >= 1, "tp: expected >= 1, got ", tp);
  MLA_REQUIRE(cfg.total_heads > 0 && cfg.total_heads % tp == 0, "tp: expected a divisor of ", what,
              "'s num_attention_heads = ", cfg.total_heads, ", got ", tp);
  cfg.tp_size = tp;
  cfg.validate();

  // fp8 block scales: quantization_config sits at the top level, even beside a text_config.
  for (const json* j : {&top, &model}) {
    const auto q = j->find("quantization_config");
    if (q == j->end() || !q->is_object()) continue;
    const auto bs = q->find("weight_block_size");
    if (bs == q->end() || bs->is_null()) continue;
    MLA_REQUIRE(bs->is_array() && bs->size() == 2 && (*bs)[0].is_number_integer() && (*bs)[1].is_number_integer() &&
                    (*bs)[0].get<int64_t>() > 0 && (*bs)[1].get<int64_t>() > 0 &&
                    (*bs)[0].get<int64_t>() <= (1 << 20) && (*bs)[1].get<int64_t>() <= (1 << 20),
                what, ": quantization_config.weight_block_size must be two positive integers, got ", bs->dump());
    out.block_rows = int((*bs)[0].get<int64_t>());
    out.block_cols = int((*bs)[1].get<int64_t>());
  }

  const int layers = f.integer_or("num_hidden_layers", -1);
  if (layers >= 0) out.num_layers = layers + std::max(0, f.integer_or("num_nextn_predict_layers", 0));
  if (const json* lin = f.find("linear_attn_config"); lin && lin->is_object()) {
    out.kda_layers = f.int_list(*lin, "kda_layers");
    out.mla_layers = f.int_list(*lin, "full_attn_layers");
  }
  return out;
}

}  // namespace mla::checkpoint

namespace mla {

LayerConfig layer_config_from_json(std::string_view config_json, int tp, std::string_view what) {
  return checkpoint::parse_hf_config(config_json, tp, what).layer;
}

LayerConfig load_layer_config(const std::string& dir, int tp) {
  const std::string path = dir + "/config.json";
  return layer_config_from_json(checkpoint::read_text_file(path), tp, path);
}

}  // namespace mla
