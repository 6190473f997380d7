#pragma once
// A reader of .safetensors files (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length n, n bytes of JSON {name: {dtype, shape, data_offsets}, __metadata__},
// then the data section the offsets index into.
//
// parse_header() trusts nothing: every way a header can lie about the bytes that follow (length
// past the end, offsets outside the data or overlapping, a shape whose byte count disagrees with
// its range, an unknown dtype) is its own mla::Error, so that a bad file can never become an
// out-of-bounds read. It depends on nothing but nlohmann-json and mla/error.hpp, so the fuzz
// target (fuzz/) builds it alone.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mla::safetensors {

struct TensorInfo {
  std::string name;
  std::string dtype;           // the format's tag: "BF16", "F8_E4M3", ...
  int elem_size = 0;           // bytes per element of dtype
  std::vector<int64_t> shape;  // [] is a scalar
  uint64_t begin = 0, end = 0; // byte range [begin, end) within the data section

  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
  std::string shape_str() const;  // "[576, 7168]"
};

struct Header {
  std::vector<TensorInfo> tensors;              // in file order of their data
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
  uint64_t data_offset = 0;                     // 8 + header length: where the data section starts
  uint64_t data_size = 0;                       // bytes of the data section

  const TensorInfo* find(std::string_view name) const;
};

// Bytes per element of a dtype tag, 0 when the tag is not one the format defines.
int dtype_elem_size(std::string_view tag);

// Parses and validates the header of a whole file held in `file` (header and data). `what` names
// the file in error messages.
Header parse_header(std::span<const uint8_t> file, std::string_view what);

// A read-only memory map of one .safetensors file with its parsed header.
class File {
 public:
  explicit File(const std::string& path);  // mla::Error when it cannot be opened or is malformed
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const TensorInfo* find(std::string_view name) const { return header_.find(name); }
  // The tensor's bytes (inside the map: valid while this File lives).
  std::span<const uint8_t> bytes(const TensorInfo& t) const;

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  Header header_;
};

}  // namespace mla::safetensors
