#pragma once
// Non-owning tensor views (data, dtype, shape, strides in elements, device) and an owning Tensor
// for host or device memory. Views are how every stage reads and writes: a stage never repacks.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace mla {

enum class DType : uint8_t { bf16, f16, f32, f64, fp8_e4m3, i32, i64, u8 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
const char* device_name(Device d);

inline constexpr int kMaxRank = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};  // in elements
  Device device = Device::cpu;
  int device_index = 0;

  // Row-major contiguous view.
  static TensorView contiguous(const void* data, DType dtype, std::span<const int64_t> shape,
                               Device device = Device::cpu, int device_index = 0);
  static TensorView contiguous(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu, int device_index = 0) {
    return contiguous(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), device,
                      device_index);
  }
  static TensorView strided(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> stride, Device device = Device::cpu,
                            int device_index = 0);

  bool defined() const { return rank > 0 || data != nullptr; }
  int64_t size(int d) const { return shape[d < 0 ? d + rank : d]; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Elements between the first and one past the last addressed element (0 when numel() == 0).
  int64_t extent() const;
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  // "bf16[16, 12, 576] stride [6912, 576, 1] cpu"
  std::string str() const;
};

// Owning buffer on the host or on a CUDA device, with a contiguous view of it.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType dtype, std::vector<int64_t> shape, Device device = Device::cpu,
                      int device_index = 0);
  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  void* data() const { return view_.data; }
  template <class T>
  T* ptr() const { return static_cast<T*>(view_.data); }
  size_t bytes() const { return bytes_; }
  // Copies all bytes of a contiguous src with the same byte count, across devices as needed.
  void copy_from(const TensorView& src);
  // A host copy of this tensor's bytes.
  Tensor to_host() const;

 private:
  std::shared_ptr<void> mem_;
  TensorView view_;
  size_t bytes_ = 0;
};

}  // namespace mla
