#pragma once
// What every machine-readable result records: where and when it was measured, from which source.
#include <nlohmann/json.hpp>
#include <string>

#include "mla/config.hpp"

namespace mla::cli {

// The exact command line, set by main().
void set_command_line(int argc, char** argv);
const std::string& command_line();

// {git_revision, command, timestamp (UTC ISO 8601), host_cpu, driver (CUDA runs)}
nlohmann::json provenance(bool cuda);

nlohmann::json config_json(const LayerConfig& cfg);

// Writes JSON to a file, or to stdout when path is "-".
void write_json(const nlohmann::json& j, const std::string& path);

}  // namespace mla::cli
