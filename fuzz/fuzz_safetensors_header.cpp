// libFuzzer: a .safetensors header parser must answer any bytes with a header whose tensors lie
// inside the input, or with mla::Error; anything else (a crash, a sanitizer report, another
// exception, a tensor range outside the file) is a finding.
#include <cstdint>
#include <cstdlib>

#include "core/checkpoint/safetensors.hpp"
#include "mla/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto h = mla::safetensors::parse_header({data, size}, "fuzz");
    for (const auto& t : h.tensors) {
      if (h.data_offset + t.end > size || t.begin > t.end) std::abort();
      if (t.bytes() != uint64_t(t.numel()) * uint64_t(t.elem_size)) std::abort();
    }
  } catch (const mla::Error&) {
  }
  return 0;
}
