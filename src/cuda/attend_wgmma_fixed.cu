// s73a (session 70; the default since session 71; MLA_ATTEND_FIXED_ONLY=0 turns it off): the 16-row kernel's default
// TMA instances (FastDivs, plain and skewed) and its bulk row copies' 3-step one, for launches of fixed splits, without
// the flat plan's code (kFixedOnly: serve_segments' `flat` a constant false). Why: those instances jump over ~13 KB of the
// flat plan's scan between their entry and their first boxes or row copies, and the graph bench's CTAs start with
// that code not in their SM's instruction caches; bench/ifetch_probe.cu's hops (session 70, H100) put a cold forward
// jump of 16 KB at ~0.22-0.32 µs (straight-line code cold: ~43 ns a KB more than warm). Without it the skewed
// instance's first UTMALDG comes at 0x2090 instead of 0x7720 (3800 instructions instead of 5256, no spills) and the
// row copies' first UBLKCP at 0xcdb0 instead of 0x15f30 (4016 instead of 6064, no local loads instead of 14). A
// translation unit of its own (as attend_wgmma_skew.cu) so that attend_wgmma.cu's instances keep their SASS.
// Timed in session 71 (H100 GPU-0cf6be93, 4 rounds each, docs/attention.md's versions table): B = 1 5%, A at page 1
// 3.9%, 128K at page 1 5.6%, B64 at page 1 2.2%, A, B64, C 0.5-0.6%, 128K and B 0.3% faster; the prologue's
// plan and key range 0.64-1.06 µs instead of 1.29-1.64 (its stamps).
#include <atomic>

#include "cuda/attend_wgmma_kernel.cuh"
#include "cuda/check.hpp"
#include "cuda/stages.hpp"
#include "cuda/tma.hpp"

namespace mla::cuda {
namespace {

using namespace wgmma_attend;

constexpr auto kFixedKernel = attend_wgmma_kernel<2, 2, Tiles::kBoxes, false, true, false, false, false, true>;
constexpr auto kFixedSkewKernel = attend_wgmma_kernel<2, 2, Tiles::kBoxes, false, true, false, false, true, true>;
// (the plain one's stamped twin, MLA_ATTEND_TIMELINE: its prologue's steps)
constexpr auto kFixedTimelineKernel = attend_wgmma_kernel<2, 2, Tiles::kBoxes, true, true, false, false, false, true>;
constexpr int kFixedSmem = smem_bytes<2, Tiles::kBoxes>();
// The bulk row copies' instance (3-step q.k groups; pages TMA does not box, page 1 among them): its producer
// warpgroup jumped over its own copy of the flat plan's scan.
constexpr auto kFixedRowsKernel = attend_wgmma_kernel<2, 3, Tiles::kRows, false, false, false, false, false, true>;
constexpr int kFixedRowsSmem = smem_bytes<2, Tiles::kRows>();
std::atomic<int64_t> launches{0};

void require_fixed_splits(const AttendParams& p) {
  MLA_REQUIRE(p.flat_ctas == 0, "attend: the fixed-split instances take no flat plan, got ", p.flat_ctas, " key-CTAs");
}

}  // namespace

int64_t attend_fixed_launches() { return launches.load(); }

bool attend_fixed_only_enabled() {
  static const bool on = env_choice("MLA_ATTEND_FIXED_ONLY", {{"0", 0}, {"1", 1}}, 1) == 1;
  return on;
}

void prepare_attend_wgmma_fixed() {
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kFixedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFixedSmem));
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kFixedSkewKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFixedSmem));
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kFixedTimelineKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFixedSmem));
  MLA_CUDA_CHECK(cudaFuncSetAttribute(kFixedRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFixedRowsSmem));
}

void launch_attend_wgmma_fixed(const AttendParams& p, const CUtensorMap& map, dim3 grid, bool skew,
                               cudaStream_t stream) {
  require_fixed_splits(p);
  if (skew) kFixedSkewKernel<<<grid, kThreads, kFixedSmem, stream>>>(p, map);
  else kFixedKernel<<<grid, kThreads, kFixedSmem, stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
  ++launches;
  if (skew) count_attend_skew_launch();
}

void launch_attend_wgmma_fixed_rows(const AttendParams& p, const CUtensorMap& map, dim3 grid, cudaStream_t stream) {
  require_fixed_splits(p);
  kFixedRowsKernel<<<grid, 2 * kThreads, kFixedRowsSmem, stream>>>(p, map);
  MLA_CUDA_CHECK_LAUNCH();
  ++launches;
}

void launch_attend_wgmma_fixed_timeline(const AttendParams& p, const CUtensorMap& map, dim3 grid, cudaStream_t stream) {
  require_fixed_splits(p);
  kFixedTimelineKernel<<<grid, kThreads, kFixedSmem, stream>>>(p, map);
}

}  // namespace mla::cuda
