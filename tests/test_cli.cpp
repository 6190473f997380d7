// The `mla` command line (run --check, bad flags, --json, --dump) and the safetensors writer its
// --dump uses, read back with the Python safetensors package where it is installed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/safetensors_writer.hpp"
#include "cpu/stages.hpp"
#include "mla/error.hpp"
#include "mla/layer.hpp"
#include "mla/tensor.hpp"

namespace {

namespace fs = std::filesystem;

struct Proc {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs a shell command, capturing stdout and stderr separately (stderr through a temp file).
Proc run_shell(const std::string& cmd) {
  const fs::path err_path = fs::temp_directory_path() / ("mla_cli_err_" + std::to_string(::getpid()));
  Proc p;
  FILE* f = ::popen((cmd + " 2>" + err_path.string()).c_str(), "r");
  if (!f) return p;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) p.out.append(buf.data(), n);
  const int status = ::pclose(f);
  p.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_path);
  p.err.assign(std::istreambuf_iterator<char>(e), {});
  fs::remove(err_path);
  return p;
}

bool have_python_safetensors() {
  static const bool ok = run_shell("python3 -c 'import safetensors, numpy'").code == 0;
  return ok;
}

// A fresh empty directory under the temp dir, removed by the destructor.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("mla_test_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Python that prints, for every tensor of each file, "file name dtype shape v0 v1 ..." with up to 4
// values decoded from the raw bytes (numpy has no bf16 / fp8 dtypes: both are decoded by hand).
constexpr const char* kPyDump = R"PY(
import os, sys, numpy as np, safetensors
def f8(b):
    s = np.where(b & 0x80, -1.0, 1.0); e = (b >> 3) & 0xF; m = b & 7
    v = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0**(e.astype(np.float64) - 7))
    return np.where((b & 0x7F) == 0x7F, np.nan, s * v)
np_types = {'F64': np.float64, 'F32': np.float32, 'I64': np.int64, 'I32': np.int32, 'U8': np.uint8}
for path in sys.argv[1:]:
    for name, t in safetensors.deserialize(open(path, 'rb').read()):
        raw = bytes(t['data'])
        if t['dtype'] == 'BF16':
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t['dtype'] == 'F8_E4M3':
            a = f8(np.frombuffer(raw, np.uint8).astype(np.int64))
        else:
            a = np.frombuffer(raw, np_types[t['dtype']])
        assert a.size == int(np.prod(t['shape'])), name
        print(os.path.basename(path), name, t['dtype'], 'x'.join(map(str, t['shape'])) or '-',
              *[repr(float(x)) for x in a[:4]])
)PY";

// file name -> tensor name -> the words kPyDump printed for it, from the tensor name on.
using PyTables = std::map<std::string, std::map<std::string, std::vector<std::string>>>;
PyTables python_read(const std::vector<fs::path>& files) {
  const fs::path script = fs::temp_directory_path() / ("mla_st_read_" + std::to_string(::getpid()) + ".py");
  std::ofstream(script) << kPyDump;
  std::string cmd = "python3 " + script.string();
  for (const fs::path& f : files) cmd += " " + f.string();
  const Proc p = run_shell(cmd);
  fs::remove(script);
  EXPECT_EQ(p.code, 0) << p.err;
  PyTables tables;
  std::istringstream in(p.out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<std::string> words;
    for (std::string w; ls >> w;) words.push_back(w);
    if (words.size() >= 2) tables[words[0]][words[1]] = std::vector<std::string>(words.begin() + 1, words.end());
  }
  return tables;
}

