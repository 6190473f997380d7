#include "mla/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/backend.hpp"
#include "mla/error.hpp"

namespace mla {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::bf16: case DType::f16: return 2;
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
    case DType::fp8_e4m3: case DType::u8: return 1;
  }
  detail::fail("dtype_size: unknown dtype ", int(dt));
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

TensorView TensorView::contiguous(const void* data, DType dtype, std::span<const int64_t> shape,
                                  Device device, int device_index) {
  MLA_REQUIRE(shape.size() >= 1 && shape.size() <= size_t(kMaxRank), "TensorView: rank must be 1..",
              kMaxRank, ", got ", shape.size());
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  v.rank = int(shape.size());
  v.device = device;
  v.device_index = device_index;
  int64_t s = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.stride[d] = s;
    s *= shape[d];
  }
  return v;
}

TensorView TensorView::strided(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> stride, Device device, int device_index) {
  MLA_REQUIRE(shape.size() == stride.size(), "TensorView::strided: ", shape.size(), " sizes but ",
              stride.size(), " strides");
  TensorView v = contiguous(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()),
                            device, device_index);
  int d = 0;
  for (int64_t st : stride) v.stride[d++] = st;
  return v;
}

int64_t TensorView::numel() const {
  if (rank == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != s) return false;
    s *= shape[d];
  }
  return true;
}

int64_t TensorView::extent() const {
  if (numel() == 0) return 0;
  int64_t e = 1;
  for (int d = 0; d < rank; ++d) e += (shape[d] - 1) * stride[d];
  return e;
}

std::string TensorView::str() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int d = 0; d < rank; ++d) os << (d ? ", " : "") << shape[d];
  os << "] stride [";
  for (int d = 0; d < rank; ++d) os << (d ? ", " : "") << stride[d];
  os << "] " << device_name(device);
  return os.str();
}

Tensor Tensor::empty(DType dtype, std::vector<int64_t> shape, Device device, int device_index) {
  Tensor t;
  int64_t n = 1;
  for (int64_t s : shape) {
    MLA_REQUIRE(s >= 0, "Tensor::empty: negative size ", s);
    n *= s;
  }
  t.bytes_ = size_t(n) * dtype_size(dtype);
  const size_t alloc = t.bytes_ ? t.bytes_ : 1;
  if (device == Device::cpu) {
    // 64-byte alignment: whole cache lines for the threads and vector loads.
    void* p = std::aligned_alloc(64, (alloc + 63) / 64 * 64);
    MLA_REQUIRE(p != nullptr, "Tensor::empty: out of host memory for ", t.bytes_, " bytes");
    t.mem_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    void* p = detail::cuda_alloc(alloc, device_index);
    t.mem_ = std::shared_ptr<void>(p, [device_index](void* q) { detail::cuda_free(q, device_index); });
  }
  t.view_ = TensorView::contiguous(t.mem_.get(), dtype, shape, device, device_index);
  return t;
}

void Tensor::copy_from(const TensorView& src) {
  const size_t src_bytes = size_t(src.numel()) * dtype_size(src.dtype);
  MLA_REQUIRE(src.is_contiguous(), "Tensor::copy_from: src must be contiguous, got ", src.str());
  MLA_REQUIRE(src_bytes == bytes_, "Tensor::copy_from: expected ", bytes_, " bytes, got ", src_bytes);
  if (bytes_ == 0) return;
  if (src.device == Device::cpu && view_.device == Device::cpu)
    std::memcpy(view_.data, src.data, bytes_);
  else
    detail::cuda_copy(view_.data, src.data, bytes_);
}

Tensor Tensor::to_host() const {
  std::vector<int64_t> shape(view_.shape.begin(), view_.shape.begin() + view_.rank);
  Tensor h = empty(view_.dtype, shape, Device::cpu);
  h.copy_from(view_);
  return h;
}

}  // namespace mla
