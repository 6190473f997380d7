#pragma once
// Test helper (header-only: tests/CMakeLists.txt compiles tests/test_*.cpp): writes a small
// DeepSeek-V3 / Kimi style checkpoint directory in the real format (config.json, safetensors,
// sharded with model.safetensors.index.json or not, bf16 or fp8 e4m3 with block scales) and
// returns the weights as load_layer must read them back.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/safetensors_writer.hpp"
#include "mla/config.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "mla/weights.hpp"

namespace mla::testing {

struct CheckpointSpec {
  LayerConfig cfg;             // the whole model: total_heads heads, tp_size 1
  int layer = 0;               // the layer written; layer + 1 gets other (negated) weights
  int num_layers = 4;          // config.json num_hidden_layers
  bool fp8 = false;            // projections as F8_E4M3 + weight_scale_inv (norms stay bf16)
  int block_rows = 128, block_cols = 128;  // quantization_config.weight_block_size
  int shards = 1;              // 1: model.safetensors; more: model-0000k-of-0000n + index
  std::string prefix = "model.";
  bool text_config = false;    // model fields inside "text_config" (multimodal checkpoints)
  bool write_scales = true;    // self_attn.q_scale / k_scale scalars
  std::string scale_suffix = "_scale_inv";  // fp8 block scales: DeepSeek's; "_scale": compressed-tensors
  // Per-tensor dtype overrides by short name ("q_a_layernorm"): f32, f16, bf16 or fp8_e4m3.
  std::map<std::string, DType> dtype_of;
};

// e4m3fn decoded from first principles (not through formats.hpp, which the loader uses).
inline float fp8_decode(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const float mag = e == 15 && m == 7 ? NAN : e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

// IEEE half, round to nearest even (finite inputs; the weights written are finite).
inline uint16_t f16_encode(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax >= 0x477FF000) return sign | 0x7C00;  // rounds to infinity (65520 and up)
  if (ax < 0x38800000) {                       // below 2^-14: a subnormal, in units of 2^-24
    float a;
    std::memcpy(&a, &ax, 4);
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  uint32_t h = (((ax >> 23) - 112) << 10) | ((ax & 0x7FFFFF) >> 13);
  const uint32_t rest = ax & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right too
  return uint16_t(sign | h);
}

inline float f16_decode(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const float mag = e == 0 ? std::ldexp(float(m), -24) : e == 31 ? (m ? NAN : INFINITY)
                                                                 : std::ldexp(1.0f + m / 1024.0f, e - 15);
  return (h & 0x8000) ? -mag : mag;
}

inline nlohmann::json checkpoint_config_json(const CheckpointSpec& spec) {
  const LayerConfig& c = spec.cfg;
  nlohmann::json m = {{"model_type", c.name},
                      {"hidden_size", c.hidden},
                      {"num_attention_heads", c.total_heads},
                      {"num_key_value_heads", c.total_heads},
                      {"q_lora_rank", c.q_lora_rank},
                      {"kv_lora_rank", c.kv_lora_rank},
                      {"qk_nope_head_dim", c.qk_nope_dim},
                      {"qk_rope_head_dim", c.qk_rope_dim},
                      {"v_head_dim", c.v_head_dim},
                      {"rms_norm_eps", c.rms_eps},
                      {"num_hidden_layers", spec.num_layers},
                      {"max_position_embeddings", 163840},
                      {"rope_theta", c.yarn.theta}};
  if (c.rope == RopeType::yarn) {
    m["rope_scaling"] = {{"type", "yarn"},
                         {"factor", c.yarn.factor},
                         {"original_max_position_embeddings", c.yarn.original_max_position},
                         {"beta_fast", c.yarn.beta_fast},
                         {"beta_slow", c.yarn.beta_slow},
                         {"mscale", c.yarn.mscale},
                         {"mscale_all_dim", c.yarn.mscale_all_dim}};
  } else {
    m["rope_scaling"] = nullptr;
    m["mla_use_nope"] = true;
  }
  if (c.gate != GateLayout::none) m["mla_use_output_gate"] = true;
  nlohmann::json top = spec.text_config ? nlohmann::json{{"model_type", "multimodal"}, {"text_config", m}} : m;
  if (spec.fp8)
    top["quantization_config"] = {{"quant_method", "fp8"},
                                  {"fmt", "e4m3"},
                                  {"activation_scheme", "dynamic"},
                                  {"weight_block_size", {spec.block_rows, spec.block_cols}}};
  return top;
}

// One [rows, cols] (or [rows]) bf16 tensor stored as `dt`; returns the values load_layer must give.
inline std::vector<uint16_t> add_weight(safetensors::Writer& wr, const std::string& name,
                                        const std::vector<int64_t>& shape, const uint16_t* bf16, DType dt,
                                        int block_rows, int block_cols,
                                        const std::string& scale_suffix = "_scale_inv") {
  const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1, n = rows * cols;
  std::vector<uint16_t> expect(bf16, bf16 + n);
  if (dt == DType::bf16) {
    wr.add_bytes(name, dt, shape, bf16);
  } else if (dt == DType::f32) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = bf16_to_float(bf16[i]);
    wr.add_bytes(name, dt, shape, v.data());
  } else if (dt == DType::f16) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      v[i] = f16_encode(bf16_to_float(bf16[i]));
      expect[i] = float_to_bf16(f16_decode(v[i]));
    }
    wr.add_bytes(name, dt, shape, v.data());
  } else if (dt == DType::fp8_e4m3) {
    // Block scales amax/448 (never powers of two for random data) and RNE fp8 codes.
    const int64_t nbr = (rows + block_rows - 1) / block_rows, nbc = (cols + block_cols - 1) / block_cols;
    std::vector<float> scale(size_t(nbr * nbc));
    for (int64_t br = 0; br < nbr; ++br)
      for (int64_t bc = 0; bc < nbc; ++bc) {
        float amax = 0;
        for (int64_t r = br * block_rows; r < std::min(rows, (br + 1) * block_rows); ++r)
          for (int64_t c = bc * block_cols; c < std::min(cols, (bc + 1) * block_cols); ++c)
            amax = std::max(amax, std::fabs(bf16_to_float(bf16[r * cols + c])));
        scale[br * nbc + bc] = amax > 0 ? amax / 448.0f : 1.0f;
      }
    std::vector<uint8_t> q(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float s = scale[(r / block_rows) * nbc + c / block_cols];
        q[r * cols + c] = float_to_fp8e4m3(bf16_to_float(bf16[r * cols + c]) / s);
        expect[r * cols + c] = float_to_bf16(fp8_decode(q[r * cols + c]) * s);
      }
    wr.add_bytes(name, dt, shape, q.data());
    wr.add_bytes(name + scale_suffix, DType::f32, {nbr, nbc}, scale.data());
  } else {
    detail::fail("checkpoint_writer: unsupported dtype ", dtype_name(dt), " for ", name);
  }
  return expect;
}

