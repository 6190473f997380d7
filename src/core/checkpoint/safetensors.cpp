#include "core/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mla/error.hpp"

namespace mla::safetensors {

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests three deep ({ name: { shape: [ ). Deeper input is rejected before
// nlohmann-json sees it, so hostile nesting cannot exhaust the stack.
constexpr int kMaxDepth = 16;

int max_nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

int dtype_elem_size(std::string_view tag) {
  static constexpr struct {
    std::string_view tag;
    int size;
  } kTags[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
               {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
               {"I64", 8},  {"U64", 8}, {"F64", 8}};
  for (const auto& t : kTags)
    if (t.tag == tag) return t.size;
  return 0;
}

int64_t TensorInfo::numel() const {
  // parse_header checked that the product of the non-zero dimensions fits.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

const TensorInfo* Header::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parse_header(std::span<const uint8_t> file, std::string_view what) {
  MLA_REQUIRE(file.size() >= 8, "safetensors '", what, "': truncated file: ", file.size(),
              " bytes, expected at least 8 (the header length)");
  const uint64_t n = read_u64_le(file.data());
  MLA_REQUIRE(n <= kMaxHeaderBytes, "safetensors '", what, "': header length ", n, " exceeds the limit of ",
              kMaxHeaderBytes, " bytes");
  MLA_REQUIRE(n <= file.size() - 8, "safetensors '", what, "': header length ", n, " runs past the end of the ",
              file.size(), "-byte file (at most ", file.size() - 8, " possible)");
  MLA_REQUIRE(n >= 2, "safetensors '", what, "': header length ", n, " is too short for a JSON object");

  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), size_t(n));
  MLA_REQUIRE(max_nesting(text) <= kMaxDepth, "safetensors '", what, "': header nests deeper than ", kMaxDepth,
              " levels");
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  MLA_REQUIRE(!j.is_discarded(), "safetensors '", what, "': header is not valid JSON");
  MLA_REQUIRE(j.is_object(), "safetensors '", what, "': header must be a JSON object, got ", j.type_name());

  Header h;
  h.data_offset = 8 + n;
  h.data_size = file.size() - h.data_offset;
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      MLA_REQUIRE(entry.is_object(), "safetensors '", what, "': __metadata__ must be an object, got ",
                  entry.type_name());
      for (const auto& [k, v] : entry.items()) {
        MLA_REQUIRE(v.is_string(), "safetensors '", what, "': __metadata__['", k, "'] must be a string, got ",
                    v.type_name());
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    MLA_REQUIRE(entry.is_object(), "safetensors '", what, "': tensor '", name, "' must be an object, got ",
                entry.type_name());
    TensorInfo t;
    t.name = name;

    const auto dt = entry.find("dtype");
    MLA_REQUIRE(dt != entry.end() && dt->is_string(), "safetensors '", what, "': tensor '", name,
                "' has no string 'dtype'");
    t.dtype = dt->get<std::string>();
    t.elem_size = dtype_elem_size(t.dtype);
    MLA_REQUIRE(t.elem_size > 0, "safetensors '", what, "': tensor '", name, "' has unknown dtype '", t.dtype,
                "'");

    const auto shape = entry.find("shape");
    MLA_REQUIRE(shape != entry.end() && shape->is_array(), "safetensors '", what, "': tensor '", name,
                "' has no 'shape' array");
    // The element count must fit in int64 and its byte count in uint64: checked as it grows.
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : *shape) {
      MLA_REQUIRE(d.is_number_unsigned(), "safetensors '", what, "': tensor '", name,
                  "' has a shape entry that is not a non-negative integer: ", d.dump());
      const uint64_t v = d.get<uint64_t>();
      MLA_REQUIRE(v <= uint64_t(std::numeric_limits<int64_t>::max()), "safetensors '", what, "': tensor '", name,
                  "' has a dimension too large: ", v);
      t.shape.push_back(int64_t(v));
      if (v == 0) numel = 0;
      else if (numel > uint64_t(std::numeric_limits<int64_t>::max()) / v) overflow = true;
      else numel *= v;
    }
    if (numel == 0) overflow = false;  // a zero dimension anywhere makes the tensor empty
    MLA_REQUIRE(!overflow && numel <= std::numeric_limits<uint64_t>::max() / uint64_t(t.elem_size),
                "safetensors '", what, "': tensor '", name, "' shape ", t.shape_str(),
                " has an element count that overflows");

    const auto off = entry.find("data_offsets");
    MLA_REQUIRE(off != entry.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
                    (*off)[1].is_number_unsigned(),
                "safetensors '", what, "': tensor '", name,
                "' needs 'data_offsets' as two non-negative integers, got ",
                off == entry.end() ? std::string("nothing") : off->dump());
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    MLA_REQUIRE(t.begin <= t.end, "safetensors '", what, "': tensor '", name, "' has data_offsets [", t.begin,
                ", ", t.end, ") that end before they begin");
    MLA_REQUIRE(t.end <= h.data_size, "safetensors '", what, "': tensor '", name, "' has data_offsets [",
                t.begin, ", ", t.end, ") outside the data section of ", h.data_size, " bytes");
    const uint64_t want = numel * uint64_t(t.elem_size);
    MLA_REQUIRE(t.bytes() == want, "safetensors '", what, "': tensor '", name, "' is ", t.dtype, t.shape_str(),
                " = ", want, " bytes, but its data_offsets [", t.begin, ", ", t.end, ") hold ", t.bytes());
    h.tensors.push_back(std::move(t));
  }

  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  // Empty tensors occupy no bytes and overlap nothing.
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.bytes() == 0) continue;
    MLA_REQUIRE(prev == nullptr || t.begin >= prev->end, "safetensors '", what, "': tensors '", prev->name,
                "' [", prev->begin, ", ", prev->end, ") and '", t.name, "' [", t.begin, ", ", t.end,
                ") overlap");
    prev = &t;
  }
  return h;
}

File::File(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MLA_REQUIRE(fd >= 0, "safetensors: cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    detail::fail("safetensors: '", path, "' is not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    MLA_REQUIRE(p != MAP_FAILED, "safetensors: cannot map '", path, "' (", size_, " bytes): ", std::strerror(err));
    map_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  try {
    header_ = parse_header({map_, size_}, path);
  } catch (...) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    map_ = nullptr;
    throw;
  }
}

File::~File() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

std::span<const uint8_t> File::bytes(const TensorInfo& t) const {
  return {map_ + header_.data_offset + t.begin, size_t(t.bytes())};
}

}  // namespace mla::safetensors