TEST(SafetensorsWriter, HeaderLayoutAndAlignment) {
  mla::safetensors::Writer w;
  const std::vector<uint8_t> u8{1, 2, 3};
  const std::vector<int64_t> i64{-1, 7};
  const std::vector<float> f32{1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f};
  w.add_bytes("a_u8", mla::DType::u8, {3}, u8.data());
  w.add("b_i64", mla::TensorView::contiguous(i64.data(), mla::DType::i64, {2}));
  w.add("c_f32", mla::TensorView::contiguous(f32.data(), mla::DType::f32, {2, 3}));
  w.add_scalar("d_scale", 0.75f);
  w.set_metadata("format", "pt");
  const std::vector<uint8_t> file = w.serialize();

  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(file[i]) << (8 * i);
  ASSERT_EQ(n % 8, 0u);
  ASSERT_LE(8 + n, file.size());
  const auto header = nlohmann::json::parse(std::string(file.begin() + 8, file.begin() + 8 + long(n)));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["c_f32"]["dtype"], "F32");
  EXPECT_EQ(header["c_f32"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["d_scale"]["shape"], nlohmann::json::array());
  // No holes, each tensor aligned to its element size, data ends at the file's end.
  std::vector<std::pair<size_t, size_t>> spans;
  for (auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    const size_t b = t["data_offsets"][0], e = t["data_offsets"][1];
    const size_t es = t["dtype"] == "I64" ? 8 : t["dtype"] == "F32" ? 4 : 1;
    EXPECT_EQ(b % es, 0u) << name;
    spans.emplace_back(b, e);
  }
  std::sort(spans.begin(), spans.end());
  size_t at = 0;
  for (auto [b, e] : spans) {
    EXPECT_EQ(b, at);
    at = e;
  }
  EXPECT_EQ(8 + n + at, file.size());
  const size_t c0 = header["c_f32"]["data_offsets"][0];
  float third;
  std::memcpy(&third, file.data() + 8 + n + c0 + 2 * sizeof(float), sizeof(float));
  EXPECT_EQ(third, 3.25f);
}

TEST(SafetensorsWriter, StridedViewIsGatheredAndPythonReadsIt) {
  // A [2, 3] view with row stride 5 over a padded buffer: the file must hold the 6 logical values.
  std::vector<float> buf(10);
  for (int i = 0; i < 10; ++i) buf[i] = float(i);
  std::vector<uint16_t> bf{0x3FC0, 0xC040};  // 1.5, -3.0 in bf16
  std::vector<uint8_t> f8{0x38, 0xB8};  // +1.0, -1.0 in e4m3
  mla::safetensors::Writer w;
  w.add("strided", mla::TensorView::strided(buf.data(), mla::DType::f32, {2, 3}, {5, 1}));
  w.add("bf", mla::TensorView::contiguous(bf.data(), mla::DType::bf16, {2}));
  w.add("f8", mla::TensorView::contiguous(f8.data(), mla::DType::fp8_e4m3, {2}));
  w.add_scalar("scale", 0.5f);
  TempDir dir("st");
  const fs::path file = dir.path / "t.safetensors";
  w.write(file.string());
  if (!have_python_safetensors()) GTEST_SKIP() << "python3 with safetensors and numpy not installed";
  auto rows = python_read({file})["t.safetensors"];
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows["strided"], (std::vector<std::string>{"strided", "F32", "2x3", "0.0", "1.0", "2.0", "5.0"}));
  EXPECT_EQ(rows["bf"], (std::vector<std::string>{"bf", "BF16", "2", "1.5", "-3.0"}));
  EXPECT_EQ(rows["f8"], (std::vector<std::string>{"f8", "F8_E4M3", "2", "1.0", "-1.0"}));
  EXPECT_EQ(rows["scale"], (std::vector<std::string>{"scale", "F32", "-", "0.5"}));
}

// --- cpu::time_us -----------------------------------------------------------------------------

TEST(CpuBench, TimeUsRunsWarmupThenTimedRunsInMicroseconds) {
  int calls = 0;
  const std::vector<double> us = mla::cpu::time_us([&] { ++calls; }, 2, 5, 1);
  EXPECT_EQ(calls, 7);
  ASSERT_EQ(us.size(), 5u);
  for (double t : us) EXPECT_GE(t, 0.0);
  // A 2 ms sleep reads as at least 2000 (µs, not ms or ns).
  const std::vector<double> slept =
      mla::cpu::time_us([] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }, 0, 1, 1);
  EXPECT_GE(slept.at(0), 2000.0);
  EXPECT_LT(slept.at(0), 2e6);
  EXPECT_THROW(mla::cpu::time_us([] {}, 0, 0, 1), mla::Error);
}

