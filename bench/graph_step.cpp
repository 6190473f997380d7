// mla_graph_bench: the CUDA backend's step and attend captured in CUDA graphs and timed by graph
// replay (CUDA events, L2 flushed before each replay, median), next to the eager step, against
// the copy bandwidth measured in the same run. Complements `mla bench` (eager launches) for the
// issue-4 targets: the whole kimi-k3 step at batch 1 in a graph, and attend at batch 64.
//
//   mla_graph_bench [--preset kimi-k3] [--iters 100] [--json FILE] B:CONTEXT:QLEN:PAGE:KV[:HEADS[:SPLITS]] ...
//   e.g. mla_graph_bench 1:8192:1:64:fp8 64:8192:1:64:fp8 64:8192:1:1:fp8 64:u32768:1:64:fp8
// KV: fp8 (fp8 query and cache), bf16 (bf16 query and cache) or bf16q (a bf16 query over an fp8 cache). CONTEXT uN: an uneven batch, each request's length drawn uniformly from [QLEN, N] (seeded by B, N and QLEN);
// bytes and FLOPs count the keys actually there (issue 5: within 10% of the even batch of the same
// total, e.g. 64:16384 next to 64:u32768).
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/synthetic.hpp"
#include "mla/mla.hpp"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Config {
  int batch = 1, context = 8192, qlen = 1, page = 64;
  bool uneven = false;  // CONTEXT "uN": lengths drawn from [qlen, context]
  std::string kv = "fp8";
  int heads = 0;   // 0: the preset's
  int splits = 0;  // 0: the backend's plan
};

Config parse(const std::string& s) {
  Config c;
  std::vector<std::string> parts;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  if (parts.size() < 5 || parts.size() > 7) {
    std::fprintf(stderr, "config '%s': expected B:CONTEXT:QLEN:PAGE:KV[:HEADS[:SPLITS]]\n", s.c_str());
    std::exit(2);
  }
  c.batch = std::stoi(parts[0]);
  c.uneven = !parts[1].empty() && parts[1][0] == 'u';
  c.context = std::stoi(c.uneven ? parts[1].substr(1) : parts[1]);
  c.qlen = std::stoi(parts[2]);
  c.page = std::stoi(parts[3]);
  c.kv = parts[4];
  if (c.kv != "fp8" && c.kv != "bf16" && c.kv != "bf16q") {
    std::fprintf(stderr, "config '%s': KV must be fp8, bf16 or bf16q, got '%s'\n", s.c_str(), c.kv.c_str());
    std::exit(2);
  }
  if (parts.size() >= 6) c.heads = std::stoi(parts[5]);
  if (parts.size() == 7) c.splits = std::stoi(parts[6]);
  return c;
}

// MLA_BENCH_WARMUP_MS (default 0): before each timed set of replays, replay the graph for at least this
// many ms besides time_us's 10 warm-up runs. Session 43's question: when heavy work begins the H200's SM
// clock drops from 1980 MHz to 1755-1860 under the SW power cap for ~0.1-0.2 s and runs at ~1965 for ~0.3 s
// more (nvidia-smi, 50 ms apart), and E's configs are timed within ~0.5 s of that onset; whether E's
// window sat in it is what the clock probes beside each timing tell (docs/attention-log.md's earlier queue, item 1).
double warmup_ms() {
  static const double ms = [] {
    const char* env = std::getenv("MLA_BENCH_WARMUP_MS");
    if (!env) return 0.0;
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    MLA_REQUIRE(end != env && *end == '\0' && v >= 0 && v <= 60000, "MLA_BENCH_WARMUP_MS: expected 0 to 60000 ms, got ",
                env);
    return v;
  }();
  return ms;
}

// A timed set of replays: the median µs and the SM clock just before and just after (sm_clock_mhz).
struct Timed {
  double us = 0, mhz_before = 0, mhz_after = 0;
};

// Median µs of `iters` replays of fn captured in a graph on `stream`.
template <class Fn>
Timed graph_us(mla::detail::BackendImpl& backend, cudaStream_t stream, int iters, Fn fn) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  fn();
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const auto replay = [&] { check(cudaGraphLaunch(exec, stream), "launch"); };
  if (warmup_ms() > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() < warmup_ms()) {
      for (int i = 0; i < 10; ++i) replay();
      check(cudaStreamSynchronize(stream), "warm-up replays");
    }
  }
  Timed t;
  t.mhz_before = backend.sm_clock_mhz();
  t.us = median(backend.time_us(replay, 10, iters));
  t.mhz_after = backend.sm_clock_mhz();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return t;
}

