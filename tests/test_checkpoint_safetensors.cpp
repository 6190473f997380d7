// The safetensors reader (src/core/checkpoint/safetensors.hpp): every malformed header gets its own
// mla::Error, and hostile input (the fuzz corpus, deterministic mutations, libFuzzer where built)
// never gets past the checks that keep reads inside the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/checkpoint/hf_config.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "mla/checkpoint.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "support/checkpoint_writer.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

namespace st = safetensors;
using testing::error_of;

// A file: 8-byte length (`len` when given, else the header's size), the header text, the data.
std::vector<uint8_t> file_of(const std::string& header, size_t data_bytes, int64_t len = -1) {
  std::vector<uint8_t> f(8 + header.size() + data_bytes, 0x5A);
  const uint64_t n = len < 0 ? header.size() : uint64_t(len);
  for (int i = 0; i < 8; ++i) f[i] = uint8_t(n >> (8 * i));
  std::copy(header.begin(), header.end(), f.begin() + 8);
  return f;
}

std::string parse_error(const std::vector<uint8_t>& f) {
  return error_of([&] { st::parse_header(f, "t.safetensors"); });
}

TEST(Safetensors, ValidHeaderWithEveryDtype) {
  const std::string h = R"({"__metadata__": {"format": "pt"},
    "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
    "b": {"dtype": "F16", "shape": [2], "data_offsets": [12, 16]},
    "c": {"dtype": "F32", "shape": [], "data_offsets": [16, 20]},
    "d": {"dtype": "F8_E4M3", "shape": [3, 1], "data_offsets": [20, 23]},
    "e": {"dtype": "U8", "shape": [1], "data_offsets": [23, 24]},
    "f": {"dtype": "I32", "shape": [2], "data_offsets": [24, 32]},
    "g": {"dtype": "I64", "shape": [1], "data_offsets": [32, 40]},
    "empty": {"dtype": "F32", "shape": [0, 5], "data_offsets": [40, 40]}})";
  const std::vector<uint8_t> f = file_of(h, 40);
  const st::Header hd = st::parse_header(f, "t");
  ASSERT_EQ(hd.tensors.size(), 8u);
  EXPECT_EQ(hd.metadata.at("format"), "pt");
  EXPECT_EQ(hd.data_offset, 8 + h.size());
  EXPECT_EQ(hd.data_size, 40u);
  const st::TensorInfo* d = hd.find("d");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->dtype, "F8_E4M3");
  EXPECT_EQ(d->shape, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(d->begin, 20u);
  EXPECT_EQ(d->end, 23u);
  EXPECT_EQ(hd.find("c")->numel(), 1);
  EXPECT_EQ(hd.find("empty")->numel(), 0);
  EXPECT_EQ(hd.find("missing"), nullptr);
}

TEST(Safetensors, FileMapsWhatTheWriterWrote) {
  const std::string dir = testing::fresh_dir("safetensors_file");
  st::Writer wr;
  const std::vector<uint16_t> a{1, 2, 3, 0xFFFF, 5, 6};
  const std::vector<uint8_t> b{7, 8, 9};
  wr.add_bytes("a", DType::bf16, {2, 3}, a.data());
  wr.add_bytes("b", DType::fp8_e4m3, {3}, b.data());
  wr.add_scalar("s", 0.25f);
  wr.write(dir + "/x.safetensors");
  const st::File f(dir + "/x.safetensors");
  const auto bytes = f.bytes(*f.find("a"));
  ASSERT_EQ(bytes.size(), 12u);
  EXPECT_EQ(std::memcmp(bytes.data(), a.data(), 12), 0);
  EXPECT_EQ(std::memcmp(f.bytes(*f.find("b")).data(), b.data(), 3), 0);
  float s;
  std::memcpy(&s, f.bytes(*f.find("s")).data(), 4);
  EXPECT_EQ(s, 0.25f);
  EXPECT_NE(error_of([&] { st::File("/nonexistent/x.safetensors"); }).find("cannot open"), std::string::npos);
  EXPECT_NE(error_of([&] { st::File g(dir); }).find("is not a regular file"), std::string::npos);
  std::ofstream(dir + "/empty.safetensors");
  EXPECT_NE(error_of([&] { st::File g(dir + "/empty.safetensors"); }).find("truncated file: 0 bytes"),
            std::string::npos);
}