// Writes dir/config.json and the safetensors of `spec.layer` holding `w` (all heads, separate or
// no gate). Returns w as load_layer(dir, layer, 1, 0) must return it (fp8 and f16 rounding applied).
inline CheckpointWeights write_checkpoint(const std::string& dir, const CheckpointSpec& spec,
                                          const CheckpointWeights& w) {
  const LayerConfig& c = spec.cfg;
  MLA_REQUIRE(c.gate != GateLayout::merged, "checkpoint_writer: checkpoints hold a separate g_proj");
  std::filesystem::create_directories(dir);
  const int64_t D = c.hidden, Rq = c.q_lora_rank, L = c.kv_lora_rank, R = c.qk_rope_dim;
  const int64_t P = c.qk_nope_dim, V = c.v_head_dim, H = c.total_heads;

  // All tensors into one writer first, then split over shards by name.
  safetensors::Writer all;
  CheckpointWeights out = w;
  for (int layer : {spec.layer, spec.layer + 1}) {
    const bool real = layer == spec.layer;
    auto put = [&](const std::string& shortname, std::vector<int64_t> shape, const uint16_t* src,
                   bool matrix) -> std::vector<uint16_t> {
      const int64_t n = shape.size() == 2 ? shape[0] * shape[1] : shape[0];
      std::vector<uint16_t> v(src, src + n);
      if (!real)
        for (auto& x : v) x ^= 0x8000;  // another layer: the negated weights
      DType dt = matrix && spec.fp8 ? DType::fp8_e4m3 : DType::bf16;
      if (auto it = spec.dtype_of.find(shortname); it != spec.dtype_of.end()) dt = it->second;
      const std::string name =
          spec.prefix + "layers." + std::to_string(layer) + ".self_attn." + shortname + ".weight";
      return add_weight(all, name, shape, v.data(), dt, spec.block_rows, spec.block_cols, spec.scale_suffix);
    };
    std::vector<uint16_t> q_a = put("q_a_proj", {Rq, D}, w.qkv_a.data(), true);
    std::vector<uint16_t> kv_a = put("kv_a_proj_with_mqa", {L + R, D}, w.qkv_a.data() + Rq * D, true);
    std::vector<uint16_t> q_a_norm = put("q_a_layernorm", {Rq}, w.q_a_norm.data(), false);
    std::vector<uint16_t> kv_a_norm = put("kv_a_layernorm", {L}, w.kv_a_norm.data(), false);
    std::vector<uint16_t> q_b = put("q_b_proj", {H * (P + R), Rq}, w.q_b.data(), true);
    std::vector<uint16_t> kv_b = put("kv_b_proj", {H * (P + V), L}, w.kv_b.data(), true);
    std::vector<uint16_t> g;
    if (c.gate == GateLayout::separate) g = put("g_proj", {H * V, D}, w.g_proj.data(), true);
    const std::string attn = spec.prefix + "layers." + std::to_string(layer) + ".self_attn.";
    if (spec.write_scales) {
      all.add_scalar(attn + "q_scale", real ? w.q_scale : 2 * w.q_scale);
      all.add_scalar(attn + "k_scale", real ? w.k_scale : 2 * w.k_scale);
    }
    // Unrelated tensors a real layer has: the loader must not need or trip over them.
    std::vector<uint16_t> o_proj(size_t(D * H * V), 0x3F80);
    all.add_bytes(attn + "o_proj.weight", DType::bf16, {D, H * V}, o_proj.data());
    if (real) {
      q_a.insert(q_a.end(), kv_a.begin(), kv_a.end());
      out.qkv_a = q_a;
      out.q_a_norm = q_a_norm;
      out.kv_a_norm = kv_a_norm;
      out.q_b = q_b;
      out.kv_b = kv_b;
      out.g_proj = g;
    }
  }
  std::ofstream(dir + "/config.json") << checkpoint_config_json(spec).dump(2);

  if (spec.shards <= 1) {
    all.write(dir + "/model.safetensors");
    return out;
  }
  // Re-read the single file's tensors to split them: names in order, round-robin over shards.
  const std::vector<uint8_t> file = all.serialize();
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | file[i];
  const auto header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + int64_t(hlen));
  std::vector<safetensors::Writer> shards(size_t(spec.shards));
  nlohmann::json weight_map = nlohmann::json::object();
  int k = 0;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string tag = e["dtype"];
    const DType dt = tag == "BF16" ? DType::bf16 : tag == "F16" ? DType::f16 : tag == "F32" ? DType::f32 : DType::fp8_e4m3;
    const uint64_t begin = e["data_offsets"][0];
    shards[size_t(k)].add_bytes(name, dt, e["shape"].get<std::vector<int64_t>>(), file.data() + 8 + hlen + begin);
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", k + 1, spec.shards);
    weight_map[name] = fname;
    k = (k + 1) % spec.shards;
  }
  for (int s = 0; s < spec.shards; ++s) {
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, spec.shards);
    shards[size_t(s)].write(dir + "/" + fname);
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", file.size()}}}, {"weight_map", weight_map}}.dump(2);
  return out;
}

