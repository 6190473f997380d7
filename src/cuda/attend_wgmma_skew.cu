// The 16-row wgmma kernel's default TMA instance with the fixed splits skewed toward the CTAs placed
// first on their SMs (kSkew: skew_plan.hpp, MLA_ATTEND_SKEW=1, s33a). A translation unit of its own
// so that the default instances in attend_wgmma.cu keep the SASS README's H200 figures measured
// (one more caller of their shared device code changed ptxas's inlining in session 32).
#include <atomic>

#include "cuda/attend_wgmma_kernel.cuh"
#include "cuda/check.hpp"
#include "cuda/stages.hpp"
#include "cuda/tma.hpp"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

constexpr auto kSkewKernel = attend_wgmma_kernel<2, 2, Tiles::kBoxes, false, true, false, false, true>;
constexpr int kSkewSmem = smem_bytes<2, Tiles::kBoxes>();
std::atomic<int64_t> launches{0};

}  // namespace

int64_t attend_skew_launches() { return launches.load(); }
void count_attend_skew_launch() { ++launches; }

void prepare_attend_wgmma_skew() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kSkewKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSkewSmem));
}

void launch_attend_wgmma_skew(const AttendParams& p, const CUtensorMap& map, dim3 grid, cudaStream_t stream) {
  kSkewKernel<<<grid, kThreads, kSkewSmem, stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
  ++launches;
}

}  // namespace mla::cuda
