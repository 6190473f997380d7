#pragma once
// Scratch memory that the layers of a model share for step(): a model's layers run one after
// another, so one step's scratch (the query, the gate, attend's split partials, the projections'
// intermediates and, on the GPU, the cuBLASLt workspace) serves them all instead of each layer
// holding its own (CUDA, kimi-k3 at 12 heads a rank and max_tokens 256, by CudaBackend's sizes:
// ~60 MB a layer, 32 MB of it cuBLASLt's workspace, ~3.7 GB over 61 layers; at 128 query heads
// attend's split partials alone ~134 MB a layer, twice that with DCP's exchange).
//
//   auto ws = std::make_shared<mla::Workspace>();
//   std::vector<mla::Layer> layers;
//   for (...) layers.emplace_back(cfg, weights[i], mla::LayerOptions{.backend = ..., .workspace = ws});
//
// Rules: every layer that shares one runs on the same device and the same stream (CUDA) or thread
// (CPU), one call at a time, constructions included (nothing here locks); the workspace holds the
// largest layer's needs, growing when a larger layer is constructed (old and new block both for a
// moment; a failed growth changes nothing), so construct every layer before capturing a CUDA graph
// of their steps: a growth moves the memory, and a graph captured before it would write where the
// old block was. What step() leaves in it is overwritten by the next layer's call: on the GPU the
// stage calls use it too (pre's projections, DCP's exchange in post), on the CPU only step().
#include <cstdint>
#include <memory>

#include "mla/tensor.hpp"

namespace mla {

class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  int64_t bytes() const;  // allocated now: the largest need of the layers constructed with it
  Device device() const;  // where (the first layer's device; cpu until a layer binds it)
  int device_index() const;

  struct Impl;  // (the backends' side: src/core/workspace_impl.hpp)
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mla
