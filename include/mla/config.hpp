#pragma once
// The layer's dimensions, per SPEC.md. Presets: kimi-k3, deepseek-v3, kimi-k2; every field can be
// overridden after choosing a preset. The CUDA kernels fix L = 512 and R = 64 (rows of 576).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mla {

// Where the output gate's weight lives in the checkpoint.
enum class GateLayout : uint8_t {
  none,      // no gate
  merged,    // rows [Rq + L + R, Rq + L + R + N*V) of qkv_a
  separate,  // its own g_proj [N*V, D]
};

enum class RopeType : uint8_t { none, yarn };  // none: NoPE, the R part is not rotated

// DeepSeek YaRN parameters (config.json's rope_scaling plus rope_theta).
struct YarnParams {
  double theta = 10000.0;
  double factor = 40.0;
  double original_max_position = 4096.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 1.0;
};

struct LayerConfig {
  std::string name = "kimi-k3";
  int hidden = 7168;        // D
  int q_lora_rank = 1536;   // Rq
  int kv_lora_rank = 512;   // L
  int qk_nope_dim = 128;    // P
  int qk_rope_dim = 64;     // R
  int v_head_dim = 128;     // V
  int total_heads = 96;     // Ht
  int tp_size = 8;          // T
  GateLayout gate = GateLayout::merged;
  RopeType rope = RopeType::none;
  YarnParams yarn{};
  double rms_eps = 1e-6;

  int heads() const { return total_heads / tp_size; }  // N, this rank's heads
  int row_dim() const { return kv_lora_rank + qk_rope_dim; }  // L + R = 576
  int qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }  // P + R
  int gate_dim() const { return gate == GateLayout::none ? 0 : heads() * v_head_dim; }
  // Rows of the prepared qkv_a GEMM: [q_a | kv_a | k_pe | gate] (a separate g_proj is appended).
  int qkv_a_rows() const { return q_lora_rank + kv_lora_rank + qk_rope_dim + gate_dim(); }
  // (P+R)^-0.5 * m^2, m the YaRN mscale from mscale_all_dim (1 without YaRN).
  double sm_scale() const;
  // Throws mla::Error naming the first inconsistent field.
  void validate() const;

  static LayerConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();
};

// Decode context parallelism: rank `rank` of `size` holds positions p with (p / interleave) % size
// == rank (SPEC.md, DCP).
struct DcpInfo {
  int size = 1;
  int rank = 0;
  int interleave = 1;
};

}  // namespace mla
