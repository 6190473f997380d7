#include "bench.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "core/backend.hpp"
#include "report.hpp"

namespace mla::cli {
namespace {

double mxfp4_bytes(double elements) { return elements / 2 + elements / kMxBlock; }  // codes + E8M0 scales

struct Stats {
  double median = 0, min = 0, max = 0;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

}  // namespace

StepWork step_work(const Step& st) {
  const LayerConfig& c = st.cfg;
  const double S = st.tokens(), D = c.hidden, Rq = c.q_lora_rank, L = c.kv_lora_rank, P = c.qk_nope_dim;
  const double V = c.v_head_dim, N = c.heads(), E = c.qk_head_dim(), row = c.row_dim();
  const double G = st.layer->query_heads(), rows = c.qkv_a_rows(), gate = c.gate_dim();
  const double qsize = dtype_size(st.q.view().dtype), kvsize = dtype_size(st.host.cache.view().dtype);
  const double osize = dtype_size(st.o.view().dtype), splits = st.splits;
  const int Q = st.host.spec.qlen;

  int64_t written = 0, cached_rows = 0, visible_keys = 0;
  const auto* slots = st.host.slot_mapping.ptr<const int64_t>();
  for (int s = 0; s < st.tokens(); ++s) written += slots[s] >= 0;
  for (int32_t len : st.host.spec.seq_lens) {
    cached_rows += len;  // W = 1: every position is on this rank
    for (int i = 0; i < Q && len > 0; ++i) visible_keys += len - Q + i + 1;
  }

  StepWork w;
  // pre: the bf16 weights, W_UK in MXFP4, hidden in, query + gate + new cache rows out.
  w.pre.bytes = rows * D * 2 + N * E * Rq * 2 + (Rq + L) * 4 + mxfp4_bytes(N * P * L) + S * D * 2 +
                S * G * row * qsize + S * gate * 2 + double(written) * row * kvsize;
  w.pre.flops = 2 * S * (rows * D + N * E * Rq + N * P * L);
  // attend: every cached row read once (shared by the heads and the Q queries of a request),
  // the query in, o and lse out; per visible key and head a 576-long score and a 512-long update.
  w.attend.bytes = double(cached_rows) * row * kvsize + S * G * row * qsize + splits * S * G * (L * osize + 4);
  w.attend_qk_flops = double(visible_keys) * G * 2 * row;
  w.attend_pv_flops = double(visible_keys) * G * 2 * L;
  w.attend.flops = w.attend_qk_flops + w.attend_pv_flops;
  // post: W_UV in MXFP4, o and lse in (every split), gate in, out.
  w.post.bytes = mxfp4_bytes(N * V * L) + splits * S * G * (L * osize + 4) + S * gate * 2 + S * N * V * 2;
  w.post.flops = 2 * S * N * V * L;
  w.step = {w.pre.bytes + w.attend.bytes + w.post.bytes, w.pre.flops + w.attend.flops + w.post.flops};
  return w;
}

// The shortest time attend's arithmetic can take on this machine: the scores at the bf16 dot rate
// (the fp32 FMA rate where the CPU has none) plus P.V at the fp32 FMA rate, each at its measured
// peak on all threads. Dequantization, softmax and memory are not in it. 0: rates not measured.
double attend_roof_us(const StepWork& w, const detail::Ceilings& c) {
  if (c.fp32_fma_gflops <= 0) return 0;
  const double qk_rate = c.bf16_dot_gflops > 0 ? c.bf16_dot_gflops : c.fp32_fma_gflops;
  return (w.attend_qk_flops / qk_rate + w.attend_pv_flops / c.fp32_fma_gflops) * 1e-3;
}

void add_bench_command(CLI::App& app, BenchOptions& o) {
  CLI::App* b = app.add_subcommand("bench", "Time each stage and the whole step against this machine's ceilings");
  add_step_options(*b, o.step);
  b->add_option("--warmup", o.warmup, "Untimed runs first")->check(CLI::Range(0, 1000))->capture_default_str();
  b->add_option("--iters", o.iters, "Timed runs (median reported)")->check(CLI::Range(1, 100000))->capture_default_str();
  b->add_flag("--sweep", o.sweep, "Sweep --batches x --contexts x --qlens x --heads-list");
  b->add_option("--batches", o.batches, "Sweep: batch sizes")->delimiter(',')->capture_default_str();
  b->add_option("--contexts", o.contexts, "Sweep: context lengths")->delimiter(',')->capture_default_str();
  b->add_option("--qlens", o.qlens, "Sweep: query tokens per request")->delimiter(',')->capture_default_str();
  b->add_option("--heads-list", o.heads, "Sweep: this rank's heads (default: the preset's)")->delimiter(',');
  b->add_option("--json", o.json, "Write the results as JSON to FILE (\"-\": stdout), e.g. bench/results/x.json");
}

int bench_command(const BenchOptions& o) {
  std::vector<StepOptions> configs;
  if (o.sweep) {
    const std::vector<int> heads = o.heads.empty() ? std::vector<int>{o.step.heads} : o.heads;
    for (int n : heads)
      for (int b : o.batches)
        for (int ctx : o.contexts)
          for (int q : o.qlens) {
            StepOptions s = o.step;
            s.heads = n;
            s.batch = b;
            s.context = {ctx};
            s.qlen = q;
            configs.push_back(s);
          }
  } else {
    configs.push_back(o.step);
  }

  std::ostream& text = o.json == "-" ? std::cerr : std::cout;
  nlohmann::json results = nlohmann::json::array();
  detail::Ceilings ceil;
  bool cuda = false;
  for (size_t k = 0; k < configs.size(); ++k) {
    Step st = make_step(configs[k]);
    detail::BackendImpl& backend = detail::backend_of(*st.layer);
    if (k == 0) {  // the ceilings of the machine the first layer runs on, measured now
      cuda = st.layer->backend() == Backend::cuda;
      ceil = backend.measure_ceilings();
      char line[256];
      std::snprintf(line, sizeof line, "device: %s   copy %.1f GB/s   matmul %.2f TFLOP/s   fp8 matmul %.2f TFLOP/s\n",
                    ceil.device_name.c_str(), ceil.copy_gbps, ceil.matmul_tflops, ceil.fp8_matmul_tflops);
      text << line;
      if (ceil.read_rows_gbps > 0) {
        std::snprintf(line, sizeof line, "576-byte rows read: in order %.1f GB/s   at random rows %.1f GB/s\n",
                      ceil.read_rows_gbps, ceil.gather_rows_gbps);
        text << line;
      }
      if (ceil.fp32_fma_gflops > 0) {
        std::snprintf(line, sizeof line, "attend's instructions: fp32 FMA %.1f GFLOP/s   bf16 dot %.1f GFLOP/s\n",
                      ceil.fp32_fma_gflops, ceil.bf16_dot_gflops);
        text << line;
      }
      text << "caches before each timed run: " << ceil.cache_flush << "\n";
      text << "stage         us(med)     us(min)      GB/s   %copy    TFLOP/s  %matmul\n";
    }
    st.run_pre();  // the cache holds this step's rows before attend is timed alone
    const StepWork work = step_work(st);
    struct Stage {
      const char* name;
      std::function<void()> fn;
      Work work;
    };
    const Stage stages[] = {{"pre", [&] { st.run_pre(); }, work.pre},
                            {"attend", [&] { st.run_attend(); }, work.attend},
                            {"post", [&] { st.run_post(); }, work.post},
                            {"step", [&] { st.run_step(); }, work.step}};
    text << describe(st, configs[k]) << "\n";
    nlohmann::json stage_json;
    for (const Stage& s : stages) {
      const Stats t = stats(backend.time_us(s.fn, o.warmup, o.iters));
      const double gbps = s.work.bytes / (t.median * 1e3), tflops = s.work.flops / (t.median * 1e6);
      const double pct_bw = ceil.copy_gbps > 0 ? 100 * gbps / ceil.copy_gbps : 0;
      const double pct_mm = ceil.matmul_tflops > 0 ? 100 * tflops / ceil.matmul_tflops : 0;
      char line[256];
      std::snprintf(line, sizeof line, "  %-8s %11.1f %11.1f %9.1f %6.1f%% %10.3f %7.1f%%\n", s.name, t.median, t.min,
                    gbps, pct_bw, tflops, pct_mm);
      text << line;
      stage_json[s.name] = {{"us_median", t.median}, {"us_min", t.min},   {"us_max", t.max},
                            {"bytes", s.work.bytes}, {"flops", s.work.flops}, {"gbps", gbps},
                            {"tflops", tflops},      {"pct_copy_bw", pct_bw}, {"pct_matmul", pct_mm}};
      if (const std::string kernel = backend.last_attend_kernel(); std::string(s.name) == "attend" && !kernel.empty()) {
        stage_json[s.name]["kernel"] = kernel;  // (the one just timed)
        text << "  attend kernel: " << kernel << "\n";
      }
      const double roof_us = std::string(s.name) == "attend" ? attend_roof_us(work, ceil) : 0;
      if (roof_us > 0) {
        // The compute roof: how close attend is to it, and the cache bandwidth it allows.
        const double pct_roof = 100 * roof_us / t.median, roof_gbps = s.work.bytes / (roof_us * 1e3);
        const double roof_pct_copy = ceil.copy_gbps > 0 ? 100 * roof_gbps / ceil.copy_gbps : 0;
        std::snprintf(line, sizeof line,
                      "  attend compute roof %.1f us (QK %.2f GFLOP at %s, PV %.2f GFLOP at fp32 FMA): "
                      "%.1f%% of roof; the roof allows %.1f GB/s = %.1f%% of copy\n",
                      roof_us, work.attend_qk_flops * 1e-9, ceil.bf16_dot_gflops > 0 ? "bf16 dot" : "fp32 FMA",
                      work.attend_pv_flops * 1e-9, pct_roof, roof_gbps, roof_pct_copy);
        text << line;
        stage_json[s.name]["qk_flops"] = work.attend_qk_flops;
        stage_json[s.name]["pv_flops"] = work.attend_pv_flops;
        stage_json[s.name]["compute_roof_us"] = roof_us;
        stage_json[s.name]["pct_compute_roof"] = pct_roof;
        stage_json[s.name]["compute_roof_gbps"] = roof_gbps;
        stage_json[s.name]["compute_roof_pct_copy_bw"] = roof_pct_copy;
      }
    }
    text.flush();
    results.push_back({{"config", config_json(st.cfg)},
                       {"step",
                        {{"batch", st.host.spec.seq_lens.size()},
                         {"context", configs[k].context},
                         {"qlen", configs[k].qlen},
                         {"tokens", st.tokens()},
                         {"page_size", configs[k].page_size},
                         {"kv_dtype", configs[k].kv_dtype},
                         {"q_dtype", configs[k].q_dtype},
                         {"splits", st.splits},
                         {"backend", backend_name(st.layer->backend())}}},
                       {"stages", stage_json},
                       {"tokens_per_s", st.tokens() / (stage_json["step"]["us_median"].get<double>() * 1e-6)}});
  }
  if (!o.json.empty()) {
    nlohmann::json j = provenance(cuda);
    j["device"] = ceil.device_name;
    j["ceilings"] = {{"copy_gbps", ceil.copy_gbps},
                     {"matmul_tflops", ceil.matmul_tflops},
                     {"fp8_matmul_tflops", ceil.fp8_matmul_tflops},
                     {"read_rows_gbps", ceil.read_rows_gbps},
                     {"gather_rows_gbps", ceil.gather_rows_gbps},
                     {"fp32_fma_gflops", ceil.fp32_fma_gflops},
                     {"bf16_dot_gflops", ceil.bf16_dot_gflops}};
    j["cache_flush"] = ceil.cache_flush;
    j["warmup"] = o.warmup;
    j["iters"] = o.iters;
    j["formulas"] = {
        {"pre", "bytes: qkv_a + q_b (bf16) + norms + W_UK (MXFP4) + hidden + q + gate + written cache rows; "
                "flops: 2*S*(qkv_a_rows*D + N*(P+R)*Rq + N*P*L)"},
        {"attend", "bytes: every cached row once + q + o + lse (per split); flops: visible keys * G * 2*(576 + L)"},
        {"attend_compute_roof",
         "us: QK (visible keys * G * 2*576) / bf16 dot rate (fp32 FMA rate without bf16) + PV (visible keys * G * "
         "2*L) / fp32 FMA rate; rates from register-only loops on all threads; pct_compute_roof = roof / median"},
        {"post", "bytes: W_UV (MXFP4) + o + lse (per split) + gate + out; flops: 2*S*N*V*L"},
        {"step", "sum of the three"}};
    j["results"] = results;
    write_json(j, o.json);
  }
  return 0;
}

}  // namespace mla::cli
