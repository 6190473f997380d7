#include "report.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>

#include "mla/error.hpp"

namespace mla::cli {
namespace {

std::string g_command_line;

// First line of a shell command's stdout, "" when it fails.
std::string first_line(const std::string& cmd) {
  FILE* f = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!f) return "";
  std::array<char, 512> buf{};
  std::string s = std::fgets(buf.data(), int(buf.size()), f) ? buf.data() : "";
  const int rc = ::pclose(f);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return rc == 0 ? s : "";
}

std::string git_revision() {
  // MLA_GIT_REV where the caller knows better than the tree's .git (the device tool copies the
  // working tree with a .git that need not match it: scripts/device-check sets it); else the
  // source tree this binary was built from, else the working directory's repository.
  if (const char* env = std::getenv("MLA_GIT_REV"); env && *env) return env;
  std::string rev = first_line("git -C '" MLA_SOURCE_DIR "' rev-parse HEAD");
  if (rev.empty()) rev = first_line("git rev-parse HEAD");
  if (!rev.empty() && !first_line("git -C '" MLA_SOURCE_DIR "' status --porcelain --untracked-files=no").empty())
    rev += "-dirty";
  return rev.empty() ? "unknown" : rev;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

void set_command_line(int argc, char** argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) {
    if (i) g_command_line += ' ';
    g_command_line += argv[i];
  }
}

const std::string& command_line() { return g_command_line; }

nlohmann::json provenance(bool cuda) {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json j{{"git_revision", git_revision()},
                   {"command", g_command_line},
                   {"timestamp", stamp},
                   {"host_cpu", cpu_model()}};
  if (cuda) j["driver"] = first_line("nvidia-smi --query-gpu=driver_version --format=csv,noheader");
  return j;
}

nlohmann::json config_json(const LayerConfig& c) {
  const char* gate = c.gate == GateLayout::none ? "none" : c.gate == GateLayout::merged ? "merged" : "separate";
  return {{"name", c.name},          {"hidden", c.hidden},
          {"q_lora_rank", c.q_lora_rank}, {"kv_lora_rank", c.kv_lora_rank},
          {"qk_nope_dim", c.qk_nope_dim}, {"qk_rope_dim", c.qk_rope_dim},
          {"v_head_dim", c.v_head_dim},   {"total_heads", c.total_heads},
          {"tp_size", c.tp_size},         {"heads", c.heads()},
          {"gate", gate},                 {"rope", c.rope == RopeType::yarn ? "yarn" : "none"},
          {"rms_eps", c.rms_eps}};
}

void write_json(const nlohmann::json& j, const std::string& path) {
  if (path == "-") {
    std::cout << j.dump(2) << std::endl;
    return;
  }
  std::ofstream out(path);
  MLA_REQUIRE(out.good(), "--json: cannot open '", path, "' for writing");
  out << j.dump(2) << "\n";
  MLA_REQUIRE(!out.fail(), "--json: writing '", path, "' failed");
}

}  // namespace mla::cli
