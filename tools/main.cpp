// The `mla` command line: `mla run` (one checked decode step) and `mla bench` (roofline timing).
// Exit codes: 0 ok, 1 a --check tolerance exceeded, 2 bad flags or an mla::Error (one line on stderr).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <string>

#include "bench.hpp"
#include "mla/error.hpp"
#include "report.hpp"
#include "run.hpp"

namespace {
// Error messages become exactly one line on stderr.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  mla::cli::set_command_line(argc, argv);
  CLI::App app{"mla: the decode step of a Multi-head Latent Attention layer (pre / attend / post)", "mla"};
  app.require_subcommand(1);
  mla::cli::RunOptions run;
  mla::cli::BenchOptions bench;
  mla::cli::add_run_command(app, run);
  mla::cli::add_bench_command(app, bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help
  } catch (const CLI::ParseError& e) {
    std::cerr << "mla: error: " << one_line(e.what()) << " (see mla --help)" << std::endl;
    return 2;
  }
  try {
    if (app.got_subcommand("run")) return mla::cli::run_command(run);
    return mla::cli::bench_command(bench);
  } catch (const mla::Error& e) {
    std::cerr << "mla: error: " << one_line(e.what()) << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "mla: error: " << one_line(e.what()) << std::endl;
  }
  return 2;
}
