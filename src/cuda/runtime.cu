// PLACEHOLDER (owned by the CUDA backend work): device memory for mla::Tensor; the backend throws.
#include <cuda_runtime.h>

#include "core/backend.hpp"
#include "mla/error.hpp"

namespace mla::detail {

bool cuda_device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void* cuda_alloc(size_t bytes, int device_index) {
  void* p = nullptr;
  MLA_REQUIRE(cudaSetDevice(device_index) == cudaSuccess, "cuda_alloc: no CUDA device ", device_index);
  const cudaError_t e = cudaMalloc(&p, bytes);
  MLA_REQUIRE(e == cudaSuccess, "cuda_alloc(", bytes, " bytes): ", cudaGetErrorString(e));
  return p;
}

void cuda_free(void* p, int) { cudaFree(p); }

void cuda_copy(void* dst, const void* src, size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  MLA_REQUIRE(e == cudaSuccess, "cuda_copy(", bytes, " bytes): ", cudaGetErrorString(e));
}

std::unique_ptr<BackendImpl> make_cuda_backend(const LayerConfig&, const PreparedWeights&, const LayerOptions&) {
  fail("Backend::cuda: not implemented yet");
}

}  // namespace mla::detail