// The rows of rank `rank`'s heads (of tp) in full-model weights: what load_layer(.., tp, rank) gives.
inline CheckpointWeights slice_heads(const LayerConfig& full, const CheckpointWeights& w, int tp, int rank) {
  const int64_t D = full.hidden, Rq = full.q_lora_rank, L = full.kv_lora_rank, R = full.qk_rope_dim;
  const int64_t P = full.qk_nope_dim, V = full.v_head_dim, N = full.total_heads / tp;
  auto rows = [&](const std::vector<uint16_t>& v, int64_t per_head, int64_t cols) {
    const auto first = v.begin() + rank * N * per_head * cols;
    return std::vector<uint16_t>(first, first + N * per_head * cols);
  };
  CheckpointWeights s = w;
  s.q_b = rows(w.q_b, P + R, Rq);
  s.kv_b = rows(w.kv_b, P + V, L);
  if (!w.g_proj.empty()) s.g_proj = rows(w.g_proj, V, D);
  return s;
}

// A fresh, empty directory under the build tree for one test.
inline std::string fresh_dir(const std::string& name) {
#ifdef MLA_BINARY_DIR
  const std::filesystem::path root = std::filesystem::path(MLA_BINARY_DIR) / "test_checkpoints";
#else
  const std::filesystem::path root = std::filesystem::temp_directory_path() / "mla_test_checkpoints";
#endif
  const std::filesystem::path dir = root / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace mla::testing
