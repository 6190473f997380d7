#include "cuda/gemm.hpp"

#include <tuple>

#include "cuda/check.hpp"

namespace mla::cuda {

// cuBLASLt is column-major: a row-major y [S, n] is a column-major [n, S] with leading dimension
// ldy, so y^T = w * x^T with w (column-major [k, n]) transposed and x^T (column-major [k, S]) as is.
struct Gemm::Plan {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

Gemm::Gemm(cublasLtHandle_t handle, int n, int k, size_t workspace_bytes, cudaDataType_t in_type,
           cudaDataType_t out_type)
    : handle_(handle), n_(n), k_(k), workspace_bytes_(workspace_bytes),
      in_type_(in_type), out_type_(out_type) {
  MLA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  MLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  MLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)));
}

Gemm::~Gemm() {
  plans_.clear();
  if (desc_) cublasLtMatmulDescDestroy(desc_);
}

Gemm::Plan& Gemm::plan(int s, int64_t ldx, int64_t ldy) {
  auto& slot = plans_[std::make_tuple(s, ldx, ldy)];
  if (slot) return *slot;
  auto p = std::make_unique<Plan>();
  MLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, in_type_, k_, n_, k_));
  MLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, in_type_, k_, s, ldx));
  MLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, out_type_, n_, s, ldy));
  cublasLtMatmulPreference_t pref = nullptr;
  MLA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof(workspace_bytes_));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, desc_, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  MLA_CUBLAS_CHECK(st);
  MLA_REQUIRE(found > 0, "cuBLASLt: no algorithm for [", s, ", ", k_, "] x [", n_, ", ", k_, "]^T");
  p->algo = result.algo;
  slot = std::move(p);
  return *slot;
}

void Gemm::prepare(int s, int64_t ldx, int64_t ldy) { plan(s, ldx, ldy); }

void Gemm::run(const void* x, int64_t ldx, const void* w, void* y, int64_t ldy, int s, cudaStream_t stream,
               void* workspace) {
  if (s == 0) return;
  Plan& p = plan(s, ldx, ldy);
  const float alpha = 1.0f, beta = 0.0f;
  MLA_CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                  workspace, workspace_bytes_, stream));
}

}  // namespace mla::cuda
