// mla::Workspace (include/mla/workspace.hpp) and its backends' side (core/workspace_impl.hpp).
#include <string>
#include <utility>

#include "core/workspace_impl.hpp"
#include "mla/error.hpp"

namespace mla {

Workspace::Workspace() : impl_(std::make_unique<Impl>()) {}
Workspace::~Workspace() = default;
int64_t Workspace::bytes() const { return impl_->bytes; }
Device Workspace::device() const { return impl_->device; }
int Workspace::device_index() const { return impl_->device_index; }

void Workspace::Impl::reserve(Device dev, int index, int64_t want, const Allocate& allocate) {
  if (bound) {
    MLA_REQUIRE(dev == device && (dev == Device::cpu || index == device_index),
                "LayerOptions.workspace: expected a layer on ", device_name(device),
                device == Device::cuda ? ":" + std::to_string(device_index) : std::string(),
                " (the workspace's), got one on ", device_name(dev),
                dev == Device::cuda ? ":" + std::to_string(index) : std::string());
  }
  if (want > bytes) {
    // The new block before the old one goes: an allocation that fails (out of memory) leaves the
    // workspace as it was for the layers already using it (so both must fit for a moment).
    Block grown = allocate(want);
    block = std::move(grown);
    bytes = want;
  }
  bound = true, device = dev, device_index = index;
}

}  // namespace mla
