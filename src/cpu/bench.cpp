// PLACEHOLDER: owned by the CLI/bench work.
#include "cpu/stages.hpp"
#include "mla/error.hpp"
namespace mla::cpu {
std::vector<double> time_us(const std::function<void()>&, int, int, int) { detail::fail("cpu::time_us: not implemented yet"); }
detail::Ceilings measure_ceilings(int) { detail::fail("cpu::measure_ceilings: not implemented yet"); }
}  // namespace mla::cpu
