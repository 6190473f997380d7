#include "cpu/gemm.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "mla/error.hpp"
#include "mla/formats.hpp"

#if MLA_WITH_ONEDNN  // CMake defines it where it found oneDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace mla::cpu {

namespace {

bool forced_openblas() {
  const char* env = std::getenv("MLA_CPU_GEMM");
  return env != nullptr && std::string_view(env) == "openblas";
}

std::vector<float> widen(const uint16_t* bf16, int64_t count, int threads) {
  std::vector<float> f(static_cast<size_t>(count));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) f[size_t(i)] = bf16_to_float(bf16[i]);
  return f;
}

#if MLA_WITH_ONEDNN
using dnnl::memory;
using Tag = memory::format_tag;
using DT = memory::data_type;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN (Debian's build uses OpenMP) sizes its parallel regions from omp_get_max_threads() of
// the calling thread, both when it plans a primitive and when it runs one: set it to our thread
// count for the duration, and put back what the caller had. Our own regions always name their
// thread count, so they are not affected either way.
class OmpThreads {
 public:
  explicit OmpThreads(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(std::max(threads, 1)); }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

// bf16 [m, k] x bf16 [k, n] -> f32 [m, n], the weights in whatever layout oneDNN prefers.
dnnl::matmul::primitive_desc matmul_desc(int64_t m, int64_t n, int64_t k) {
  const memory::desc a({m, k}, DT::bf16, Tag::ab);
  const memory::desc b({k, n}, DT::bf16, Tag::any);
  const memory::desc c({m, n}, DT::f32, Tag::ab);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), cpu_engine());
}

// A reference implementation ("ref:any") is correct but orders of magnitude slower than
// OpenBLAS: oneDNN picks one where the CPU lacks the instructions of its fast bf16 kernels.
bool is_reference_impl(const dnnl::matmul::primitive_desc& pd) {
  return std::string_view(pd.impl_info_str()).rfind("ref", 0) == 0;
}
#endif  // MLA_WITH_ONEDNN

}  // namespace

#if MLA_WITH_ONEDNN

// The weights in oneDNN's layout and the primitives made so far, one per (m, threads): making a
// primitive JIT-compiles its kernels (milliseconds), so a decode loop makes each one once.
struct DenseMatrix::OneDnn {
  memory::desc weights_desc;  // the layout the primitive for m = 1 asked for
  memory weights;             // b in that layout
  // Layouts other primitives asked for, if any (none on the CPUs tried: the layout depends on
  // n and k only), reordered from `weights` on first use.
  std::vector<std::pair<memory::desc, memory>> other_layouts;

  struct Prepared {
    dnnl::matmul primitive;
    memory weights;
  };
  std::map<std::pair<int64_t, int>, Prepared> prepared;  // by (m, threads)
  std::mutex mutex;

  // The primitive for m rows of a on `threads` threads, made on first use.
  Prepared get(int64_t m, int64_t n, int64_t k, int threads) {
    std::lock_guard lock(mutex);
    const auto key = std::make_pair(m, threads);
    if (auto it = prepared.find(key); it != prepared.end()) return it->second;
    const OmpThreads omp(threads);
    try {
      const auto pd = matmul_desc(m, n, k);
      Prepared p{.primitive = dnnl::matmul(pd), .weights = weights_for(pd.weights_desc())};
      prepared.emplace(key, p);
      return p;
    } catch (const dnnl::error& e) {  // made for m = 1 already: not expected
      detail::fail("DenseMatrix: oneDNN cannot make the bf16 matmul [", m, ", ", k, "] x [", k, ", ", n,
                   "]: ", e.what());
    }
  }

  memory weights_for(const memory::desc& desc) {
    if (desc == weights_desc) return weights;
    for (const auto& [d, mem] : other_layouts)
      if (d == desc) return mem;
    memory mem(desc, cpu_engine());
    dnnl::stream stream(cpu_engine());
    dnnl::reorder(weights, mem).execute(stream, weights, mem);
    stream.wait();
    other_layouts.emplace_back(desc, mem);
    return mem;
  }
};
#else
struct DenseMatrix::OneDnn {};  // never made: no oneDNN in this build
#endif  // MLA_WITH_ONEDNN

