// The 16-row wgmma kernel's bf16-query instances (kQSplit: attend_wgmma_kernel.cuh, MLA_ATTEND_Q_SPLIT):
// a bf16 query over an fp8 cache's TMA boxes or bulk row copies, each query row split exactly into two e4m3 rows
// (core/query_split.hpp). A translation unit of its own: compiled beside the fp8 instances it
// changed their SASS (ptxas inlines the device code they share differently with one more caller),
// and the H200 figures in README.md hold for the SASS they measured.
#include "cuda/attend_wgmma_kernel.cuh"
#include "cuda/check.hpp"
#include "cuda/stages.hpp"
#include "cuda/tma.hpp"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

// TMA boxes (pages of 8+ rows, a power of two), and bulk row copies a key row (the other pages,
// v24: a producer warpgroup beside the consumer, q.k's K from registers).
constexpr auto kQSplitKernel = attend_wgmma_kernel<2, 2, Tiles::kBoxes, false, false, true>;
constexpr int kQSplitSmem = smem_bytes<2, Tiles::kBoxes, 2 * kN>();
constexpr auto kQSplitRowsKernel = attend_wgmma_kernel<2, 3, Tiles::kRows, false, false, true>;
constexpr int kQSplitRowsSmem = smem_bytes<2, Tiles::kRows, 2 * kN>();

}  // namespace

void prepare_attend_wgmma_q_split() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kQSplitKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kQSplitSmem));
  MLA_CUDA_CHECK(
      cudaFuncSetAttribute(kQSplitRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kQSplitRowsSmem));
}

void launch_attend_wgmma_q_split(const AttendParams& p, const CUtensorMap& map, bool tma, cudaStream_t stream) {
  if (tma) kQSplitKernel<<<attend_launch_grid(p, kN), kThreads, kQSplitSmem, stream>>>(p, map);
  else kQSplitRowsKernel<<<attend_launch_grid(p, kN), 2 * kThreads, kQSplitRowsSmem, stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
