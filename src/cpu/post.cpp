// PLACEHOLDER: the CPU post stage is being written (see the issue tracker); it throws until then.
#include "cpu/stages.hpp"
#include "mla/error.hpp"
namespace mla::cpu {
void post(const Context&, const AttendOutputs&, const TensorView&, const StepMeta&, const TensorView&) {
  detail::fail("cpu::post: not implemented yet");
}
}  // namespace mla::cpu