GemmPath choose_gemm_path(GemmPath preferred) {
  if (preferred == GemmPath::openblas || forced_openblas()) return GemmPath::openblas;
#if MLA_WITH_ONEDNN
  try {
    return is_reference_impl(matmul_desc(1, 64, 64)) ? GemmPath::openblas : GemmPath::onednn;
  } catch (const dnnl::error&) {
    return GemmPath::openblas;  // no bf16 matmul on this CPU
  }
#else
  return GemmPath::openblas;
#endif
}

DenseMatrix::DenseMatrix() = default;
DenseMatrix::DenseMatrix(DenseMatrix&&) noexcept = default;
DenseMatrix& DenseMatrix::operator=(DenseMatrix&&) noexcept = default;
DenseMatrix::~DenseMatrix() = default;

DenseMatrix::DenseMatrix(const uint16_t* b, int64_t n, int64_t k, int threads, GemmPath preferred)
    : n_(n), k_(k) {
  MLA_REQUIRE(n >= 0 && k >= 0, "DenseMatrix: shape: expected n, k >= 0, got n = ", n, ", k = ", k);
  threads = std::max(threads, 1);
#if MLA_WITH_ONEDNN
  if (n > 0 && k > 0 && choose_gemm_path(preferred) == GemmPath::onednn) {
    try {
      const OmpThreads omp(threads);
      const auto pd = matmul_desc(1, n, k);
      if (!is_reference_impl(pd)) {
        auto state = std::make_unique<OneDnn>();
        state->weights_desc = pd.weights_desc();
        state->weights = memory(state->weights_desc, cpu_engine());
        // b [n, k] row-major is the matmul's weights [k, n] in the transposed plain layout.
        memory plain(memory::desc({k, n}, DT::bf16, Tag::ba), cpu_engine(), const_cast<uint16_t*>(b));
        dnnl::stream stream(cpu_engine());
        dnnl::reorder(plain, state->weights).execute(stream, plain, state->weights);
        stream.wait();
        onednn_ = std::move(state);
        return;
      }
    } catch (const dnnl::error&) {
      // No bf16 matmul for this shape here: the openblas path below.
    }
  }
#endif
  fp32_ = widen(b, n * k, threads);
}

void DenseMatrix::multiply(const float* a, int64_t lda, int64_t m, float* c, int64_t ldc, int threads) const {
  if (m == 0 || n_ == 0) return;
  threads = std::max(threads, 1);
  if (!onednn_) {
    matmul_nt(a, lda, m, k_, fp32_.data(), n_, c, ldc, threads);
    return;
  }
#if MLA_WITH_ONEDNN
  // a as bf16 (exact: its values are bf16 values), and c dense [m, n] for the primitive.
  std::vector<uint16_t> a_bf16(size_t(m * k_));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k_; ++j) a_bf16[size_t(i * k_ + j)] = float_to_bf16(a[i * lda + j]);
  std::vector<float> c_dense;
  float* c_out = c;
  if (ldc != n_) {
    c_dense.resize(size_t(m * n_));
    c_out = c_dense.data();
  }
  const OneDnn::Prepared p = onednn_->get(m, n_, k_, threads);
  const memory a_mem(memory::desc({m, k_}, DT::bf16, Tag::ab), cpu_engine(), a_bf16.data());
  const memory c_mem(memory::desc({m, n_}, DT::f32, Tag::ab), cpu_engine(), c_out);
  {
    const OmpThreads omp(threads);
    dnnl::stream stream(cpu_engine());  // per call: a stream is not shared between threads
    p.primitive.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, p.weights}, {DNNL_ARG_DST, c_mem}});
    stream.wait();
  }
  if (ldc != n_)
    for (int64_t i = 0; i < m; ++i) std::copy_n(&c_dense[size_t(i * n_)], n_, c + i * ldc);
#endif
}

DenseWeights DenseWeights::from(const LayerConfig& cfg, const PreparedWeights& w, int threads, GemmPath preferred) {
  const int64_t D = cfg.hidden, Rq = cfg.q_lora_rank, rows = cfg.qkv_a_rows();
  const int64_t q_rows = int64_t(cfg.heads()) * cfg.qk_head_dim();
  return DenseWeights{.qkv_a = DenseMatrix(w.qkv_a.data(), rows, D, threads, preferred),
                      .q_b = DenseMatrix(w.q_b.data(), q_rows, Rq, threads, preferred)};
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