struct Malformed {
  const char* name;
  std::vector<uint8_t> file;
  const char* expect;
};

std::vector<Malformed> malformed_cases() {
  const std::string ok = R"("t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  std::string deep(40, '[');
  deep += std::string(40, ']');
  return {
      {"empty", {}, "truncated file: 0 bytes"},
      {"short_length", {1, 0, 0, 0, 0}, "truncated file: 5 bytes"},
      {"length_past_end", file_of("{" + ok + "}", 8, 4096), "header length 4096 runs past the end"},
      {"length_huge", file_of("{}", 0, int64_t(1) << 62), "exceeds the limit"},
      {"length_tiny", file_of("{}", 0, 1), "too short for a JSON object"},
      {"not_json", file_of("{\"t\": {\"dtype\": ", 8), "not valid JSON"},
      {"not_object", file_of("[1, 2, 3]", 0), "must be a JSON object, got array"},
      {"deep_nesting", file_of(deep, 0), "nests deeper than"},
      {"entry_not_object", file_of(R"({"t": 5})", 0), "tensor 't' must be an object"},
      {"no_dtype", file_of(R"({"t": {"shape": [2], "data_offsets": [0, 8]}})", 8), "has no string 'dtype'"},
      {"unknown_dtype", file_of(R"({"t": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}})", 8),
       "unknown dtype 'F7'"},
      {"no_shape", file_of(R"({"t": {"dtype": "F32", "data_offsets": [0, 8]}})", 8), "has no 'shape' array"},
      {"negative_dim", file_of(R"({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8),
       "not a non-negative integer: -2"},
      {"dim_overflow",
       file_of(R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8),
       "element count that overflows"},
      {"bytes_overflow",
       file_of(R"({"t": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 8]}})", 8),
       "element count that overflows"},
      {"bad_offsets", file_of(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8),
       "needs 'data_offsets' as two non-negative integers"},
      {"reversed_offsets", file_of(R"({"t": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", 8),
       "end before they begin"},
      {"offsets_outside", file_of(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 8),
       "outside the data section of 8 bytes"},
      {"size_mismatch", file_of(R"({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 8]}})", 8),
       "is BF16[2] = 4 bytes, but its data_offsets [0, 8) hold 8"},
      {"overlap",
       file_of(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8),
       "overlap"},
      {"metadata_not_string", file_of(R"({"__metadata__": {"k": 1}})", 0), "__metadata__['k'] must be a string"},
  };
}

// Each malformed case gets its own message, naming what is wrong.
TEST(Safetensors, MalformedHeadersEachGetTheirOwnError) {
  std::vector<std::string> seen;
  for (const Malformed& m : malformed_cases()) {
    SCOPED_TRACE(m.name);
    const std::string msg = parse_error(m.file);
    EXPECT_NE(msg.find(m.expect), std::string::npos) << "message: " << msg;
    EXPECT_NE(msg.find("t.safetensors"), std::string::npos) << "the message names the file: " << msg;
    EXPECT_EQ(std::find(seen.begin(), seen.end(), msg), seen.end()) << "two cases share the message " << msg;
    seen.push_back(msg);
  }
}

// What the reader promises the loader: every tensor's bytes lie inside the file, match its shape
// and dtype, and overlap no other tensor's.
void expect_sound(const st::Header& h, size_t file_size) {
  ASSERT_EQ(h.data_offset + h.data_size, file_size);
  uint64_t prev_end = 0;
  for (const auto& t : h.tensors) {
    ASSERT_LE(t.begin, t.end);
    ASSERT_LE(t.end, h.data_size);
    ASSERT_EQ(t.bytes(), uint64_t(t.numel()) * uint64_t(t.elem_size));
    if (t.bytes() == 0) continue;
    ASSERT_GE(t.begin, prev_end) << t.name;
    prev_end = t.end;
  }
}

// Runs the parser on one input: it either succeeds with a sound header or throws mla::Error.
// Any other exception (or a crash) fails the test.
void parse_hostile(const std::vector<uint8_t>& f) {
  try {
    expect_sound(st::parse_header(f, "fuzz"), f.size());
  } catch (const Error&) {
  }
}

std::string corpus_dir(const char* target = "safetensors_header") {
  return std::string(MLA_SOURCE_DIR) + "/fuzz/corpus/" + target;
}

std::vector<std::vector<uint8_t>> read_corpus(const char* target = "safetensors_header") {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& e : std::filesystem::directory_iterator(corpus_dir(target))) {
    std::ifstream in(e.path(), std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

// The libFuzzer corpus (seeds and any crash ever found), replayed in every test run.
TEST(SafetensorsFuzz, CorpusReplay) {
  const auto corpus = read_corpus();
  ASSERT_GE(corpus.size(), 10u) << corpus_dir();
  int parsed = 0;
  for (const auto& f : corpus) {
    parse_hostile(f);
    parsed += error_of([&] { st::parse_header(f, "fuzz"); }).empty();
  }
  EXPECT_GE(parsed, 1) << "the corpus holds valid files too";
}

// config.json's corpus (fuzz_config_json: a tp byte, then the text): a config or mla::Error.
TEST(SafetensorsFuzz, ConfigCorpusReplay) {
  const auto corpus = read_corpus("config_json");
  ASSERT_GE(corpus.size(), 3u);
  int parsed = 0;
  for (const auto& f : corpus) {
    if (f.empty()) continue;
    const std::string_view text(reinterpret_cast<const char*>(f.data() + 1), f.size() - 1);
    parsed += error_of([&] { checkpoint::parse_hf_config(text, 1 + f[0] % 8, "fuzz").layer.validate(); }).empty();
  }
  EXPECT_GE(parsed, 1) << "the corpus holds valid configs too";
}

// Deterministic mutations of the corpus and the malformed cases: bit flips, byte overwrites with
// JSON-significant characters, truncation, insertion, and lies in the length prefix.
TEST(SafetensorsFuzz, DeterministicMutations) {
  std::vector<std::vector<uint8_t>> seeds = read_corpus();
  for (const auto& m : malformed_cases()) seeds.push_back(m.file);
  std::mt19937_64 rng(20261202);
  const char interesting[] = "{}[]\":,-0123456789eE.   \\";
  for (int iter = 0; iter < 30000; ++iter) {
    std::vector<uint8_t> f = seeds[rng() % seeds.size()];
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = f.empty() ? 0 : rng() % f.size();
      switch (rng() % 6) {
        case 0:
          if (!f.empty()) f[pos] ^= uint8_t(1u << (rng() % 8));
          break;
        case 1:
          if (!f.empty()) f[pos] = uint8_t(interesting[rng() % (sizeof interesting - 1)]);
          break;
        case 2: f.resize(f.empty() ? 0 : rng() % f.size()); break;
        case 3: f.insert(f.begin() + int64_t(pos), uint8_t(interesting[rng() % (sizeof interesting - 1)])); break;
        case 4:
          if (f.size() >= 8) {  // the length prefix off by a little
            uint64_t n = 0;
            for (int i = 7; i >= 0; --i) n = (n << 8) | f[i];
            n += uint64_t(int64_t(rng() % 17) - 8);
            for (int i = 0; i < 8; ++i) f[i] = uint8_t(n >> (8 * i));
          }
          break;
        case 5:  // a digit run grown into a huge number
          if (!f.empty()) {
            const std::string big = std::to_string(rng());
            f.insert(f.begin() + int64_t(pos), big.begin(), big.end());
          }
          break;
      }
    }
    parse_hostile(f);
    if (HasFatalFailure()) {
      ADD_FAILURE() << "iteration " << iter;
      return;
    }
  }
}

// A sharded checkpoint written by the reference implementation (Python safetensors, numpy F16 and
// F32 tensors, a 0-d scale) loads with the values Python wrote.
TEST(Safetensors, LoadsACheckpointWrittenByPythonSafetensors) {
  if (std::system("python3 -c 'import safetensors, numpy' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with safetensors and numpy not installed (scripts/setup.sh installs them)";
  const std::string dir = testing::fresh_dir("python_written");
  // Values k/64 with |k| <= 125: exact in f16, f32 and bf16, so the expected bits are exact too.
  const std::string script = R"(
import json, sys, numpy as np
from safetensors.numpy import save_file
d, D, Rq, L, R, P, V, H = sys.argv[1], 96, 80, 512, 64, 32, 32, 2
a = "model.layers.1.self_attn."
def val(shape, t, dt):
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    return ((((i * 37 + t * 11) % 251) - 125) / 64.0).astype(dt).reshape(shape)
shard1 = {a + "q_a_proj.weight": val((Rq, D), 0, np.float16), a + "kv_a_proj_with_mqa.weight": val((L + R, D), 1, np.float32),
          a + "q_a_layernorm.weight": val((Rq,), 2, np.float32), a + "kv_a_layernorm.weight": val((L,), 3, np.float16)}
shard2 = {a + "q_b_proj.weight": val((H * (P + R), Rq), 4, np.float16), a + "kv_b_proj.weight": val((H * (P + V), L), 5, np.float32),
          a + "k_scale": np.array(0.375, dtype=np.float32)}
save_file(shard1, d + "/model-00001-of-00002.safetensors", metadata={"format": "pt"})
save_file(shard2, d + "/model-00002-of-00002.safetensors", metadata={"format": "pt"})
wm = {k: "model-00001-of-00002.safetensors" for k in shard1}
wm.update({k: "model-00002-of-00002.safetensors" for k in shard2})
json.dump({"metadata": {}, "weight_map": wm}, open(d + "/model.safetensors.index.json", "w"))
json.dump({"model_type": "deepseek_v3", "hidden_size": D, "num_attention_heads": H, "q_lora_rank": Rq, "kv_lora_rank": L,
           "qk_nope_head_dim": P, "qk_rope_head_dim": R, "v_head_dim": V, "num_hidden_layers": 2, "rope_scaling": None},
          open(d + "/config.json", "w"))
)";
  std::ofstream(dir + "/write.py") << script;
  ASSERT_EQ(std::system(("python3 '" + dir + "/write.py' '" + dir + "'").c_str()), 0);

  const CheckpointLayer got = load_layer(dir, 1, /*tp=*/2, /*rank=*/1);
  auto expect = [](const char* what, const std::vector<uint16_t>& v, int t, int64_t first, int64_t n) {
    ASSERT_EQ(int64_t(v.size()), n) << what;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = ((first + i) * 37 + t * 11) % 251 - 125;
      ASSERT_EQ(bf16_to_float(v[size_t(i)]), float(k) / 64.0f) << what << "[" << i << "]";
    }
  };
  const int64_t D = 96, Rq = 80, L = 512, R = 64, P = 32, V = 32;
  EXPECT_EQ(got.config.heads(), 1);
  EXPECT_EQ(got.config.yarn.factor, 1.0);
  expect("q_a", std::vector<uint16_t>(got.weights.qkv_a.begin(), got.weights.qkv_a.begin() + Rq * D), 0, 0, Rq * D);
  expect("kv_a", std::vector<uint16_t>(got.weights.qkv_a.begin() + Rq * D, got.weights.qkv_a.end()), 1, 0,
         (L + R) * D);
  expect("q_a_norm", got.weights.q_a_norm, 2, 0, Rq);
  expect("kv_a_norm", got.weights.kv_a_norm, 3, 0, L);
  expect("q_b (head 1)", got.weights.q_b, 4, (P + R) * Rq, (P + R) * Rq);
  expect("kv_b (head 1)", got.weights.kv_b, 5, (P + V) * L, (P + V) * L);
  EXPECT_EQ(got.weights.k_scale, 0.375f);
  EXPECT_EQ(got.weights.q_scale, 1.0f);
}

// A short libFuzzer run where the fuzz target has been built (clang; see fuzz/CMakeLists.txt).
TEST(SafetensorsFuzz, LibFuzzerShortRun) {
  const char* env = std::getenv("MLA_FUZZ_BIN");
  const std::string bin = env ? env : std::string(MLA_SOURCE_DIR) + "/build/fuzz/fuzz_safetensors_header";
  if (!std::filesystem::exists(bin))
    GTEST_SKIP() << "no libFuzzer build at " << bin
                 << " (CC=clang CXX=clang++ cmake -S fuzz -B build/fuzz && cmake --build build/fuzz, or set "
                    "MLA_FUZZ_BIN); the corpus replay and mutation tests still ran";
  const std::string work = testing::fresh_dir("fuzz_run");
  const std::string cmd = "'" + bin + "' -runs=10000 -seed=1 -max_len=4096 -artifact_prefix='" + work + "/' '" +
                          work + "' '" + corpus_dir() + "' > '" + work + "/log.txt' 2>&1";
  std::filesystem::create_directories(work);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "see " << work << "/log.txt";
}

}  // namespace
}  // namespace mla
