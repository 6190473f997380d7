#include "cpu/gemm.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

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
  // OpenBLAS runs single-threaded inside our OpenMP threads, each on blocks of weight rows: one
  // thread pool only. With OpenBLAS's own pthreads, they and the OpenMP workers (spinning
  // between regions) fought over the cores, and a third of the time went to spinning.
  openblas_set_num_threads(1);
  // Up to this many rows of a, blocked sgemv: sgemm packs every weight row for a sliver of work
  // (measured: at S = 1, 2, 4, 8 sgemv ran 3x, 2x, 1.3x, 1x sgemm's rate). Per block of weight
  // rows small enough to stay in L2, the first token reads them from memory, the others from L2.
  constexpr int64_t kGemvMaxRows = 8;
  constexpr int64_t kGemvBlockRows = 16;  // 16 rows of D = 7168 fp32: 458 KB
  // Blocks handed out dynamically: a thread that is descheduled on a busy machine does not
  // hold the others at the barrier. Results do not depend on which thread takes a block.
  const int64_t chunk = m <= kGemvMaxRows ? 4 * kGemvBlockRows : 256;
  const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t ci = 0; ci < chunks; ++ci) {
    const int64_t n0 = ci * chunk, n1 = std::min(n, n0 + chunk);
    if (m <= kGemvMaxRows) {
      for (int64_t r0 = n0; r0 < n1; r0 += kGemvBlockRows) {
        const int64_t rows = std::min(kGemvBlockRows, n1 - r0);
        for (int64_t token = 0; token < m; ++token)
          cblas_sgemv(CblasRowMajor, CblasNoTrans, blasint(rows), blasint(k), 1.0f, b + r0 * k, blasint(k),
                      a + token * lda, 1, 0.0f, c + token * ldc + r0, 1);
      }
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(n1 - n0), blasint(k), 1.0f, a,
                  blasint(lda), b + n0 * k, blasint(k), 0.0f, c + n0, blasint(ldc));
    }
  }
}

}  // namespace mla::cpu
