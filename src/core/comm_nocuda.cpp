// The CUDA communicators in a build without CUDA (MLA_CUDA=OFF): they report that clearly.
// The real ones live in src/cuda/comm/ (compiled only with MLA_CUDA).
#if !MLA_WITH_CUDA
#include <memory>

#include "core/dcp_runner.hpp"
#include "mla/comm.hpp"
#include "mla/error.hpp"

namespace mla {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  detail::fail(what, ": this build of mla-decode has no CUDA (configure with -DMLA_CUDA=ON)");
}
}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cuda_thread_group(int, int) { no_cuda("make_cuda_thread_group"); }
NcclId nccl_unique_id() { no_cuda("nccl_unique_id"); }
std::unique_ptr<Communicator> make_nccl_communicator(const NcclId&, int, int, int, size_t) {
  no_cuda("make_nccl_communicator");
}
std::unique_ptr<Communicator> wrap_nccl_communicator(void*, int, size_t) { no_cuda("wrap_nccl_communicator"); }

namespace detail {
std::shared_ptr<void> make_rank_stream(int) { no_cuda("make_rank_stream"); }
void sync_rank_stream(void*, int) {}
}  // namespace detail

}  // namespace mla
#endif
