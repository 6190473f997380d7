#pragma once
// Errors the CUDA kernels find in device-resident metadata (an out-of-range or duplicate slot, a
// bad page index, a seq_len < qlen). The host validates shapes and host-resident values before any
// launch; values that live on the device are checked by the kernels that read them, which then
// skip the bad entry (a slot out of range is never written, a bad page never read) and set a bit
// in the layer's device error word. pre checks the whole slot_mapping before it writes the cache,
// so a step with any bad slot leaves the cache as it was. The word is sticky: every later step's
// cache write is skipped too until the host takes the error here (the only place that waits for
// the device).
#include <cstdint>
#include <string>

#include "core/backend.hpp"

namespace mla::cuda {

// Waits for the layer's stream, returns and clears the error bits (0: none). Throws mla::Error if
// the backend is not the CUDA backend.
uint32_t take_device_errors(detail::BackendImpl& backend);
// "slot_mapping out of range; ..." for the bits set.
std::string describe_device_errors(uint32_t bits);
// take_device_errors, throwing mla::Error with the description when any bit was set.
void check_device_errors(detail::BackendImpl& backend);

}  // namespace mla::cuda
