#pragma once
// One MLA layer from a Hugging Face style checkpoint directory: config.json plus *.safetensors,
// sharded (model.safetensors.index.json's weight_map) or in one file.
//
//   auto [cfg, ckpt] = mla::load_layer("/models/DeepSeek-V3", 3, /*tp=*/8, /*rank=*/2);
//   mla::Layer layer(cfg, mla::prepare_weights(cfg, ckpt));
//
// config.json (or its "text_config", for multimodal checkpoints):
//   hidden_size, num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
//   v_head_dim, rms_norm_eps (default 1e-6), rope_theta, rope_scaling (or transformers v5's
//   rope_parameters), mla_use_nope, mla_use_output_gate, quantization_config.weight_block_size.
//   - rope_scaling {type|rope_type: "yarn"|"deepseek_yarn"}: DeepSeek YaRN; missing fields take the
//     defaults of DeepSeek's modeling code (original_max_position_embeddings 4096, beta_fast 32,
//     beta_slow 1, mscale 1, mscale_all_dim 0).
//   - rope_scaling null / absent / "default": plain RoPE, expressed as YaRN with factor 1 (which is
//     exactly plain RoPE with sm_scale (P+R)^-0.5: both YaRN frequency sets coincide, mscale = 1).
//   - mla_use_nope: true (Kimi Linear / Kimi K3): RopeType::none, the R part is not rotated.
//   - mla_use_output_gate: true (Kimi K3): a gate sigmoid(g_proj(hidden)), GateLayout::separate.
//   - q_lora_rank null (q_proj instead of q_a_proj/q_b_proj): "not supported yet".
//
// Weights, under "<prefix>layers.{i}.self_attn." (prefix "model." normally; any other, e.g.
// "language_model.model.", is found from the tensor names):
//   q_a_proj.weight [Rq, D], kv_a_proj_with_mqa.weight [L+R, D] (kv_a rows, then k_pe rows),
//   q_a_layernorm.weight [Rq], kv_a_layernorm.weight [L], q_b_proj.weight [Ht*(P+R), Rq],
//   kv_b_proj.weight [Ht*(P+V), L], and with the gate g_proj.weight [Ht*V, D].
//   Each BF16, F16 or F32, or F8_E4M3 with "<name>_scale_inv" (or compressed-tensors'
//   "<name>_scale") F32 block scales
//   [ceil(rows/128), ceil(cols/128)] (block size from quantization_config.weight_block_size):
//   w = fp8 * scale_inv[row/128][col/128] in fp32, rounded to bf16 (what DeepSeek's
//   fp8_cast_bf16 does). Optional scalar q_scale / k_scale (or kv_scale) tensors give
//   CheckpointWeights' q_scale / k_scale; without them both are 1.
//   kv_b may instead be MXFP4 as gpt-oss checkpoints store it (the layout transformers reads):
//   kv_b_proj.weight_blocks U8 [Ht*(P+V), L/32, 16] (two E2M1 codes a byte, the first in the low
//   nibble) and kv_b_proj.weight_scales U8 [Ht*(P+V), L/32] (E8M0, at most 252). It is kept as
//   it is in CheckpointWeights::kv_b_mxfp4 (kv_b empty): W_UV's codes and scales reach the prepared
//   weights bit for bit; W_UK is dequantized exactly and re-packed along P (its reduced dimension).
// The rank's heads are rank*N .. (rank+1)*N with N = Ht/tp: the matching rows of q_b_proj, kv_b_proj
// and g_proj. Everything is checked (shapes against config.json, dtypes, finite block scales and weights) and
// each problem is an mla::Error naming the file, the tensor and the expected and actual values.
#include <string>
#include <string_view>

#include "mla/config.hpp"
#include "mla/weights.hpp"

namespace mla {

struct CheckpointLayer {
  LayerConfig config;         // tp_size = tp: config.heads() is this rank's N
  CheckpointWeights weights;  // this rank's heads, bf16 (kv_b in MXFP4 where the checkpoint has it so)
};

// config.json's text (the layer's dimensions) with tp_size = tp. `what` names it in errors.
LayerConfig layer_config_from_json(std::string_view config_json, int tp = 1,
                                   std::string_view what = "config.json");
// dir/config.json.
LayerConfig load_layer_config(const std::string& dir, int tp = 1);

// Layer `layer` (0-based, as in the tensor names) for rank `rank` of `tp`.
CheckpointLayer load_layer(const std::string& dir, int layer, int tp = 1, int rank = 0);

}  // namespace mla
