// mla::load_layer: one MLA layer's weights, this rank's heads, as bf16 CheckpointWeights (kv_b kept in
// MXFP4 where the checkpoint holds it so).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/checkpoint/checkpoint_dir.hpp"
#include "core/checkpoint/hf_config.hpp"
#include "mla/checkpoint.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"

namespace mla {

namespace {

using checkpoint::CheckpointDir;
using checkpoint::TensorRef;

// IEEE half -> float, exact (every half is a float).
float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf, NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else {
    const float sub = std::ldexp(float(man), -24);  // zero or subnormal
    std::memcpy(&bits, &sub, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class T>
T load(const uint8_t* p) {  // tensor data has no alignment guarantee in the file
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

// Element i of a BF16 / F16 / F32 tensor as float (for the few scale values).
float float_at(const TensorRef& t, int64_t i) {
  const uint8_t* p = t.bytes().data();
  if (t.info->dtype == "BF16") return bf16_to_float(load<uint16_t>(p + 2 * i));
  if (t.info->dtype == "F16") return f16_to_float(load<uint16_t>(p + 2 * i));
  return load<float>(p + 4 * i);
}

struct LayerReader {
  CheckpointDir& dir;
  const checkpoint::HfConfig& hf;
  std::string prefix;  // "model.layers.{i}.self_attn."

  // Rows [row0, row0 + nrows) of tensor prefix+name, whose shape must be `shape` ([rows, cols] or
  // [rows]), as bf16 bits into dst.
  void read_rows(const std::string& name, const std::vector<int64_t>& shape, int64_t row0, int64_t nrows,
                 uint16_t* dst) {
    const std::string full = prefix + name;
    const TensorRef t = dir.get(full);
    const auto& info = *t.info;
    MLA_REQUIRE(info.shape == shape, "checkpoint '", t.file->path(), "': tensor '", full, "' has shape ",
                info.shape_str(), ", expected ", shape_str(shape), " from config.json");
    const int64_t cols = shape.size() == 2 ? shape[1] : 1;
    const int64_t n = nrows * cols, first = row0 * cols;
    const std::string& dt = info.dtype;
    if (dt == "BF16") {
      std::memcpy(dst, t.bytes().data() + 2 * first, size_t(n) * 2);
    } else if (dt == "F16") {
      const uint8_t* src = t.bytes().data() + 2 * first;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(f16_to_float(load<uint16_t>(src + 2 * i)));
    } else if (dt == "F32") {
      const uint8_t* src = t.bytes().data() + 4 * first;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(load<float>(src + 4 * i));
    } else if (dt == "F8_E4M3") {
      MLA_REQUIRE(shape.size() == 2, "checkpoint '", t.file->path(), "': tensor '", full,
                  "' is F8_E4M3, which is supported for matrices only");
      read_fp8_rows(t, full, shape, row0, nrows, dst);
    } else {
      detail::fail("checkpoint '", t.file->path(), "': tensor '", full, "' has dtype ", dt,
                   ", expected BF16, F16, F32 or F8_E4M3 (with weight_scale_inv)");
    }
    // A NaN or inf weight (a corrupt file, an fp8 NaN code) would reach every output silently.
    int64_t bad = n;
#pragma omp parallel for reduction(min : bad) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      if ((dst[i] & 0x7F80) == 0x7F80) bad = std::min(bad, i);
    MLA_REQUIRE(bad == n, "checkpoint '", t.file->path(), "': tensor '", full, "' element ", first + bad, " is ",
                bf16_to_float(dst[bad]), ", expected a finite weight");
  }

  // w = fp8 * scale_inv[row / block_rows][col / block_cols] in fp32, rounded to bf16.
  void read_fp8_rows(const TensorRef& t, const std::string& full, const std::vector<int64_t>& shape,
                     int64_t row0, int64_t nrows, uint16_t* dst) {
    // DeepSeek names the block scales weight_scale_inv; compressed-tensors' fp8-block checkpoints
    // name them weight_scale. Both multiply: w = fp8 * scale.
    std::string scale_name = full + "_scale_inv";
    if (!dir.contains(scale_name) && dir.contains(full + "_scale")) scale_name = full + "_scale";
    MLA_REQUIRE(dir.contains(scale_name), "checkpoint '", t.file->path(), "': fp8 tensor '", full,
                "' has no block scales '", scale_name, "' (nor '", full, "_scale')");
    const TensorRef s = dir.get(scale_name);
    const int64_t rows = shape[0], cols = shape[1];
    const int64_t br = hf.block_rows, bc = hf.block_cols;
    const std::vector<int64_t> blocks{(rows + br - 1) / br, (cols + bc - 1) / bc};
    const bool per_tensor = s.info->numel() == 1 && s.info->shape.size() <= 1;
    MLA_REQUIRE(s.info->dtype == "F32" || s.info->dtype == "BF16" || s.info->dtype == "F16", "checkpoint '",
                s.file->path(), "': scale '", scale_name, "' has dtype ", s.info->dtype, ", expected F32");
    MLA_REQUIRE(per_tensor || s.info->shape == blocks, "checkpoint '", s.file->path(), "': scale '", scale_name,
                "' has shape ", s.info->shape_str(), ", expected ", shape_str(blocks), " (", br, "x", bc,
                " blocks of ", shape_str(shape), ") or a single value");
    // The scales of the rows read must be finite: a NaN block would pass silently into every output.
    const int64_t sc = per_tensor ? 1 : blocks[1];
    const int64_t sb0 = per_tensor ? 0 : row0 / br, sb1 = per_tensor ? 1 : (row0 + nrows + br - 1) / br;
    std::vector<float> scale(size_t((sb1 - sb0) * sc));
    for (int64_t i = 0; i < int64_t(scale.size()); ++i) {
      scale[i] = float_at(s, sb0 * sc + i);
      MLA_REQUIRE(std::isfinite(scale[i]), "checkpoint '", s.file->path(), "': scale '", scale_name,
                  "' element ", sb0 * sc + i, " is ", scale[i], ", expected a finite value");
    }
    std::array<float, 256> lut;
    for (int b = 0; b < 256; ++b) lut[b] = fp8e4m3_to_float(uint8_t(b));
    const uint8_t* q = t.bytes().data();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t row = row0 + r;
      const float* srow = per_tensor ? scale.data() : scale.data() + (row / br - sb0) * sc;
      for (int64_t c = 0; c < cols; ++c)
        dst[r * cols + c] = float_to_bf16(lut[q[row * cols + c]] * srow[per_tensor ? 0 : c / bc]);
    }
  }

  // Rows [row0, row0 + nrows) of an MXFP4 matrix [rows, cols] stored as gpt-oss checkpoints do (the
  // layout Hugging Face transformers reads): prefix+name+"_blocks" U8 [rows, cols/32, 16] (two E2M1
  // codes a byte, the first in the low nibble) and prefix+name+"_scales" U8 [rows, cols/32] (E8M0).
  // Codes and scales are copied as they are.
  MxFp4Matrix read_mxfp4_rows(const std::string& name, int64_t rows, int64_t cols, int64_t row0, int64_t nrows) {
    const std::string blocks_name = prefix + name + "_blocks", scales_name = prefix + name + "_scales";
    MLA_REQUIRE(dir.contains(scales_name), "checkpoint '", dir.dir(), "': MXFP4 tensor '", blocks_name,
                "' has no scales '", scales_name, "'");
    MLA_REQUIRE(dir.contains(blocks_name), "checkpoint '", dir.dir(), "': MXFP4 scales '", scales_name,
                "' have no blocks '", blocks_name, "'");
    const int64_t nb = cols / kMxBlock;  // cols = L: LayerConfig::validate made it a multiple of 32
    const TensorRef b = dir.get(blocks_name), s = dir.get(scales_name);
    MLA_REQUIRE(b.info->dtype == "U8", "checkpoint '", b.file->path(), "': MXFP4 blocks '", blocks_name,
                "' have dtype ", b.info->dtype, ", expected U8 (two E2M1 codes a byte)");
    MLA_REQUIRE(s.info->dtype == "U8", "checkpoint '", s.file->path(), "': MXFP4 scales '", scales_name,
                "' have dtype ", s.info->dtype, ", expected U8 (E8M0)");
    const std::vector<int64_t> bshape{rows, nb, kMxBlock / 2}, sshape{rows, nb};
    MLA_REQUIRE(b.info->shape == bshape, "checkpoint '", b.file->path(), "': MXFP4 blocks '", blocks_name,
                "' have shape ", b.info->shape_str(), ", expected ", shape_str(bshape), " ([rows, cols/32, 16] of [",
                rows, ", ", cols, "] from config.json)");
    MLA_REQUIRE(s.info->shape == sshape, "checkpoint '", s.file->path(), "': MXFP4 scales '", scales_name,
                "' have shape ", s.info->shape_str(), ", expected ", shape_str(sshape), " ([rows, cols/32] of [",
                rows, ", ", cols, "] from config.json)");
    MxFp4Matrix m{.batch = 1, .rows = int(nrows), .cols = int(cols), .codes = {}, .scales = {}};
    const uint8_t* codes = b.bytes().data() + row0 * (cols / 2);
    const uint8_t* scales = s.bytes().data() + row0 * nb;
    m.codes.assign(codes, codes + nrows * (cols / 2));
    m.scales.assign(scales, scales + nrows * nb);
    // 255 is E8M0's NaN and 6 * 2^(253-127) overflows float: either would reach every output as
    // inf/NaN. 252 is the largest scale MXFP4 packing of finite floats gives.
    for (int64_t i = 0; i < nrows * nb; ++i)
      MLA_REQUIRE(m.scales[size_t(i)] <= 252, "checkpoint '", s.file->path(), "': MXFP4 scales '", scales_name,
                  "' element [", row0 + i / nb, ", ", i % nb, "] is ", int(m.scales[size_t(i)]),
                  m.scales[size_t(i)] == 0xFF ? " (NaN)" : "", ", expected an E8M0 scale <= 252 (larger ones overflow float)");
    return m;
  }

  // An optional scalar (q_scale, k_scale): `fallback` when absent.
  float scalar_or(std::initializer_list<const char*> names, float fallback) {
    for (const char* name : names) {
      const std::string full = prefix + name;
      if (!dir.contains(full)) continue;
      const TensorRef t = dir.get(full);
      MLA_REQUIRE(t.info->numel() == 1 && t.info->shape.size() <= 1 &&
                      (t.info->dtype == "F32" || t.info->dtype == "BF16" || t.info->dtype == "F16"),
                  "checkpoint '", t.file->path(), "': '", full, "' must be a single F32 value, got ", t.info->dtype,
                  t.info->shape_str());
      const float v = float_at(t, 0);
      MLA_REQUIRE(std::isfinite(v) && v > 0, "checkpoint '", t.file->path(), "': '", full,
                  "' must be finite and > 0, got ", v);
      return v;
    }
    return fallback;
  }
};

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// "<prefix>layers.{i}.self_attn.": "model." normally, found from the names otherwise.
std::string attention_prefix(const CheckpointDir& dir, int layer) {
  const std::string attn = "layers." + std::to_string(layer) + ".self_attn.";
  const std::string marker = attn + "kv_a_proj_with_mqa.weight";
  if (dir.contains("model." + marker)) return "model." + attn;
  const std::vector<std::string> names = dir.names();
  for (const auto& n : names) {
    if (ends_with(n, marker) && (n.size() == marker.size() || n[n.size() - marker.size() - 1] == '.'))
      return n.substr(0, n.size() - marker.size()) + attn;
  }
  for (const auto& n : names) {
    const std::string q_proj = attn + "q_proj.weight";
    if (ends_with(n, q_proj) && (n.size() == q_proj.size() || n[n.size() - q_proj.size() - 1] == '.'))
      detail::fail("checkpoint '", dir.dir(), "': layer ", layer, " has '", n,
                   "' and no kv_a_proj_with_mqa: not an MLA layer with q LoRA; not supported yet");
  }
  detail::fail("checkpoint '", dir.dir(), "': no tensor '", "model." + marker, "' (nor any '*.", marker,
               "'): layer ", layer, " is not an MLA layer of this checkpoint");
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

CheckpointLayer load_layer(const std::string& dir_path, int layer, int tp, int rank) {
  const std::string config_path = dir_path + "/config.json";
  const checkpoint::HfConfig hf =
      checkpoint::parse_hf_config(checkpoint::read_text_file(config_path), tp, config_path);
  const LayerConfig& cfg = hf.layer;
  MLA_REQUIRE(rank >= 0 && rank < tp, "rank: expected in [0, ", tp, "), got ", rank);
  MLA_REQUIRE(layer >= 0, "layer: expected >= 0, got ", layer);
  MLA_REQUIRE(hf.num_layers < 0 || layer < hf.num_layers, "layer: expected < ", hf.num_layers, " (", config_path,
              ": num_hidden_layers + num_nextn_predict_layers), got ", layer);
  // Kimi Linear / K3 interleave linear-attention (KDA) layers; their lists are 1-based.
  MLA_REQUIRE(!contains(hf.kda_layers, layer + 1) && (hf.mla_layers.empty() || contains(hf.mla_layers, layer + 1)),
              "layer: ", layer, " is a linear-attention (KDA) layer, not MLA (", config_path,
              ": linear_attn_config.full_attn_layers lists the MLA layers, 1-based)");

  CheckpointDir dir(dir_path);
  LayerReader rd{dir, hf, attention_prefix(dir, layer)};
  MLA_REQUIRE(dir.contains(rd.prefix + "q_a_proj.weight") || !dir.contains(rd.prefix + "q_proj.weight"),
              "checkpoint '", dir_path, "': layer ", layer, " has q_proj instead of q_a_proj/q_b_proj (no q LoRA): ",
              "not supported yet");
  const bool has_g_proj = dir.contains(rd.prefix + "g_proj.weight");
  MLA_REQUIRE(cfg.gate == GateLayout::none || has_g_proj, "checkpoint '", dir_path, "': ", config_path,
              " sets mla_use_output_gate but there is no '", rd.prefix, "g_proj.weight'");
  MLA_REQUIRE(cfg.gate != GateLayout::none || !has_g_proj, "checkpoint '", dir_path, "': '", rd.prefix,
              "g_proj.weight' exists but ", config_path, " does not set mla_use_output_gate: true");

  const int64_t D = cfg.hidden, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank, R = cfg.qk_rope_dim;
  const int64_t P = cfg.qk_nope_dim, V = cfg.v_head_dim, Ht = cfg.total_heads, N = cfg.heads();
  CheckpointLayer out{.config = cfg, .weights = {}};
  CheckpointWeights& w = out.weights;
  w.qkv_a.resize(size_t((Rq + L + R) * D));
  rd.read_rows("q_a_proj.weight", {Rq, D}, 0, Rq, w.qkv_a.data());
  rd.read_rows("kv_a_proj_with_mqa.weight", {L + R, D}, 0, L + R, w.qkv_a.data() + Rq * D);
  w.q_a_norm.resize(size_t(Rq));
  rd.read_rows("q_a_layernorm.weight", {Rq}, 0, Rq, w.q_a_norm.data());
  w.kv_a_norm.resize(size_t(L));
  rd.read_rows("kv_a_layernorm.weight", {L}, 0, L, w.kv_a_norm.data());
  // This rank's heads: rows rank*N*(head rows) .. (rank+1)*N*(head rows) of the per-head weights.
  w.q_b.resize(size_t(N * (P + R) * Rq));
  rd.read_rows("q_b_proj.weight", {Ht * (P + R), Rq}, rank * N * (P + R), N * (P + R), w.q_b.data());
  const bool kv_b_mxfp4 = dir.contains(rd.prefix + "kv_b_proj.weight_blocks") ||
                          dir.contains(rd.prefix + "kv_b_proj.weight_scales");
  if (kv_b_mxfp4) {  // kept in MXFP4 as the checkpoint holds it; prepare_weights re-packs W_UK only
    MLA_REQUIRE(!dir.contains(rd.prefix + "kv_b_proj.weight"), "checkpoint '", dir_path, "': layer ", layer,
                " has both '", rd.prefix, "kv_b_proj.weight' and MXFP4 '", rd.prefix,
                "kv_b_proj.weight_blocks/_scales', expected one form of kv_b");
    w.kv_b_mxfp4 = rd.read_mxfp4_rows("kv_b_proj.weight", Ht * (P + V), L, rank * N * (P + V), N * (P + V));
  } else {
    w.kv_b.resize(size_t(N * (P + V) * L));
    rd.read_rows("kv_b_proj.weight", {Ht * (P + V), L}, rank * N * (P + V), N * (P + V), w.kv_b.data());
  }
  if (cfg.gate == GateLayout::separate) {
    w.g_proj.resize(size_t(N * V * D));
    rd.read_rows("g_proj.weight", {Ht * V, D}, rank * N * V, N * V, w.g_proj.data());
  }
  w.q_scale = rd.scalar_or({"q_scale"}, 1.0f);
  w.k_scale = rd.scalar_or({"k_scale", "kv_scale"}, 1.0f);
  return out;
}

}  // namespace mla