// --- the mla binary ---------------------------------------------------------------------------

const std::string kMla = std::string(MLA_BINARY_DIR) + "/mla";

// A small model (the preset's structure with small D, Rq and heads) so that a checked run of the
// float64 reference takes well under a second.
std::string small_run(const std::string& preset, const std::string& extra) {
  return kMla + " run --preset " + preset +
         " --heads 2 --hidden 256 --q-lora-rank 128 --backend cpu --threads 1 --repeat 1 " + extra;
}

int count_lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

TEST(Cli, RunCheckPassesFp8AndBf16) {
  const Proc fp8 = run_shell(small_run("deepseek-v3", "--batch 3 --context 50,0,130 --qlen 2 --page-size 16 --check"));
  EXPECT_EQ(fp8.code, 0) << fp8.out << fp8.err;
  EXPECT_NE(fp8.out.find("check: ok"), std::string::npos) << fp8.out;
  EXPECT_NE(fp8.out.find("end_to_end"), std::string::npos) << fp8.out;
  const Proc bf16 = run_shell(small_run(
      "kimi-k3", "--batch 2 --context 70 --qlen 3 --page-size 1 --kv-dtype bf16 --q-dtype bf16 "
                 "--gate-layout separate --splits 3 --seed 5 --check"));
  EXPECT_EQ(bf16.code, 0) << bf16.out << bf16.err;
  EXPECT_NE(bf16.out.find("check: ok"), std::string::npos) << bf16.out;
}

TEST(Cli, BadInputIsOneLineAndExitCode2) {
  std::vector<std::string> bad = {
      kMla + " run --no-such-flag",                     // unknown flag
      kMla + " run --kv-dtype fp16",                    // value outside the set
      kMla + " run --qlen 9",                           // out of range
      kMla,                                             // no subcommand
      small_run("kimi-k3", "--batch 3 --context 1,2"),  // mla::Error: one length per request
  };
  // mla::Error from the layer's construction: a CUDA backend where none is present.
  if (!mla::cuda_available()) bad.push_back(small_run("kimi-k3", "--context 10").replace(
      small_run("kimi-k3", "").find("--backend cpu"), 13, "--backend cuda"));
  for (const std::string& cmd : bad) {
    const Proc p = run_shell(cmd);
    EXPECT_EQ(p.code, 2) << cmd << "\n" << p.err;
    EXPECT_EQ(count_lines(p.err), 1) << cmd << "\n" << p.err;
    EXPECT_EQ(p.err.rfind("mla: error: ", 0), 0u) << cmd << "\n" << p.err;
  }
  const Proc ctx = run_shell(small_run("kimi-k3", "--batch 3 --context 1,2"));
  EXPECT_NE(ctx.err.find("--context"), std::string::npos) << ctx.err;
}