// The page table's order (MLA_BENCH_PAGES): shuffled (the default: each request's pages drawn at
// random from the whole cache, as a serving engine's allocator leaves them after a while) or ordered
// (each request's pages consecutive). Session 42's question: whether E's fast mode (one build's E
// 1659-1675 us in one call, 1840-1869 in the next) depends on where the pages lie (the TLB's reach
// over E's 2.4 GB of cache, docs/attention-log.md's earlier queue, item 0).
bool pages_shuffled() {
  static const bool shuffled = [] {
    const char* env = std::getenv("MLA_BENCH_PAGES");
    const std::string v = env ? env : "shuffled";
    MLA_REQUIRE(v == "shuffled" || v == "ordered", "MLA_BENCH_PAGES: expected shuffled or ordered, got ", v);
    return v == "shuffled";
  }();
  return shuffled;
}

}  // namespace

// The MLA_* switches this run was under (but MLA_GIT_REV), sorted, as "A=1 B=2": an A/B record's
// variants differ only there (scripts/device-check's ab modes), and the command line does not show it.
static std::string mla_environment() {
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) {
    const std::string v = *e;
    if (v.rfind("MLA_", 0) == 0 && v.rfind("MLA_GIT_REV=", 0) != 0) vars.push_back(v);
  }
  std::sort(vars.begin(), vars.end());
  std::string out;
  for (const std::string& v : vars) {
    if (!out.empty()) out += ' ';
    for (const char c : v)
      if (c != '"' && c != '\\' && static_cast<unsigned char>(c) >= 0x20) out += c;  // (a JSON string as is)
  }
  return out;
}

