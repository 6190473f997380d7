#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (deterministic; rerun after changing a seed):
corpus/safetensors_header/seed_*: valid files and one file per malformed case the reader names;
corpus/config_json/seed_*: a tp byte followed by config.json texts (DeepSeek-V3, Kimi K3 style, broken).
Files a fuzzer finds (crash-*, or minimized inputs worth keeping) are added next to them by hand."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def st_file(header, data=b"", length=None):
    text = header if isinstance(header, str) else json.dumps(header)
    text = text.encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def safetensors_seeds():
    ok = {"__metadata__": {"format": "pt"},
          "a": t("BF16", [2, 3], 0, 12), "b": t("F16", [2], 12, 16), "c": t("F32", [], 16, 20),
          "d": t("F8_E4M3", [3, 1], 20, 23), "e": t("U8", [1], 23, 24), "f": t("I32", [2], 24, 32),
          "g": t("I64", [1], 32, 40), "z": t("F32", [0, 5], 40, 40)}
    layer = "model.layers.0.self_attn."
    ds = {layer + "q_a_proj.weight": t("F8_E4M3", [4, 8], 0, 32),
          layer + "q_a_proj.weight_scale_inv": t("F32", [1, 1], 32, 36),
          layer + "q_a_layernorm.weight": t("BF16", [4], 36, 44),
          layer + "k_scale": t("F32", [], 44, 48)}
    yield "valid_dtypes", st_file(ok, bytes(range(40)))
    yield "valid_layer", st_file(ds, bytes(48))
    yield "valid_empty", st_file("{}")
    yield "valid_padded", st_file('{"x": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}}    ', b"abc")
    yield "empty", b""
    yield "short_length", b"\x01\x00\x00\x00\x00"
    yield "length_past_end", st_file({"t": t("F32", [2], 0, 8)}, bytes(8), length=4096)
    yield "length_huge", st_file("{}", length=1 << 62)
    yield "not_json", st_file('{"t": {"dtype": ', bytes(8))
    yield "not_object", st_file("[1, 2, 3]")
    yield "deep_nesting", st_file("[" * 40 + "]" * 40)
    yield "unknown_dtype", st_file({"t": t("F7", [2], 0, 8)}, bytes(8))
    yield "negative_dim", st_file({"t": t("F32", [-2], 0, 8)}, bytes(8))
    yield "dim_overflow", st_file({"t": t("F32", [1 << 32, 1 << 32], 0, 8)}, bytes(8))
    yield "reversed_offsets", st_file({"t": t("F32", [0], 8, 0)}, bytes(8))
    yield "offsets_outside", st_file({"t": t("F32", [2], 4, 12)}, bytes(8))
    yield "size_mismatch", st_file({"t": t("BF16", [2], 0, 8)}, bytes(8))
    yield "overlap", st_file({"a": t("F32", [2], 0, 8), "b": t("F32", [1], 4, 8)}, bytes(8))
    yield "metadata_not_string", st_file({"__metadata__": {"k": 1}})


def config_seeds():
    deepseek = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
                "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 10000, "num_hidden_layers": 61,
                "num_nextn_predict_layers": 1,
                "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
                "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    k3 = {"model_type": "kimi_k3", "text_config": dict(deepseek, num_attention_heads=96, mla_use_nope=True,
                                                       mla_use_output_gate=True, rope_scaling=None,
                                                       linear_attn_config={"kda_layers": [1, 2, 3],
                                                                           "full_attn_layers": [4]})}
    v5 = dict(deepseek)
    del v5["rope_scaling"]
    v5["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 50000, "factor": 32}
    yield "deepseek_v3", b"\x07" + json.dumps(deepseek).encode()
    yield "kimi_k3", b"\x07" + json.dumps(k3).encode()
    yield "rope_parameters", b"\x01" + json.dumps(v5).encode()
    yield "no_q_lora", b"\x00" + json.dumps(dict(deepseek, q_lora_rank=None)).encode()
    yield "broken", b"\x02" + json.dumps(deepseek).encode()[:100]


for sub, seeds in (("safetensors_header", safetensors_seeds()), ("config_json", config_seeds())):
    d = os.path.join(HERE, "corpus", sub)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds:
        with open(os.path.join(d, "seed_" + name), "wb") as f:
            f.write(data)
