#include "run.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "check.hpp"
#include "core/backend.hpp"
#include "dump.hpp"
#include "mla/error.hpp"
#include "report.hpp"

namespace mla::cli {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* run = app.add_subcommand("run", "Run one synthetic decode step, stage by stage, and time it");
  add_step_options(*run, o.step);
  add_dcp_options(*run, o.dcp);
  run->add_flag("--check", o.check, "Check every stage against the float64 reference; exit 1 on a failure");
  run->add_option("--json", o.json, "Write the result as JSON to FILE (\"-\" or no value: stdout)")
      ->expected(0, 1)
      ->default_str("-");
  run->add_option("--dump", o.dump, "Write inputs, weights and stage outputs as .safetensors into DIR");
  run->add_option("--repeat", o.repeat, "Timed runs per stage after one warm-up (median reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
}

int run_command(const RunOptions& o) {
  if (o.dcp.size > 1) {
    MLA_REQUIRE(o.step.checkpoint.empty(), "--checkpoint: not supported with --dcp ", o.dcp.size, " yet (only at --dcp 1)");
    MLA_REQUIRE(o.dump.empty(), "--dump: not supported with --dcp ", o.dcp.size, " yet (only at --dcp 1)");
    return dcp_run_command(o.step, o.dcp, o.check, o.json);
  }
  Step st = make_step(o.step);
  // The history before pre writes this step's rows: --dump's cache_before and the check's baseline.
  Tensor cache_before = st.dev.cache.to_host();

  // Each stage timed by the backend's clock (caches flushed); the stages are idempotent, so the
  // warm-up and repeats leave the same outputs as a single run.
  detail::BackendImpl& backend = detail::backend_of(*st.layer);
  auto time_stage = [&](const std::function<void()>& fn) { return median(backend.time_us(fn, 1, o.repeat)); };
  const double pre_us = time_stage([&] { st.run_pre(); });
  const double attend_us = time_stage([&] { st.run_attend(); });
  const std::string attend_kernel = backend.last_attend_kernel();  // (the one timed: the check may run others)
  const double post_us = time_stage([&] { st.run_post(); });
  const double step_us = pre_us + attend_us + post_us;
  const double tokens_per_s = st.tokens() / (step_us * 1e-6);

  std::vector<CheckRow> rows;
  if (o.check || !o.dump.empty()) {
    const StepSnapshot snap = host_copies(st, std::move(cache_before));
    if (!o.dump.empty()) {
      const nlohmann::json meta{{"config", config_json(st.cfg)}, {"command", command_line()},
                                {"qlen", o.step.qlen},           {"page_size", o.step.page_size},
                                {"splits", st.splits}};
      dump_step(o.dump, st, snap, meta.dump());
    }
    if (o.check) rows = check_step(st, snap);
  }
  const bool ok = std::all_of(rows.begin(), rows.end(), [](const CheckRow& r) { return r.ok(); });

  // The human-readable report goes to stderr when stdout carries the JSON.
  std::ostream& text = o.json == "-" ? std::cerr : std::cout;
  char line[160];
  text << describe(st, o.step) << "  S=" << st.tokens() << "\n";
  std::snprintf(line, sizeof line, "pre %10.1f us   attend %10.1f us   post %10.1f us   step %10.1f us   %.0f tokens/s\n",
                pre_us, attend_us, post_us, step_us, tokens_per_s);
  text << line;
  if (!attend_kernel.empty()) text << "attend kernel: " << attend_kernel << "\n";
  if (o.check) text << format_check_table(rows) << (ok ? "check: ok\n" : "check: FAILED\n");
  if (!o.dump.empty()) text << "dump: " << o.dump << "/{inputs,weights,pre,attend,post}.safetensors\n";
  text.flush();

  if (!o.json.empty()) {
    nlohmann::json j = provenance(st.layer->backend() == Backend::cuda);
    j["config"] = config_json(st.cfg);
    j["step"] = {{"batch", st.host.spec.seq_lens.size()},
                 {"seq_lens", st.host.spec.seq_lens},
                 {"qlen", o.step.qlen},
                 {"tokens", st.tokens()},
                 {"page_size", o.step.page_size},
                 {"kv_dtype", o.step.kv_dtype},
                 {"q_dtype", o.step.q_dtype},
                 {"splits", st.splits},
                 {"seed", o.step.seed},
                 {"backend", backend_name(st.layer->backend())}};
    j["time_us"] = {{"pre", pre_us}, {"attend", attend_us}, {"post", post_us}, {"step", step_us}};
    j["attend_kernel"] = attend_kernel;
    j["tokens_per_s"] = tokens_per_s;
    if (o.check) {
      nlohmann::json checks = nlohmann::json::array();
      for (const CheckRow& r : rows)
        checks.push_back({{"stage", r.stage}, {"tensor", r.tensor}, {"metric", r.metric}, {"error", r.error},
                          {"tolerance", r.tolerance}, {"ok", r.ok()}, {"why", r.why}});
      j["check"] = {{"ok", ok}, {"rows", checks}};
    }
    write_json(j, o.json);
  }
  return ok ? 0 : 1;
}

}  // namespace mla::cli
