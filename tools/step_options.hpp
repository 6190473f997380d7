#pragma once
// The flags that describe one synthetic decode step (shared by `mla run` and `mla bench`) and the
// step they build: a synthetic layer of a preset, a KV history, the stage output buffers.
// --dcp W > 1 runs W thread ranks instead (tools/dcp_run.cpp); make_step() is the W = 1 step.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/synthetic.hpp"
#include "mla/mla.hpp"

namespace mla::cli {

struct StepOptions {
  std::string preset = "kimi-k3";
  int batch = 0;                     // 0: one request per --context entry (1 if a single length)
  std::vector<int> context{4096};    // history before this step; one value or one per request
  int qlen = 1;
  int page_size = 64;
  std::string kv_dtype = "fp8";
  std::string q_dtype = "fp8";
  std::string backend = "auto";
  std::string gate_layout;           // empty: the preset's
  uint64_t seed = 1;
  int threads = 0;                   // 0: all cores
  int splits = 0;                    // 0: the backend's plan; > 1: attend leaves this many partials
  // Dimension overrides (0: the preset's).
  int heads = 0;                     // N, this rank's heads (total_heads = N * tp_size)
  int hidden = 0;                    // D
  int q_lora_rank = 0;               // Rq
  // A real layer instead of synthetic weights (mla/checkpoint.hpp): dimensions from its config.json.
  std::string checkpoint;            // Hugging Face checkpoint directory; empty: --preset's synthetic weights
  int layer = 0;                     // the checkpoint's layer, 0-based
  int tp = 1;                        // tensor-parallel size: this rank runs num_attention_heads / tp heads
  int rank = 0;                      // this rank: heads rank*N .. (rank+1)*N
};

// Registers the step flags on a (sub)command.
void add_step_options(CLI::App& app, StepOptions& o);

LayerConfig make_config(const StepOptions& o);
DType parse_dtype(const std::string& flag, const std::string& value);  // fp8 | bf16
Backend parse_backend(const std::string& value);
// Global seq_lens of the step: context + qlen per request (mla::Error on a bad list).
std::vector<int32_t> make_seq_lens(const StepOptions& o);

// One step ready to run: the layer, the step's inputs (on the host and, for CUDA, on the
// device), and the stage outputs on the layer's device.
struct Step {
  LayerConfig cfg;
  PreparedWeights weights;
  std::optional<Layer> layer;
  synth::Scenario host;    // inputs on the host (what --check and --dump read)
  synth::Scenario dev;     // the same on the layer's device (== host copy for the CPU)
  int splits = 1;  // the stage calls' split count (o, lse rank 4 when > 1)
  Tensor q, gate, o, lse, out;  // stage outputs on the layer's device

  int tokens() const { return host.tokens(); }
  StepMeta meta() const { return dev.meta(); }
  KVCache kv() const { return dev.kv(); }
  PreOutputs pre_outputs() const { return {.q = q.view(), .gate = gate.view()}; }
  AttendOutputs attend_outputs() const { return {.o = o.view(), .lse = lse.view()}; }
  void run_pre() { layer->pre(dev.hidden, meta(), kv(), pre_outputs()); }
  void run_attend() { layer->attend(q, kv(), meta(), attend_outputs()); }
  void run_post() { layer->post(attend_outputs(), gate.view(), meta(), out); }
  void run_step() { layer->step(dev.hidden, meta(), kv(), out); }
};

Step make_step(const StepOptions& o);

// "kimi-k3 B=16 ctx=4096 Q=1 page=64 kv=fp8 q=fp8 cpu"
std::string describe(const Step& step, const StepOptions& o);

}  // namespace mla::cli
