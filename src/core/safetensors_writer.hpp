#pragma once
// A small writer of .safetensors files (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, the JSON header {name: {dtype, shape, data_offsets}, __metadata__},
// padded with spaces so the data starts 8-byte aligned, then the tensors' bytes back to back.
//
// The format forbids holes between tensors, so alignment comes from the order instead: the data
// is laid out by descending element size (8, 4, 2, 1 bytes), which starts every tensor at a
// multiple of its own element size. Used by `mla run --dump` and by tests that need a checkpoint.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mla/tensor.hpp"

namespace mla::safetensors {

// The format's dtype tag: BF16, F16, F32, F64, F8_E4M3, I32, I64, U8.
const char* dtype_tag(DType dt);

class Writer {
 public:
  // Copies a host view (any strides) into the file's buffer as a contiguous tensor of its shape.
  // A rank-0 view is not representable by TensorView: use add_scalar.
  void add(const std::string& name, const TensorView& host);
  // Copies raw little-endian bytes: numel(shape) * dtype_size(dtype) of them.
  void add_bytes(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* bytes);
  // A shape-[] f32 tensor (per-tensor scales).
  void add_scalar(const std::string& name, float value);
  // Free-form string metadata ("__metadata__" in the header).
  void set_metadata(const std::string& key, const std::string& value);

  // Writes the file; mla::Error names the path on an I/O failure.
  void write(const std::string& path) const;
  // The whole file in memory (what write() stores).
  std::vector<uint8_t> serialize() const;

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mla::safetensors
