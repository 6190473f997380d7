// The 16-row wgmma kernel's bf16 instance (kBf16: attend_wgmma_kernel.cuh, MLA_ATTEND_BF16_16ROW):
// a bf16 query and cache at the heights the many-rows kernels leave to the 16-row one (12-16 heads,
// qlen 1), over TMA boxes. A translation unit of its own, as attend_wgmma_q_split.cu and for the same
// reason: the fp8 instances' SASS, which the H200 figures measured, stays as it was.
#include "cuda/attend_wgmma_kernel.cuh"
#include "cuda/check.hpp"
#include "cuda/stages.hpp"
#include "cuda/tma.hpp"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

constexpr auto kBf16Kernel = attend_wgmma_kernel<2, 2, Tiles::kBoxes, false, false, false, true>;
constexpr int kBf16Smem = smem_bytes<2, Tiles::kBoxes, kN, true>();

}  // namespace

void prepare_attend_wgmma_bf16() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kBf16Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBf16Smem));
}

void launch_attend_wgmma_bf16(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream) {
  kBf16Kernel<<<attend_launch_grid(p, kN), kThreads, kBf16Smem, stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
