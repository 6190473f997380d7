// PLACEHOLDER: the CPU attend stage is being written (see the issue tracker); it throws until then.
#include "cpu/stages.hpp"
#include "mla/error.hpp"
namespace mla::cpu {
void attend(const Context&, const TensorView&, const KVCache&, const StepMeta&, const AttendOutputs&) {
  detail::fail("cpu::attend: not implemented yet");
}
}  // namespace mla::cpu