TEST(Cli, JsonIsParseableOnStdoutAndInAFile) {
  const Proc p = run_shell(small_run("kimi-k2", "--batch 2 --context 20,33 --qlen 1 --check --json"));
  ASSERT_EQ(p.code, 0) << p.err;
  const nlohmann::json j = nlohmann::json::parse(p.out);  // stdout holds only the JSON
  EXPECT_EQ(j["config"]["name"], "kimi-k2");
  EXPECT_EQ(j["step"]["seq_lens"], nlohmann::json({21, 34}));
  EXPECT_EQ(j["step"]["tokens"], 2);
  EXPECT_GT(j["time_us"]["attend"].get<double>(), 0.0);
  // the attend kernel that ran: on the CPU its instruction set's (the widest this machine has)
  const std::string kernel = j["attend_kernel"].get<std::string>();
  EXPECT_TRUE(kernel == "cpu avx512-bf16" || kernel == "cpu avx512" || kernel == "cpu avx2") << kernel;
  EXPECT_NE(p.err.find("attend kernel: " + kernel), std::string::npos) << p.err;
  EXPECT_TRUE(j["check"]["ok"].get<bool>());
  EXPECT_GE(j["check"]["rows"].size(), 6u);
  EXPECT_FALSE(j["git_revision"].get<std::string>().empty());

  TempDir dir("json");
  const fs::path file = dir.path / "r.json";
  const Proc f = run_shell(small_run("kimi-k3", "--batch 1 --context 10 --json " + file.string()));
  ASSERT_EQ(f.code, 0) << f.err;
  std::ifstream in(file);
  const nlohmann::json jf = nlohmann::json::parse(in);
  EXPECT_EQ(jf["step"]["backend"], "cpu");
  EXPECT_FALSE(jf.contains("check"));
}

TEST(Cli, DumpWritesLoadableSafetensors) {
  TempDir dir("dump");
  const Proc p = run_shell(small_run("kimi-k3", "--batch 2 --context 30,5 --qlen 2 --page-size 16 --dump " +
                                                    dir.path.string()));
  ASSERT_EQ(p.code, 0) << p.err;
  for (const char* f : {"inputs", "weights", "pre", "attend", "post"})
    ASSERT_TRUE(fs::exists(dir.path / (std::string(f) + ".safetensors"))) << f;
  if (!have_python_safetensors()) GTEST_SKIP() << "python3 with safetensors and numpy not installed";

  // kimi-k3 shrunk: D 256, Rq 128, N 2, merged gate, L 512, R 64, P 128, V 128; S = 2 * 2.
  std::vector<fs::path> files;
  for (const char* f : {"inputs", "weights", "pre", "attend", "post"})
    files.push_back(dir.path / (std::string(f) + ".safetensors"));
  PyTables t = python_read(files);
  auto& in = t["inputs.safetensors"];
  EXPECT_EQ(in["hidden"].at(1), "BF16");
  EXPECT_EQ(in["hidden"].at(2), "4x256");
  EXPECT_EQ(in["seq_lens"], (std::vector<std::string>{"seq_lens", "I32", "2", "32.0", "7.0"}));
  EXPECT_EQ(in["kv_indptr"].at(2), "3");
  EXPECT_EQ(in["slot_mapping"].at(1), "I64");
  EXPECT_EQ(in["cache_before"].at(1), "F8_E4M3");
  auto& w = t["weights.safetensors"];
  EXPECT_EQ(w["qkv_a"].at(2), "960x256");  // 128 + 512 + 64 + 2*128 rows
  EXPECT_EQ(w["q_b"].at(2), "384x128");
  EXPECT_EQ(w["w_uk_codes"].at(1), "U8");
  EXPECT_EQ(w["w_uk_codes"].at(2), "2x512x64");
  EXPECT_EQ(w["w_uk_scales"].at(2), "2x512x4");
  EXPECT_EQ(w["w_uv_codes"].at(2), "2x128x256");
  EXPECT_EQ(w["w_uv_scales"].at(2), "2x128x16");
  EXPECT_EQ(w["k_scale"].at(2), "-");
  EXPECT_GT(std::stod(w["k_scale"].at(3)), 0.0);
  auto& pre = t["pre.safetensors"];
  EXPECT_EQ(pre["q"].at(2), "4x2x576");
  EXPECT_EQ(pre["gate"].at(2), "4x256");
  const double g0 = std::stod(pre["gate"].at(3));
  EXPECT_TRUE(g0 > 0.0 && g0 < 1.0) << g0;  // a sigmoid
  auto& att = t["attend.safetensors"];
  EXPECT_EQ(att["o"].at(2), "4x2x512");
  EXPECT_EQ(att["lse"].at(1), "F32");
  auto& post = t["post.safetensors"];
  EXPECT_EQ(post["out"].at(1), "BF16");
  EXPECT_EQ(post["out"].at(2), "4x256");
}

