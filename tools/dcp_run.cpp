#include "dcp_run.hpp"

#include <chrono>
#include <cstdio>
#include <iostream>

#include "core/dcp_runner.hpp"
#include "mla/dcp.hpp"
#include "reference/reference.hpp"
#include "reference/tolerances.hpp"
#include "report.hpp"
#include "support/testing.hpp"

namespace mla::cli {

void add_dcp_options(CLI::App& run, DcpRunOptions& o) {
  run.add_option("--dcp", o.size, "Decode context parallelism: W ranks as threads (CPU, or one GPU with --backend cuda)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  run.add_option("--interleave", o.interleave, "DCP interleave I: positions p with (p / I) % W == r live on rank r")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

namespace {

struct RankCheck {
  double vs_dcp1 = 0, vs_ref = 0;
  std::string why;
  // vs DCP-1: SPEC.md's bf16 tolerance. vs float64: the fp8 query's end-to-end tolerance that
  // `mla run` uses at W = 1 (tools/check.cpp), since the query is always fp8 at W > 1.
  bool ok() const {
    return why.empty() && vs_dcp1 <= ref::kTolDcpVsDcp1 && vs_ref <= ref::kTolEndToEndFp8Query;
  }
};

// The DCP-1 result of one rank's weights on the same step, on the same backend.
Tensor dcp1_out(const LayerConfig& cfg, const PreparedWeights& w, const synth::Scenario& host, Backend backend,
                int splits, int threads) {
  Layer layer(cfg, w, {.backend = backend, .max_tokens = std::max(1, host.tokens()), .num_splits = splits,
                       .num_threads = threads});
  const int64_t nv = int64_t(cfg.heads()) * cfg.v_head_dim;
  if (layer.device() == Device::cpu) {
    synth::Scenario sc = host;  // pre writes the cache: keep the caller's intact
    sc.cache = Tensor::empty(host.cache.view().dtype, std::vector<int64_t>(host.cache.view().shape.begin(),
                                                                           host.cache.view().shape.begin() + 3));
    sc.cache.copy_from(host.cache.view());
    Tensor out = Tensor::empty(DType::bf16, {sc.tokens(), nv});
    layer.step(sc.hidden, sc.meta(), sc.kv(), out);
    return out;
  }
  const synth::Scenario dev = synth::to_device(host, 0);
  Tensor out = Tensor::empty(DType::bf16, {dev.tokens(), nv}, Device::cuda, 0);
  layer.step(dev.hidden, dev.meta(), dev.kv(), out);
  return out.to_host();
}

}  // namespace

int dcp_run_command(const StepOptions& o, const DcpRunOptions& d, bool check, const std::string& json) {
  const LayerConfig cfg = make_config(o);
  const int w = d.size;
  dcp::validate(cfg, {.size = w, .rank = 0, .interleave = d.interleave});
  MLA_REQUIRE(o.q_dtype == "fp8", "--q-dtype: a bf16 query needs --dcp 1, got --dcp ", w);
  std::vector<PreparedWeights> weights;
  for (const CheckpointWeights& ck : dcp::rank_checkpoints(cfg, o.seed, w)) weights.push_back(prepare_weights(cfg, ck));
  const synth::ScenarioSpec spec{.cfg = cfg,
                                 .seq_lens = make_seq_lens(o),
                                 .qlen = o.qlen,
                                 .page_size = o.page_size,
                                 .kv_dtype = parse_dtype("--kv-dtype", o.kv_dtype),
                                 .dcp = {.size = w, .rank = 0, .interleave = d.interleave},
                                 .seed = o.seed + 1};  // as `mla run` at W = 1: the same step
  const LayerOptions opts{.backend = parse_backend(o.backend), .num_splits = o.splits, .num_threads = o.threads};

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<dcp::RankResult> ranks = dcp::run_ranks(weights, spec, opts);
  const double wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  std::vector<RankCheck> checks;
  if (check) {
    synth::ScenarioSpec one = spec;
    one.dcp = {};
    const synth::Scenario host = synth::make_scenario(one, weights[0].k_scale);
    const Backend backend = opts.backend == Backend::automatic ? (cuda_available() ? Backend::cuda : Backend::cpu)
                                                               : opts.backend;
    for (int r = 0; r < w; ++r) {
      RankCheck c;
      const Tensor want = dcp1_out(cfg, weights[r], host, backend, o.splits, o.threads);
      const std::vector<double> want_d = testing::to_doubles(want);
      const testing::Compare a = testing::compare(ranks[r].out, want_d.data());
      const std::vector<double> ref =
          ref::end_to_end(cfg, ref::dequantize(cfg, weights[r]), host.hidden, host.kv(), host.meta());
      const testing::Compare b = testing::compare(ranks[r].out, ref.data());
      c.vs_dcp1 = a.rel_l2;
      c.vs_ref = b.rel_l2;
      c.why = a.why.empty() ? b.why : a.why;
      checks.push_back(c);
    }
  }
  bool ok = true;
  for (const RankCheck& c : checks) ok = ok && c.ok();

  std::ostream& text = json == "-" ? std::cerr : std::cout;
  text << "dcp W=" << w << " I=" << d.interleave << " " << cfg.name << " N=" << cfg.heads() << " G=" << cfg.heads() * w
       << " B=" << spec.seq_lens.size() << " Q=" << o.qlen << " page=" << o.page_size << " kv=" << o.kv_dtype
       << " S=" << spec.seq_lens.size() * o.qlen << "\n";
  char line[200];
  std::snprintf(line, sizeof line, "W-rank step (threads, incl. scenario upload): %.1f us wall\n", wall_us);
  text << line;
  if (check) {
    text << "rank   rel L2 vs DCP-1 (tol 1e-2)   rel L2 vs float64 (tol 1e-1)\n";
    for (int r = 0; r < w; ++r) {
      std::snprintf(line, sizeof line, "%4d   %24.3e   %28.3e   %s %s\n", r, checks[r].vs_dcp1, checks[r].vs_ref,
                    checks[r].ok() ? "ok" : "FAILED", checks[r].why.c_str());
      text << line;
    }
    text << (ok ? "check: ok\n" : "check: FAILED\n");
  }
  text.flush();
  if (!json.empty()) {
    nlohmann::json j = provenance(opts.backend == Backend::cuda);
    j["config"] = config_json(cfg);
    j["dcp"] = {{"size", w}, {"interleave", d.interleave}};
    j["step"] = {{"seq_lens", spec.seq_lens}, {"qlen", o.qlen}, {"page_size", o.page_size},
                 {"kv_dtype", o.kv_dtype}, {"splits", o.splits}, {"seed", o.seed}};
    j["wall_us"] = wall_us;
    if (check) {
      nlohmann::json rows = nlohmann::json::array();
      for (int r = 0; r < w; ++r)
        rows.push_back({{"rank", r}, {"vs_dcp1", checks[r].vs_dcp1}, {"vs_float64", checks[r].vs_ref},
                        {"ok", checks[r].ok()}, {"why", checks[r].why}});
      j["check"] = {{"ok", ok}, {"ranks", rows}};
    }
    write_json(j, json);
  }
  return ok ? 0 : 1;
}

}  // namespace mla::cli
