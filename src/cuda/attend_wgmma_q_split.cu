// The 16-row wgmma kernel's bf16-query instance (kQSplit: attend_wgmma_kernel.cuh, MLA_ATTEND_Q_SPLIT=1):
// a bf16 query over TMA boxes of an fp8 cache, each query row split exactly into two e4m3 rows
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

constexpr auto kQSplitKernel = attend_wgmma_kernel<2, 2, Tiles::kBoxes, false, false, true>;
constexpr int kQSplitSmem = smem_bytes<2, Tiles::kBoxes, 2 * kN>();

}  // namespace

void prepare_attend_wgmma_q_split() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kQSplitKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kQSplitSmem));
}

void launch_attend_wgmma_q_split(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream) {
  kQSplitKernel<<<attend_launch_grid(p, kN), kThreads, kQSplitSmem, stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
