// The many-rows kernel's bf16-query instances (kQSplit: attend_rows_kernel.cuh; s35, the default since
// session 37, MLA_ROWS_Q_SPLIT=0 turns it off): a bf16 query over an fp8 cache at the many-rows
// heights, each query row split exactly into two e4m3 rows (core/query_split.hpp) whose q.k runs as
// 36 k32 steps against the same keys, in 32-row CTAs (the split query tile twice the fp8 one: 48 and
// 64 rows pass 227 KB of shared memory). The 16-row kernel's split (MLA_ROWS_Q_SPLIT=0) reads every
// key tile once a 16-row tile (D 594.7 us against the fp8 query's 234.5: session 34, H200); here once
// a 32-row tile (H100, session 37: D 386 us against the 16-row split's 585, F 197 against 300). A translation unit of its own, as attend_wgmma_q_split.cu: beside the fp8
// instances it could change their SASS, and the H200 figures hold for the SASS they measured.
#include "cuda/attend_rows_kernel.cuh"
#include "cuda/check.hpp"
#include "cuda/stages.hpp"
#include "cuda/tma.hpp"

namespace mla::cuda {
namespace {

// Boxes of whole pages (8+ rows), of 2 and 4 rows, and of one row (page 1: their rows four at a time
// through shared memory, the tensor map's address warp-uniform), as the fp8 query's 32-row
// instances (attend_rows.cu: kTmaKernel, kSmallPageKernel, kPage1Kernel), q.k split by tile.
template <bool kSmallBoxes, int kAhead, bool kMapUniform>
constexpr auto kQSplitRowsKernel =
    attend_rows_kernel<true, kAttendRowsQSplitCta, kSmallBoxes, kAhead, false, kMapUniform, true, 0, true>;
constexpr int kQSplitRowsSmem = rows_smem_bytes<kAttendRowsQSplitCta, true>();

}  // namespace

void prepare_attend_rows_q_split() {
  prepare_rows_kernel<kQSplitRowsKernel<false, 1, false>, kAttendRowsQSplitCta, true>();
  prepare_rows_kernel<kQSplitRowsKernel<true, 1, false>, kAttendRowsQSplitCta, true>();
  prepare_rows_kernel<kQSplitRowsKernel<true, 4, true>, kAttendRowsQSplitCta, true>();
}

void launch_attend_rows_q_split(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream) {
  const dim3 grid = attend_launch_grid(p, kAttendRowsQSplitCta);
  constexpr int threads = kRowsCtaThreads<true>;
  if (p.page_size == 1)
    kQSplitRowsKernel<true, 4, true><<<grid, threads, kQSplitRowsSmem, stream>>>(p, map);
  else if (p.page_size < kFp8SmallPage)
    kQSplitRowsKernel<true, 1, false><<<grid, threads, kQSplitRowsSmem, stream>>>(p, map);
  else
    kQSplitRowsKernel<false, 1, false><<<grid, threads, kQSplitRowsSmem, stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
