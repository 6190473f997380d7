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

// kRowsN = kN (the 16-row kernel's form: hi rows 0..15, lo rows 16..31 of one 32-row tile) or 32 (the
// many-rows kernel's kQSplit: kLoBlock, the lo tile after the hi one), kRowsN x 8 threads.
template <int kRowsN, bool kLoBlock>
__global__ void __launch_bounds__(kRowsN * 8) query_split_probe_kernel(const __grid_constant__ AttendParams p, int b,
                                                                         int m_base, uint8_t* tile, int32_t* exps) {
  constexpr int kTileBytes = 2 * kRowsN * kRow, kThreadsN = kRowsN * 8;
  __shared__ __align__(128) uint8_t q[kTileBytes];
  __shared__ int32_t q_exp[kRowsN];
  const int tid = threadIdx.x;
  for (int i = tid; i < kTileBytes; i += kThreadsN) q[i] = 0xA5;  // (every byte must be written)
  __syncthreads();
  SplitQueryTile<kRowsN, kThreadsN, kLoBlock> query;
  query.load(p, b, m_base, p.heads * p.qlen, tid);
  query.store(q, q_exp, tid);
  __syncthreads();
  for (int i = tid; i < kTileBytes; i += kThreadsN) tile[i] = q[i];
  if (tid < kRowsN) exps[tid] = q_exp[tid];
}

}  // namespace

void query_split_probe(const AttendParams& in, int b, int m_base, uint8_t* tile, int32_t* exps, cudaStream_t stream,
                       int rows) {
  MLA_REQUIRE(!in.q_fp8 && in.heads >= 1 && in.qlen >= 1, "query split probe: a bf16 query, heads and qlen >= 1");
  MLA_REQUIRE(rows == kN || rows == kAttendRowsQSplitCta, "query split probe: rows ", kN, " or ", kAttendRowsQSplitCta,
              ", got ", rows);
  AttendParams p = in;
  p.heads_magic = div_magic(uint32_t(p.heads));
  if (rows == kN) query_split_probe_kernel<kN, false><<<1, kN * 8, 0, stream>>>(p, b, m_base, tile, exps);
  else
    query_split_probe_kernel<kAttendRowsQSplitCta, true>
        <<<1, kAttendRowsQSplitCta * 8, 0, stream>>>(p, b, m_base, tile, exps);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
