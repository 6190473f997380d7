// The bf16-query split probe (query_split_probe.hpp): SplitQueryTile's load and store in one CTA,
// the shared-memory tile and exponents copied out.
#include "cuda/attend_wgmma_tiles.cuh"
#include "cuda/check.hpp"
#include "cuda/fast_div.hpp"
#include "cuda/query_split_probe.hpp"
#include "cuda/stages.hpp"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

constexpr int kTileBytes = 2 * kN * kRow;

__global__ void __launch_bounds__(kThreads) query_split_probe_kernel(const __grid_constant__ AttendParams p, int b,
                                                                       int m_base, uint8_t* tile, int32_t* exps) {
  __shared__ __align__(128) uint8_t q[kTileBytes];
  __shared__ int32_t q_exp[kN];
  const int tid = threadIdx.x;
  for (int i = tid; i < kTileBytes; i += kThreads) q[i] = 0xA5;  // (every byte must be written)
  __syncthreads();
  SplitQueryTile<> query;
  query.load(p, b, m_base, p.heads * p.qlen, tid);
  query.store(q, q_exp, tid);
  __syncthreads();
  for (int i = tid; i < kTileBytes; i += kThreads) tile[i] = q[i];
  if (tid < kN) exps[tid] = q_exp[tid];
}

}  // namespace

void query_split_probe(const AttendParams& in, int b, int m_base, uint8_t* tile, int32_t* exps, cudaStream_t stream) {
  MLA_REQUIRE(!in.q_fp8 && in.heads >= 1 && in.qlen >= 1, "query split probe: a bf16 query, heads and qlen >= 1");
  AttendParams p = in;
  p.heads_magic = div_magic(uint32_t(p.heads));
  query_split_probe_kernel<<<1, kThreads, 0, stream>>>(p, b, m_base, tile, exps);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
