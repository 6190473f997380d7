// Device memory for mla::Tensor and the device query behind mla::cuda_available().
#include <cuda_runtime.h>

#include "core/backend.hpp"
#include "cuda/check.hpp"
#include "cuda/handles.hpp"

namespace mla::detail {

bool cuda_device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void* cuda_alloc(size_t bytes, int device_index) {
  cuda::DeviceGuard guard(device_index);
  void* p = nullptr;
  MLA_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void cuda_free(void* p, int device_index) {
  if (!p) return;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device_index);
  cudaFree(p);
  cudaSetDevice(prev);
}

void cuda_copy(void* dst, const void* src, size_t bytes) {
  MLA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

}  // namespace mla::detail
