// libFuzzer: config.json parsing answers any text with a valid LayerConfig or mla::Error.
#include <cstdint>
#include <string_view>

#include "core/checkpoint/hf_config.hpp"
#include "mla/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks tp, so the head-count checks are reached too.
  const int tp = 1 + data[0] % 8;
  try {
    const auto hf = mla::checkpoint::parse_hf_config(
        std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), tp, "fuzz");
    hf.layer.validate();
  } catch (const mla::Error&) {
  }
  return 0;
}