int main(int argc, char** argv) {
  std::string preset = "kimi-k3", json, command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  const char* rev = std::getenv("MLA_GIT_REV");
  int iters = 100;
  std::vector<Config> configs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--preset" && i + 1 < argc) preset = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::stoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else configs.push_back(parse(a));
  }
  if (configs.empty()) configs.push_back(Config{});
  try {
    const mla::LayerConfig base = mla::LayerConfig::preset(preset);
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    mla::detail::Ceilings ceil;
    std::ostringstream rows;
    std::string json_rows;
    for (size_t k = 0; k < configs.size(); ++k) {
      const Config& c = configs[k];
      mla::LayerConfig cfg = base;
      if (c.heads > 0) cfg.total_heads = c.heads * cfg.tp_size;
      const mla::PreparedWeights w = mla::prepare_weights(cfg, mla::random_checkpoint_weights(cfg, 1));
      std::vector<int32_t> seq_lens(size_t(c.batch), c.context);
      if (c.uneven) {
        // Seeded by the batch shape alone, so one "B:uN:Q" draws the same lengths at any page size,
        // cache type or head count and at any place in the list (until session 9 the seed was the
        // config's index: the same config in another place or run drew other lengths).
        std::mt19937 rng(1234u + unsigned(c.batch) * 131u + unsigned(c.context) * 7u + unsigned(c.qlen));
        std::uniform_int_distribution<int32_t> len(c.qlen, c.context);
        for (int32_t& l : seq_lens) l = len(rng);
      }
      const double keys = std::accumulate(seq_lens.begin(), seq_lens.end(), 0.0);
      mla::synth::ScenarioSpec spec{.cfg = cfg,
                                    .seq_lens = seq_lens,
                                    .qlen = c.qlen,
                                    .page_size = c.page,
                                    .kv_dtype = c.kv == "bf16" ? mla::DType::bf16 : mla::DType::fp8_e4m3,
                                    .shuffle_pages = pages_shuffled(),
                                    .seed = 7 + k};
      const mla::synth::Scenario host = mla::synth::make_scenario(spec, w.k_scale);
      const mla::synth::Scenario dev = mla::synth::to_device(host);
      const int64_t s = host.tokens(), nv = int64_t(cfg.heads()) * cfg.v_head_dim;
      // KV bf16: a bf16 query too (issue 5's bf16 rate is for a bf16 query and cache); bf16q: a bf16
      // query over the fp8 cache.
      mla::Layer layer(cfg, w, {.backend = mla::Backend::cuda,
                                .q_dtype = c.kv == "fp8" ? mla::DType::fp8_e4m3 : mla::DType::bf16,
                                .max_tokens = int(s),
                                .num_splits = c.splits,
                                .cuda_stream = stream});
      mla::detail::BackendImpl& backend = mla::detail::backend_of(layer);
      if (k == 0) ceil = backend.measure_ceilings();
      mla::Tensor out = mla::Tensor::empty(mla::DType::bf16, {s, nv}, mla::Device::cuda);
      const mla::StepMeta meta = dev.meta();
      layer.step(dev.hidden, meta, dev.kv(), out);  // chooses the cuBLASLt algorithms outside the capture
      check(cudaStreamSynchronize(stream), "warm-up step");
      const mla::detail::StepWorkspace ws = backend.workspace(meta, dev.kv());
      const int splits = ws.attend.o.rank == 4 ? int(ws.attend.o.shape[0]) : 1;

      const double step_graph =
          graph_us(backend, stream, iters, [&] { layer.step(dev.hidden, meta, dev.kv(), out); }).us;
      const double step_eager = median(backend.time_us([&] { layer.step(dev.hidden, meta, dev.kv(), out); }, 5, iters));
      const Timed attend_t = graph_us(backend, stream, iters, [&] { layer.attend(ws.pre.q, dev.kv(), meta, ws.attend); });
      const double attend = attend_t.us;
      const std::string kernel = backend.last_attend_kernel();  // (the family and plan just timed)
      const double kv_bytes = keys * 576 * (c.kv == "bf16" ? 2 : 1);
      const double gbps = kv_bytes / (attend * 1e3);
      char line[320];
      // Useful tensor work: q.k over 576 dims and p.v over 512, per visible (row, key).
      const double flops = 2.0 * (576 + 512) * keys * cfg.heads() * c.qlen;
      const std::string ctx = (c.uneven ? "u" : "") + std::to_string(c.context);
      const double tflops = flops / (attend * 1e6);
      std::snprintf(line, sizeof line, "%5d %7s %4d %5d %5s %5d %6d | %10.1f %10.1f | %10.1f %9.1f %6.1f%% %8.1f  %s\n",
                    c.batch, ctx.c_str(), c.qlen, c.page, c.kv.c_str(), cfg.heads(), splits, step_graph, step_eager,
                    attend, gbps, 100 * gbps / ceil.copy_gbps, tflops, kernel.c_str());
      rows << line;
      std::fputs(line, stderr);
      std::ostringstream j;
      j << (json_rows.empty() ? "" : ",\n") << "    {\"batch\": " << c.batch << ", \"context\": " << c.context
        << ", \"uneven\": " << (c.uneven ? "true" : "false") << ", \"total_keys\": " << keys << ", \"qlen\": " << c.qlen << ", \"heads\": " << cfg.heads() << ", \"page_size\": " << c.page << ", \"kv_dtype\": \"" << c.kv
        << "\", \"splits\": " << splits << ", \"step_graph_us\": " << step_graph << ", \"step_eager_us\": " << step_eager
        << ", \"attend_graph_us\": " << attend << ", \"attend_kv_gbps\": " << gbps
        << ", \"attend_pct_copy\": " << 100 * gbps / ceil.copy_gbps << ", \"attend_tflops\": " << tflops
        << ", \"attend_kernel\": \"" << kernel << "\", \"attend_sm_mhz_before\": " << attend_t.mhz_before
        << ", \"attend_sm_mhz_after\": " << attend_t.mhz_after << "}";
      json_rows += j.str();
    }
    std::printf("device: %s  copy %.0f GB/s  bf16 matmul %.0f TFLOP/s  fp8 matmul %.0f TFLOP/s  (%s, median of %d)\n",
                ceil.device_name.c_str(), ceil.copy_gbps, ceil.matmul_tflops, ceil.fp8_matmul_tflops, preset.c_str(),
                iters);
    std::printf("576-byte rows read: in order %.0f GB/s, at random rows %.0f GB/s (bytes read)\n", ceil.read_rows_gbps,
                ceil.gather_rows_gbps);
    std::printf("L2 before each timed run: %s\n", ceil.cache_flush.c_str());
    std::printf("%5s %7s %4s %5s %5s %5s %6s | %10s %10s | %10s %9s %7s %8s  %s\n", "B", "ctx", "Q", "page", "kv", "heads",
                "splits", "step(graph)", "step(eager)", "attend us", "KV GB/s", "%copy", "TFLOP/s", "attend kernel");
    std::fputs(rows.str().c_str(), stdout);
    if (!json.empty()) {
      std::ofstream f(json);
      f << "{\n  \"tool\": \"mla_graph_bench\",\n  \"command\": \"" << command << "\",\n  \"git_revision\": \""
        << (rev ? rev : "unknown") << "\",\n  \"environment\": \"" << mla_environment() << "\",\n  \"preset\": \"" << preset << "\",\n  \"device\": \"" << ceil.device_name
        << "\",\n  \"copy_gbps\": " << ceil.copy_gbps << ",\n  \"matmul_tflops\": " << ceil.matmul_tflops
        << ",\n  \"fp8_matmul_tflops\": " << ceil.fp8_matmul_tflops << ",\n  \"read_rows_gbps\": " << ceil.read_rows_gbps
        << ",\n  \"gather_rows_gbps\": " << ceil.gather_rows_gbps << ",\n  \"cache_flush\": \"" << ceil.cache_flush
        << "\",\n  \"iters\": " << iters << ",\n  \"warmup_ms\": " << warmup_ms()
        << ",\n  \"results\": [\n" << json_rows << "\n  ]\n}\n";
    }
    cudaStreamDestroy(stream);
  } catch (const mla::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
