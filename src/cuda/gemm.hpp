#pragma once
// Dense products through cuBLASLt: y [S, n] = x [S, k] @ w [n, k]^T with row-major bf16 operands,
// fp32 accumulation and a bf16 result (pre's qkv_a and q_b projections). The algorithm for each S
// is chosen once (heuristic) and cached, so a step only enqueues the matmul; the workspace is the
// backend's (its mla::Workspace, passed at every run: a shared one may move).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <memory>

namespace mla::cuda {

class Gemm {
 public:
  // a_type/b_type: CUDA_R_16BF (or CUDA_R_8F_E4M3 for the fp8 ceiling); out: CUDA_R_16BF.
  // workspace_bytes: the cuBLASLt workspace every run gets (the algorithms are chosen within it).
  Gemm(cublasLtHandle_t handle, int n, int k, size_t workspace_bytes,
       cudaDataType_t in_type = CUDA_R_16BF, cudaDataType_t out_type = CUDA_R_16BF);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x [s, k] row stride ldx, w [n, k] contiguous, y [s, n] row stride ldy (elements); workspace:
  // workspace_bytes of device memory for this run.
  void run(const void* x, int64_t ldx, const void* w, void* y, int64_t ldy, int s, cudaStream_t stream,
           void* workspace);
  // Chooses (and caches) the algorithm for s rows now, e.g. at construction, so that the first
  // step runs no heuristic query.
  void prepare(int s, int64_t ldx, int64_t ldy);

 private:
  struct Plan;
  Plan& plan(int s, int64_t ldx, int64_t ldy);

  cublasLtHandle_t handle_;
  int n_, k_;
  size_t workspace_bytes_;
  cudaDataType_t in_type_, out_type_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  std::map<std::tuple<int, int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
};

}  // namespace mla::cuda
