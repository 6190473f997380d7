#pragma once
// config.json of a DeepSeek-V3 / Kimi style checkpoint: the layer's dimensions and what loading a
// layer needs besides (fp8 block size, which layers exist and which are MLA).
#include <string_view>
#include <vector>

#include "mla/config.hpp"

namespace mla::checkpoint {

struct HfConfig {
  LayerConfig layer;               // tp_size = the tp asked for
  int block_rows = 128;            // quantization_config.weight_block_size: fp8 scale blocks
  int block_cols = 128;
  int num_layers = -1;             // num_hidden_layers + num_nextn_predict_layers; -1 unknown
  std::vector<int> kda_layers;     // linear_attn_config.kda_layers (1-based): not MLA layers
  std::vector<int> mla_layers;     // linear_attn_config.full_attn_layers (1-based)
};

// `what` names the text in errors (a path, usually).
HfConfig parse_hf_config(std::string_view text, int tp, std::string_view what);

}  // namespace mla::checkpoint
