// PLACEHOLDER: the CPU pre stage is being written (see the issue tracker); it throws until then.
#include "cpu/stages.hpp"
#include "mla/error.hpp"
namespace mla::cpu {
void pre(const Context&, const TensorView&, const StepMeta&, const KVCache&, const PreOutputs&) {
  detail::fail("cpu::pre: not implemented yet");
}
}  // namespace mla::cpu
