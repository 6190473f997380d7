// The `mla` command line (run --check, bad flags, --json, --dump) and the safetensors writer its
// --dump uses, read back with the Python safetensors package where it is installed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors_writer.hpp"
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

// Python that prints, for every tensor of a file, "name dtype shape v0 v1 ..." with up to 4 values
// decoded from the raw bytes (numpy has no bf16 / fp8 dtypes: both are decoded by hand here).
constexpr const char* kPyDump = R"PY(
import sys, numpy as np, safetensors
data = open(sys.argv[1], 'rb').read()
def f8(b):
    s = np.where(b & 0x80, -1.0, 1.0); e = (b >> 3) & 0xF; m = b & 7
    v = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0**(e.astype(np.float64) - 7))
    return np.where((b & 0x7F) == 0x7F, np.nan, s * v)
np_types = {'F64': np.float64, 'F32': np.float32, 'I64': np.int64, 'I32': np.int32, 'U8': np.uint8}
for name, t in safetensors.deserialize(data):
    raw = bytes(t['data'])
    if t['dtype'] == 'BF16':
        a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif t['dtype'] == 'F8_E4M3':
        a = f8(np.frombuffer(raw, np.uint8).astype(np.int64))
    else:
        a = np.frombuffer(raw, np_types[t['dtype']])
    assert a.size == int(np.prod(t['shape'])), name
    print(name, t['dtype'], 'x'.join(map(str, t['shape'])) or '-', *[repr(float(x)) for x in a[:4]])
)PY";

// name -> the line kPyDump printed for it.
std::map<std::string, std::vector<std::string>> python_read(const fs::path& file) {
  const fs::path script = fs::temp_directory_path() / ("mla_st_read_" + std::to_string(::getpid()) + ".py");
  std::ofstream(script) << kPyDump;
  const Proc p = run_shell("python3 " + script.string() + " " + file.string());
  fs::remove(script);
  EXPECT_EQ(p.code, 0) << p.err;
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream in(p.out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<std::string> words;
    for (std::string w; ls >> w;) words.push_back(w);
    if (!words.empty()) rows[words[0]] = words;
  }
  return rows;
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
  auto rows = python_read(file);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows["strided"], (std::vector<std::string>{"strided", "F32", "2x3", "0.0", "1.0", "2.0", "5.0"}));
  EXPECT_EQ(rows["bf"], (std::vector<std::string>{"bf", "BF16", "2", "1.5", "-3.0"}));
  EXPECT_EQ(rows["f8"], (std::vector<std::string>{"f8", "F8_E4M3", "2", "1.0", "-1.0"}));
  EXPECT_EQ(rows["scale"], (std::vector<std::string>{"scale", "F32", "-", "0.5"}));
}

}  // namespace
