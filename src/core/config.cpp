#include "mla/config.hpp"

#include <cmath>

#include "core/rope.hpp"
#include "mla/error.hpp"

namespace mla {

double LayerConfig::sm_scale() const {
  double s = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope == RopeType::yarn) {
    const double m = rope::yarn_get_mscale(yarn.factor, yarn.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

void LayerConfig::validate() const {
  auto positive = [](const char* field, long v) {
    MLA_REQUIRE(v > 0, "LayerConfig.", field, ": expected > 0, got ", v);
  };
  positive("hidden", hidden);
  positive("q_lora_rank", q_lora_rank);
  positive("kv_lora_rank", kv_lora_rank);
  positive("qk_nope_dim", qk_nope_dim);
  positive("v_head_dim", v_head_dim);
  positive("total_heads", total_heads);
  positive("tp_size", tp_size);
  MLA_REQUIRE(qk_rope_dim >= 0 && qk_rope_dim % 2 == 0, "LayerConfig.qk_rope_dim: expected even >= 0, got ",
              qk_rope_dim);
  MLA_REQUIRE(total_heads % tp_size == 0, "LayerConfig.tp_size: expected a divisor of total_heads ",
              total_heads, ", got ", tp_size);
  // MXFP4 blocks of 32 along the reduced dimension: P for W_UK, L for W_UV.
  MLA_REQUIRE(qk_nope_dim % 32 == 0, "LayerConfig.qk_nope_dim: expected a multiple of 32, got ", qk_nope_dim);
  MLA_REQUIRE(kv_lora_rank % 32 == 0, "LayerConfig.kv_lora_rank: expected a multiple of 32, got ",
              kv_lora_rank);
  MLA_REQUIRE(std::isfinite(rms_eps) && rms_eps > 0, "LayerConfig.rms_eps: expected finite > 0, got ", rms_eps);
  if (rope == RopeType::yarn) {
    MLA_REQUIRE(yarn.theta > 0 && yarn.factor > 0 && yarn.original_max_position > 0,
                "LayerConfig.yarn: theta, factor and original_max_position must be > 0");
  }
}

LayerConfig LayerConfig::preset(std::string_view name) {
  LayerConfig c;  // the defaults are kimi-k3: 96 heads, NoPE, merged gate
  if (name == "kimi-k3") return c;
  if (name == "deepseek-v3") {
    c.name = "deepseek-v3";
    c.total_heads = 128;
    c.gate = GateLayout::none;
    c.rope = RopeType::yarn;
    c.yarn = YarnParams{.theta = 10000, .factor = 40, .original_max_position = 4096,
                        .beta_fast = 32, .beta_slow = 1, .mscale = 1, .mscale_all_dim = 1};
    return c;
  }
  if (name == "kimi-k2") {
    // Kimi K2's config.json: rope_theta 50000, rope_scaling yarn factor 32, beta_fast 1, beta_slow 1.
    c.name = "kimi-k2";
    c.total_heads = 64;
    c.gate = GateLayout::none;
    c.rope = RopeType::yarn;
    c.yarn = YarnParams{.theta = 50000, .factor = 32, .original_max_position = 4096,
                        .beta_fast = 1, .beta_slow = 1, .mscale = 1, .mscale_all_dim = 1};
    return c;
  }
  detail::fail("LayerConfig::preset: unknown preset '", name, "', expected one of kimi-k3, deepseek-v3, kimi-k2");
}

std::vector<std::string> LayerConfig::preset_names() { return {"kimi-k3", "deepseek-v3", "kimi-k2"}; }

}  // namespace mla
