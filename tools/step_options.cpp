#include "step_options.hpp"

#include <sstream>

#include "core/backend.hpp"
#include "mla/checkpoint.hpp"
#include "mla/error.hpp"

namespace mla::cli {

void add_step_options(CLI::App& app, StepOptions& o) {
  CLI::Option* preset = app.add_option("--preset", o.preset, "Layer preset")
                            ->check(CLI::IsMember(LayerConfig::preset_names()))
                            ->capture_default_str();
  app.add_option("--batch", o.batch, "Requests in the step (default: one per --context entry)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--context", o.context,
                 "KV history before this step: one length for all requests, or a comma list, one per request")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--qlen", o.qlen, "Query tokens per request (1..8)")->check(CLI::Range(1, 8))->capture_default_str();
  app.add_option("--page-size", o.page_size, "Rows per KV page")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--kv-dtype", o.kv_dtype, "KV cache dtype")->check(CLI::IsMember({"fp8", "bf16"}))->capture_default_str();
  app.add_option("--q-dtype", o.q_dtype, "Query dtype fed to attend")
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->capture_default_str();
  app.add_option("--backend", o.backend, "Backend")->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  app.add_option("--gate-layout", o.gate_layout, "Output gate layout (default: the preset's)")
      ->check(CLI::IsMember({"none", "merged", "separate"}));
  app.add_option("--seed", o.seed, "Seed of the synthetic weights and inputs")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--splits", o.splits, "Split-KV chunks per request that attend leaves for post to merge (0: as the "
                 "backend plans the step, for the stage calls too; 1: merged; > 1: this many, in step() too)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--heads", o.heads, "Override: this rank's heads N")->check(CLI::PositiveNumber);
  app.add_option("--hidden", o.hidden, "Override: hidden size D")->check(CLI::PositiveNumber);
  CLI::Option* rq = app.add_option("--q-lora-rank", o.q_lora_rank, "Override: q LoRA rank Rq")->check(CLI::PositiveNumber);
  // A real layer: its config.json decides the dimensions, so the preset and overrides do not apply.
  app.add_option("--checkpoint", o.checkpoint,
                 "Hugging Face checkpoint directory (config.json, *.safetensors): run --layer's real weights "
                 "instead of --preset's synthetic ones")
      ->check(CLI::ExistingDirectory)
      ->excludes(preset)
      ->excludes(app.get_option("--heads"))
      ->excludes(app.get_option("--hidden"))
      ->excludes(rq)
      ->excludes(app.get_option("--gate-layout"));
  app.add_option("--layer", o.layer, "With --checkpoint: the layer, 0-based")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--tp", o.tp, "With --checkpoint: tensor-parallel size T (this rank runs heads / T heads)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rank", o.rank, "With --checkpoint: this rank of --tp")->check(CLI::NonNegativeNumber)->capture_default_str();
}

LayerConfig make_config(const StepOptions& o) {
  if (!o.checkpoint.empty()) return load_layer_config(o.checkpoint, o.tp);
  LayerConfig cfg = LayerConfig::preset(o.preset);
  if (o.heads > 0) cfg.total_heads = o.heads * cfg.tp_size;
  if (o.hidden > 0) cfg.hidden = o.hidden;
  if (o.q_lora_rank > 0) cfg.q_lora_rank = o.q_lora_rank;
  if (o.gate_layout == "none") cfg.gate = GateLayout::none;
  if (o.gate_layout == "merged") cfg.gate = GateLayout::merged;
  if (o.gate_layout == "separate") cfg.gate = GateLayout::separate;
  cfg.validate();
  return cfg;
}

DType parse_dtype(const std::string& flag, const std::string& value) {
  if (value == "fp8") return DType::fp8_e4m3;
  if (value == "bf16") return DType::bf16;
  detail::fail(flag, ": expected fp8 or bf16, got '", value, "'");
}

Backend parse_backend(const std::string& value) {
  if (value == "auto") return Backend::automatic;
  if (value == "cpu") return Backend::cpu;
  if (value == "cuda") return Backend::cuda;
  detail::fail("--backend: expected auto, cpu or cuda, got '", value, "'");
}

std::vector<int32_t> make_seq_lens(const StepOptions& o) {
  MLA_REQUIRE(!o.context.empty(), "--context: expected at least one length");
  const int batch = o.batch > 0 ? o.batch : int(o.context.size());
  MLA_REQUIRE(o.context.size() == 1 || int(o.context.size()) == batch, "--context: expected 1 or --batch = ", batch,
              " lengths, got ", o.context.size());
  std::vector<int32_t> seq_lens(batch);
  for (int b = 0; b < batch; ++b) {
    const int64_t len = int64_t(o.context.size() == 1 ? o.context[0] : o.context[b]) + o.qlen;
    MLA_REQUIRE(len < (int64_t(1) << 31), "--context: length ", len, " does not fit in int32");
    seq_lens[b] = int32_t(len);
  }
  return seq_lens;
}

Step make_step(const StepOptions& o) {
  Step st;
  if (!o.checkpoint.empty()) {
    const CheckpointLayer ck = load_layer(o.checkpoint, o.layer, o.tp, o.rank);
    st.cfg = ck.config;
    st.weights = prepare_weights(st.cfg, ck.weights);
  } else {
    st.cfg = make_config(o);
    st.weights = prepare_weights(st.cfg, random_checkpoint_weights(st.cfg, o.seed));
  }
  const std::vector<int32_t> seq_lens = make_seq_lens(o);
  const int64_t S = int64_t(seq_lens.size()) * o.qlen;
  const LayerOptions opts{.backend = parse_backend(o.backend),
                          .q_dtype = parse_dtype("--q-dtype", o.q_dtype),
                          .max_tokens = int(S),
                          // step() (bench) splits as the backend chooses unless --splits asks.
                          .num_splits = o.splits > 1 ? o.splits : 0,
                          .num_threads = o.threads};
  st.layer.emplace(st.cfg, st.weights, opts);

  synth::ScenarioSpec spec{.cfg = st.cfg,
                           .seq_lens = seq_lens,
                           .qlen = o.qlen,
                           .page_size = o.page_size,
                           .kv_dtype = parse_dtype("--kv-dtype", o.kv_dtype),
                           .seed = o.seed + 1};
  st.host = synth::make_scenario(spec, st.weights.k_scale);
  const Device dev = st.layer->device();
  st.dev = dev == Device::cpu ? st.host : synth::to_device(st.host, opts.cuda_device);

  const int64_t G = st.layer->query_heads(), L = st.cfg.kv_lora_rank;
  // 0: the stage calls use the split count the backend plans for this step (CUDA: enough CTAs to
  // fill the GPU; CPU: merged inside attend), so `mla bench` times attend with the step's splits.
  st.splits = o.splits;
  if (st.splits == 0) {
    const detail::StepWorkspace ws = detail::backend_of(*st.layer).workspace(st.dev.meta(), st.dev.kv());
    st.splits = ws.attend.o.rank == 4 ? int(ws.attend.o.shape[0]) : 1;
  }
  st.q = Tensor::empty(opts.q_dtype, {S, G, st.cfg.row_dim()}, dev);
  if (st.cfg.gate_dim() > 0) st.gate = Tensor::empty(DType::bf16, {S, st.cfg.gate_dim()}, dev);
  if (st.splits > 1) {
    st.o = Tensor::empty(DType::f32, {st.splits, S, G, L}, dev);
    st.lse = Tensor::empty(DType::f32, {st.splits, S, G}, dev);
  } else {
    st.o = Tensor::empty(DType::f32, {S, G, L}, dev);
    st.lse = Tensor::empty(DType::f32, {S, G}, dev);
  }
  st.out = Tensor::empty(DType::bf16, {S, int64_t(st.cfg.heads()) * st.cfg.v_head_dim}, dev);
  return st;
}

std::string describe(const Step& st, const StepOptions& o) {
  std::ostringstream os;
  os << st.cfg.name << " N=" << st.cfg.heads() << " B=" << st.host.spec.seq_lens.size() << " ctx=";
  for (size_t i = 0; i < o.context.size(); ++i) os << (i ? "," : "") << o.context[i];
  os << " Q=" << o.qlen << " page=" << o.page_size << " kv=" << o.kv_dtype << " q=" << o.q_dtype;
  if (st.splits > 1) os << " splits=" << st.splits;
  os << " " << backend_name(st.layer->backend());
  return os.str();
}

}  // namespace mla::cli
