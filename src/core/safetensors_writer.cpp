#include "core/safetensors_writer.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mla/error.hpp"

namespace mla::safetensors {

const char* dtype_tag(DType dt) {
  switch (dt) {
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::fp8_e4m3: return "F8_E4M3";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  detail::fail("safetensors: no tag for dtype ", int(dt));
}

void Writer::add(const std::string& name, const TensorView& host) {
  MLA_REQUIRE(host.device == Device::cpu, "safetensors::Writer::add: '", name, "' must be a host view, got ",
              host.str());
  MLA_REQUIRE(host.rank >= 1, "safetensors::Writer::add: '", name, "' has rank 0");
  std::vector<int64_t> shape(host.shape.begin(), host.shape.begin() + host.rank);
  const size_t es = dtype_size(host.dtype);
  const int64_t n = host.numel();
  std::vector<uint8_t> bytes(size_t(n) * es);
  if (host.is_contiguous()) {
    if (n > 0) std::memcpy(bytes.data(), host.data, bytes.size());
  } else {
    // Walk the logical index row-major and gather through the strides.
    const auto* base = static_cast<const uint8_t*>(host.data);
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, off = 0;
      for (int d = host.rank - 1; d >= 0; --d) {
        off += (rem % host.shape[d]) * host.stride[d];
        rem /= host.shape[d];
      }
      std::memcpy(bytes.data() + size_t(i) * es, base + off * int64_t(es), es);
    }
  }
  tensors_[name] = Entry{host.dtype, std::move(shape), std::move(bytes)};
}

void Writer::add_bytes(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* bytes) {
  int64_t n = 1;
  for (int64_t s : shape) {
    MLA_REQUIRE(s >= 0, "safetensors::Writer::add_bytes: '", name, "' has a negative size ", s);
    n *= s;
  }
  const size_t nbytes = size_t(n) * dtype_size(dtype);
  std::vector<uint8_t> copy(nbytes);
  if (nbytes) std::memcpy(copy.data(), bytes, nbytes);
  tensors_[name] = Entry{dtype, std::move(shape), std::move(copy)};
}

void Writer::add_scalar(const std::string& name, float value) { add_bytes(name, DType::f32, {}, &value); }

void Writer::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

std::vector<uint8_t> Writer::serialize() const {
  // Data order: descending element size, then name, so every tensor is aligned to its element.
  std::vector<const std::pair<const std::string, Entry>*> order;
  for (const auto& kv : tensors_) order.push_back(&kv);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return dtype_size(a->second.dtype) > dtype_size(b->second.dtype);
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  size_t offset = 0;
  for (const auto* kv : order) {
    const Entry& e = kv->second;
    header[kv->first] = {{"dtype", dtype_tag(e.dtype)},
                         {"shape", e.shape},
                         {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned

  std::vector<uint8_t> file(8 + text.size() + offset);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) file[i] = uint8_t(n >> (8 * i));  // little-endian u64
  std::memcpy(file.data() + 8, text.data(), text.size());
  uint8_t* data = file.data() + 8 + text.size();
  for (const auto* kv : order) {
    const auto& bytes = kv->second.bytes;
    if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
    data += bytes.size();
  }
  return file;
}

void Writer::write(const std::string& path) const {
  const std::vector<uint8_t> file = serialize();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  MLA_REQUIRE(out.good(), "safetensors::Writer::write: cannot open '", path, "' for writing");
  out.write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
  out.close();
  MLA_REQUIRE(!out.fail(), "safetensors::Writer::write: writing '", path, "' failed");
}

}  // namespace mla::safetensors
