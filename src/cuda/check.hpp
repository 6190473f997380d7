#pragma once
// One generic check (ggml's CUDA_CHECK_GEN): a failed CUDA, cuBLAS or NCCL call throws mla::Error
// naming the expression, its error string, file and line. Library code never exits.
#include <cublasLt.h>
#include <cuda_runtime.h>
#if defined(MLA_WITH_NCCL) && MLA_WITH_NCCL
#include <nccl.h>
#endif

#include "mla/error.hpp"

namespace mla::cuda {

inline const char* status_string(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* status_string(cublasStatus_t s) { return cublasGetStatusString(s); }
#if defined(MLA_WITH_NCCL) && MLA_WITH_NCCL
inline const char* status_string(ncclResult_t r) { return ncclGetErrorString(r); }
#endif

template <class Status>
void check_status(Status status, Status success, const char* expr, const char* file, int line) {
  if (status != success)
    detail::fail(expr, " failed: ", status_string(status), " (", int(status), ") at ", file, ":", line);
}

}  // namespace mla::cuda

#define MLA_CHECK_GEN(expr, success) ::mla::cuda::check_status((expr), (success), #expr, __FILE__, __LINE__)
#define MLA_CUDA_CHECK(expr) MLA_CHECK_GEN(expr, cudaSuccess)
#define MLA_CUBLAS_CHECK(expr) MLA_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS)
#define MLA_NCCL_CHECK(expr) MLA_CHECK_GEN(expr, ncclSuccess)
// After a kernel launch: configuration errors surface here, not at the next sync.
#define MLA_CUDA_CHECK_LAUNCH() MLA_CUDA_CHECK(cudaGetLastError())
