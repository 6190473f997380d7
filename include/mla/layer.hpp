#pragma once
// The MLA decode layer: three public stages, pre -> attend -> post, and step() running all three.
// Every call validates what it reads before it writes anything (mla::Error otherwise).
//
//   mla::Layer layer(cfg, mla::prepare_weights(cfg, ckpt), {.backend = mla::Backend::cpu});
//   layer.step(hidden, meta, cache, out);   // hidden [S, D] bf16 -> out [S, N*V] bf16
#include <memory>
#include <string>

#include "mla/config.hpp"
#include "mla/step.hpp"
#include "mla/tensor.hpp"
#include "mla/weights.hpp"
#include "mla/workspace.hpp"

namespace mla {

enum class Backend : uint8_t { automatic, cpu, cuda };
const char* backend_name(Backend b);
bool cuda_available();  // built with CUDA and a device is present

class Communicator;  // mla/comm.hpp: collectives for DCP
class Layer;

struct LayerOptions {
  Backend backend = Backend::automatic;  // automatic: CUDA where a GPU is present, else CPU
  DType q_dtype = DType::fp8_e4m3;       // query fed to attend: fp8_e4m3, or bf16 (W = 1 only)
  DcpInfo dcp{};                         // W > 1 needs comm
  Communicator* comm = nullptr;          // not owned
  int max_tokens = 256;                  // largest S a step() may have: sizes the workspace
  int num_splits = 0;                    // split-KV chunks per request in step(); 0 = choose
  int q_head_pad = 0;                    // step()'s query buffer head count (>= G); 0 = G
  int num_threads = 0;                   // CPU threads; 0 = all cores
  int cuda_device = 0;
  void* cuda_stream = nullptr;           // cudaStream_t the stages run on; null = default stream
  // step()'s scratch shared with the model's other layers (mla/workspace.hpp); null = the layer's own.
  std::shared_ptr<Workspace> workspace = nullptr;
};

// pre's outputs. q may be a strided view padded to more heads than G.
struct PreOutputs {
  TensorView q;     // [S, Hq >= G, L+R] fp8_e4m3 or bf16; this rank's heads at rank*N
  TensorView gate;  // [S, N*V] bf16 sigmoid(gate_logits); undefined when the model has no gate
};

// attend's outputs: merged ([S, G, L], [S, G]) or split partials left for post to merge
// ([splits, S, G, L], [splits, S, G]). o is f32 or bf16; lse is f32, natural log.
struct AttendOutputs {
  TensorView o;
  TensorView lse;
};

namespace detail {
class BackendImpl;
BackendImpl& backend_of(Layer& layer);
}

class Layer {
 public:
  Layer(const LayerConfig& cfg, const PreparedWeights& weights, const LayerOptions& opts = {});
  ~Layer();
  Layer(Layer&&) noexcept;
  Layer& operator=(Layer&&) noexcept;

  const LayerConfig& config() const;
  const LayerOptions& options() const;
  Backend backend() const;
  Device device() const;  // where every view passed to this layer must live
  int query_heads() const { return config().heads() * options().dcp.size; }  // G

  // hidden [S, D] bf16 -> query (W > 1: gathered over ranks), gate; writes this rank's new cache rows.
  void pre(const TensorView& hidden, const StepMeta& meta, const KVCache& cache, const PreOutputs& out);
  // Attention of q [S, Hq, L+R] (first G heads used) over this rank's cache.
  void attend(const TensorView& q, const KVCache& cache, const StepMeta& meta, const AttendOutputs& out);
  // Combine (split partials, DCP ranks) -> W_UV -> gate: out [S, N*V] bf16.
  void post(const AttendOutputs& attn, const TensorView& gate, const StepMeta& meta, const TensorView& out);
  // All three stages through the layer's own workspace (S <= max_tokens).
  void step(const TensorView& hidden, const StepMeta& meta, const KVCache& cache, const TensorView& out);
  // Which attend kernel the last attend() (or step()) ran, and its plan: on the CPU the instruction
  // set's kernels ("cpu avx512-bf16"), on the GPU the kernel family and its splits ("rows, 2 fixed
  // splits", "wgmma, flat plan of 264 key-CTAs"); empty before the first attend on the GPU. For
  // logs and benchmark records: the figure a caller measures belongs to that kernel.
  std::string last_attend_kernel() const;

 private:
  friend detail::BackendImpl& detail::backend_of(Layer& layer);
  std::unique_ptr<detail::BackendImpl> impl_;
};

}  // namespace mla
