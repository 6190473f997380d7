#include "cpu/gemm.hpp"

#include <cblas.h>

#include "mla/formats.hpp"

namespace mla::cpu {

namespace {
std::vector<float> widen(const std::vector<uint16_t>& bf16, int threads) {
  std::vector<float> f(bf16.size());
  const int64_t n = int64_t(bf16.size());
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) f[i] = bf16_to_float(bf16[i]);
  return f;
}
}  // namespace

DenseWeights DenseWeights::from(const LayerConfig& cfg, const PreparedWeights& w, int threads) {
  return DenseWeights{.qkv_a = widen(w.qkv_a, threads), .q_b = widen(w.q_b, threads)};
}

void matmul_nt(const float* a, int64_t lda, int64_t m, int64_t k, const float* b, int64_t n, float* c,
               int64_t ldc, int threads) {
  if (m == 0 || n == 0) return;
  openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(n), blasint(k), 1.0f, a,
              blasint(lda), b, blasint(k), 0.0f, c, blasint(ldc));
}

}  // namespace mla::cpu
