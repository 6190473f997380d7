#pragma once
// Dense products of the CPU backend: OpenBLAS sgemm on fp32 copies of the bf16 weights, made
// once when the layer is built (this Debian OpenBLAS has no bf16 sbgemm). At decode sizes
// (S = 1..8 rows) these products are memory-bound on the weights.
#include <cstdint>
#include <vector>

#include "mla/weights.hpp"

namespace mla::cpu {

// fp32 copies of the prepared bf16 weights that go through sgemm.
struct DenseWeights {
  std::vector<float> qkv_a;  // [Rq + L + R + gate_dim, D]
  std::vector<float> q_b;    // [N*(P+R), Rq]

  static DenseWeights from(const LayerConfig& cfg, const PreparedWeights& w, int threads);
};

// c[m, n] = a[m, k] @ b[n, k]^T, row-major with leading dimensions lda, ldb = k, ldc; fp32
// accumulation. `threads` OpenMP threads run single-threaded OpenBLAS calls on blocks of b's rows
// (so this sets OpenBLAS's own thread count to 1). Call it outside OpenMP regions.
void matmul_nt(const float* a, int64_t lda, int64_t m, int64_t k, const float* b, int64_t n, float* c,
               int64_t ldc, int threads);

}  // namespace mla::cpu
