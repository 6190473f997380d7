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

namespace {
// "cpu" or "cuda:N" (built by appending: GCC 12 warns falsely on ":" + std::to_string(n), -Wrestrict).
std::string where(Device d, int index) {
  std::string s = device_name(d);
  if (d == Device::cuda) s.append(":").append(std::to_string(index));
  return s;
}
}  // namespace

void Workspace::Impl::reserve(Device dev, int index, int64_t want, const Allocate& allocate) {
  if (bound) {
    MLA_REQUIRE(dev == device && (dev == Device::cpu || index == device_index), "LayerOptions.workspace: expected a layer on ",
                where(device, device_index), " (the workspace's), got one on ", where(dev, index));
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
