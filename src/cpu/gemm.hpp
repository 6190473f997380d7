#pragma once
// Dense products of the CPU backend: c[m, n] = a[m, k] @ b[n, k]^T with a bf16 weight matrix b,
// fp32 accumulation, fp32 result. At decode sizes (m = S = 1..8 tokens) they are memory-bound on
// the weights, so the weights stay bf16:
//   onednn:   a oneDNN matmul, bf16 x bf16 -> f32 (brgemm on AVX512-BF16 / AMX), the weights
//             reordered once into the blocked layout oneDNN asks for; a primitive per (m, threads).
//   openblas: OpenBLAS sgemv / sgemm on an fp32 copy of the weights (this Debian OpenBLAS has no
//             bf16 sbgemm): the fallback where oneDNN has no bf16 kernel for this CPU.
// The environment variable MLA_CPU_GEMM=openblas forces the fallback (read when a matrix is made).
#include <cstdint>
#include <memory>
#include <vector>

#include "mla/weights.hpp"

namespace mla::cpu {

enum class GemmPath { onednn, openblas };

// Which path a matrix built with `preferred` takes: openblas if asked for (argument or
// MLA_CPU_GEMM=openblas), else onednn where oneDNN has a non-reference bf16 matmul here.
GemmPath choose_gemm_path(GemmPath preferred = GemmPath::onednn);

// One bf16 weight matrix b [n, k] (row-major, as PreparedWeights holds qkv_a and q_b).
class DenseMatrix {
 public:
  DenseMatrix();
  // Copies (onednn: reorders; openblas: widens) b; `threads` OpenMP threads do it.
  DenseMatrix(const uint16_t* b, int64_t n, int64_t k, int threads, GemmPath preferred = GemmPath::onednn);
  DenseMatrix(DenseMatrix&&) noexcept;
  DenseMatrix& operator=(DenseMatrix&&) noexcept;
  ~DenseMatrix();

  // c[m, n] (row stride ldc) = a[m, k] (row stride lda) @ b^T on `threads` OpenMP threads. a's
  // values must be bf16 values (pre's are: hidden and the normed q_c): the onednn path reads a
  // as bf16. Call it outside OpenMP regions. Deterministic: the same inputs and threads give
  // bit-identical c. Safe to call from several threads at once.
  void multiply(const float* a, int64_t lda, int64_t m, float* c, int64_t ldc, int threads) const;

  GemmPath path() const { return onednn_ ? GemmPath::onednn : GemmPath::openblas; }
  int64_t rows() const { return n_; }
  int64_t cols() const { return k_; }

 private:
  struct OneDnn;  // gemm.cpp: the reordered weights and the primitives made so far
  int64_t n_ = 0, k_ = 0;
  std::unique_ptr<OneDnn> onednn_;  // null: the openblas path
  std::vector<float> fp32_;         // openblas: b widened to fp32
};

// The dense weights of a layer, made once by the CPU backend.
struct DenseWeights {
  DenseMatrix qkv_a;  // [Rq + L + R + gate_dim, D]
  DenseMatrix q_b;    // [N*(P+R), Rq]

  static DenseWeights from(const LayerConfig& cfg, const PreparedWeights& w, int threads,
                           GemmPath preferred = GemmPath::onednn);
};

// The openblas path on its own: c[m, n] = a[m, k] @ b[n, k]^T, fp32, leading dimensions lda,
// ldb = k, ldc. `threads` OpenMP threads run single-threaded OpenBLAS calls on blocks of b's
// rows (so this sets OpenBLAS's own thread count to 1). Call it outside OpenMP regions.
void matmul_nt(const float* a, int64_t lda, int64_t m, int64_t k, const float* b, int64_t n, float* c,
               int64_t ldc, int threads);

}  // namespace mla::cpu
