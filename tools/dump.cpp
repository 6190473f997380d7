#include "dump.hpp"

#include <filesystem>

#include "core/safetensors_writer.hpp"
#include "mla/error.hpp"

namespace mla::cli {
namespace {

void add_mxfp4(safetensors::Writer& w, const std::string& name, const MxFp4Matrix& m) {
  w.add_bytes(name + "_codes", DType::u8, {m.batch, m.rows, m.cols / 2}, m.codes.data());
  w.add_bytes(name + "_scales", DType::u8, {m.batch, m.rows, m.cols / kMxBlock}, m.scales.data());
}

}  // namespace

void dump_step(const std::string& dir, const Step& st, const StepSnapshot& snap, const std::string& metadata) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MLA_REQUIRE(!ec, "--dump: cannot create directory '", dir, "': ", ec.message());
  const std::filesystem::path root(dir);
  auto writer = [&] {
    safetensors::Writer w;
    w.set_metadata("mla", metadata);
    return w;
  };
  const LayerConfig& cfg = st.cfg;

  safetensors::Writer in = writer();
  in.add("hidden", st.host.hidden);
  in.add("seq_lens", st.host.seq_lens);
  in.add("kv_indptr", st.host.kv_indptr);
  in.add("kv_indices", st.host.kv_indices);
  in.add("slot_mapping", st.host.slot_mapping);
  in.add("cache_before", snap.cache_before);
  in.write((root / "inputs.safetensors").string());

  const PreparedWeights& pw = st.weights;
  safetensors::Writer wt = writer();
  wt.add_bytes("qkv_a", DType::bf16, {cfg.qkv_a_rows(), cfg.hidden}, pw.qkv_a.data());
  wt.add_bytes("q_a_norm", DType::f32, {cfg.q_lora_rank}, pw.q_a_norm.data());
  wt.add_bytes("kv_a_norm", DType::f32, {cfg.kv_lora_rank}, pw.kv_a_norm.data());
  wt.add_bytes("q_b", DType::bf16, {int64_t(cfg.heads()) * cfg.qk_head_dim(), cfg.q_lora_rank}, pw.q_b.data());
  add_mxfp4(wt, "w_uk", pw.w_uk);
  add_mxfp4(wt, "w_uv", pw.w_uv);
  wt.add_scalar("q_scale", pw.q_scale);
  wt.add_scalar("k_scale", pw.k_scale);
  wt.write((root / "weights.safetensors").string());

  safetensors::Writer pre = writer();
  pre.add("q", snap.q);
  if (snap.gate.bytes()) pre.add("gate", snap.gate);
  pre.add("cache_after", snap.cache_after);
  pre.write((root / "pre.safetensors").string());

  safetensors::Writer att = writer();
  att.add("o", snap.o);
  att.add("lse", snap.lse);
  att.write((root / "attend.safetensors").string());

  safetensors::Writer post = writer();
  post.add("out", snap.out);
  post.write((root / "post.safetensors").string());
}

}  // namespace mla::cli