TEST(Cli, BenchSweepRecordsCeilingsFormulasAndProvenance) {
  TempDir dir("bench");
  const fs::path file = dir.path / "bench.json";
  const Proc p = run_shell(kMla + " bench --backend cpu --threads 1 --preset kimi-k3 --heads 2 --hidden 256 "
                                  "--q-lora-rank 128 --sweep --batches 1,2 --contexts 100 --qlens 2 "
                                  "--warmup 1 --iters 3 --json " + file.string());
  ASSERT_EQ(p.code, 0) << p.err;
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_FALSE(j["device"].get<std::string>().empty());
  EXPECT_GT(j["ceilings"]["copy_gbps"].get<double>(), 0.0);
  EXPECT_GT(j["ceilings"]["matmul_tflops"].get<double>(), 0.0);
  EXPECT_GT(j["ceilings"]["fp32_fma_gflops"].get<double>(), 0.0);
  EXPECT_GE(j["ceilings"]["bf16_dot_gflops"].get<double>(), 0.0);  // 0 without AVX512-BF16
  EXPECT_EQ(j["ceilings"]["gather_rows_gbps"].get<double>(), 0.0);   // GPU only
  EXPECT_EQ(j["cache_flush"].get<std::string>().rfind("write", 0), 0u);  // how the timer left the caches
  EXPECT_NE(j["command"].get<std::string>().find("--sweep"), std::string::npos);
  EXPECT_FALSE(j["git_revision"].get<std::string>().empty());
  EXPECT_FALSE(j["timestamp"].get<std::string>().empty());
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& r : j["results"])
    for (const char* stage : {"pre", "attend", "post", "step"}) {
      EXPECT_GT(r["stages"][stage]["us_median"].get<double>(), 0.0) << stage;
      EXPECT_GT(r["stages"][stage]["bytes"].get<double>(), 0.0) << stage;
      EXPECT_GT(r["stages"][stage]["flops"].get<double>(), 0.0) << stage;
    }
  // attend's formula for B = 2 requests of 100 + 2 tokens, Q = 2, G = 2 heads, fp8 cache and
  // query, f32 o: every cached row once + the query + o and lse; 2*(576 + 512) FLOPs per visible
  // key and head, query i seeing 101 + i keys.
  const auto& attend = j["results"][1]["stages"]["attend"];
  const double B = 2, len = 102, S = 4, G = 2, row = 576, L = 512;
  EXPECT_EQ(attend["bytes"].get<double>(), B * len * row + S * G * row + S * G * (L * 4 + 4));
  EXPECT_EQ(attend["flops"].get<double>(), B * (101 + 102) * G * 2 * (row + L));
  // The compute roof: the scores at the bf16 dot rate (fp32 FMA without it), P.V at the FMA rate.
  const double fma = j["ceilings"]["fp32_fma_gflops"], dot = j["ceilings"]["bf16_dot_gflops"];
  const double qk = B * (101 + 102) * G * 2 * row, pv = B * (101 + 102) * G * 2 * L;
  EXPECT_EQ(attend["qk_flops"].get<double>(), qk);
  EXPECT_EQ(attend["pv_flops"].get<double>(), pv);
  const double roof_us = (qk / (dot > 0 ? dot : fma) + pv / fma) * 1e-3;
  EXPECT_NEAR(attend["compute_roof_us"].get<double>(), roof_us, 1e-9 * roof_us);
  EXPECT_NEAR(attend["pct_compute_roof"].get<double>(), 100 * roof_us / attend["us_median"].get<double>(), 1e-9);
  const auto& st = j["results"][1]["stages"];
  EXPECT_EQ(st["step"]["bytes"].get<double>(),
            st["pre"]["bytes"].get<double>() + st["attend"]["bytes"].get<double>() + st["post"]["bytes"].get<double>());
}

}  // namespace
