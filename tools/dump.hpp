#pragma once
// `mla run --dump DIR`: the step's inputs, the prepared weights and every stage's outputs as
// .safetensors files (layout in README.md, "--dump files").
#include <string>

#include "check.hpp"

namespace mla::cli {

// Writes inputs, weights, pre, attend and post .safetensors into dir (created if missing).
// `metadata` (JSON text: config, command line) goes into every file's __metadata__.
void dump_step(const std::string& dir, const Step& step, const StepSnapshot& snap, const std::string& metadata);

}  // namespace mla::cli
