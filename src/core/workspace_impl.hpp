#pragma once
// The backends' side of mla::Workspace (include/mla/workspace.hpp): one block of memory on one
// device, grown to the largest need of the layers that reserve from it, and each layer's slots at
// fixed offsets in it (a Layout), resolved against the block's address at every use (a growth moves
// the block).
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mla/workspace.hpp"

namespace mla {

struct Workspace::Impl {
  using Block = std::shared_ptr<uint8_t>;
  using Allocate = std::function<Block(int64_t bytes)>;

  bool bound = false;  // a layer has reserved: device and index fixed
  Device device = Device::cpu;
  int device_index = 0;
  int64_t bytes = 0;
  Block block;

  // Grows the block to at least `want` bytes with `allocate` (the caller has finished every use of
  // the old one, which goes once the new one is there; a failed allocation changes nothing), after
  // checking the device: a workspace holds one device's memory (mla::Error naming
  // LayerOptions.workspace otherwise). Only a reservation that succeeds binds the device.
  void reserve(Device dev, int index, int64_t want, const Allocate& allocate);
  uint8_t* data() const { return block.get(); }
};

namespace detail {

// A layer's slots in a workspace: offsets aligned to 256 bytes (cudaMalloc's alignment, which
// TMA, cuBLASLt and 16-byte vector loads take for granted).
class WorkspaceLayout {
 public:
  static constexpr int64_t kAlign = 256;
  // A slot of `bytes` (0: none); returns its index.
  int add(int64_t bytes) {
    offsets_.push_back(bytes > 0 ? total_ : -1);
    total_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return int(offsets_.size()) - 1;
  }
  int64_t total() const { return total_; }
  // The slot's address in the block at `base` (nullptr for an empty slot).
  uint8_t* at(uint8_t* base, int slot) const { return offsets_[size_t(slot)] < 0 ? nullptr : base + offsets_[size_t(slot)]; }

 private:
  std::vector<int64_t> offsets_;
  int64_t total_ = 0;
};

}  // namespace detail
}  // namespace mla
