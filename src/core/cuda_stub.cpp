// Compiled only when MLA_CUDA is OFF: the CUDA entry points report that CUDA is not built in.
#include "core/backend.hpp"
#include "mla/error.hpp"

namespace mla::detail {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail(what, ": this build of mla-decode has no CUDA backend (configure with -DMLA_CUDA=ON)");
}
}  // namespace

std::unique_ptr<BackendImpl> make_cuda_backend(const LayerConfig&, const PreparedWeights&,
                                               const LayerOptions&) {
  no_cuda("Backend::cuda");
}
bool cuda_device_present() { return false; }
void* cuda_alloc(size_t, int) { no_cuda("Tensor::empty(Device::cuda)"); }
void cuda_free(void*, int) {}
void cuda_copy(void*, const void*, size_t) { no_cuda("Tensor::copy_from"); }

}  // namespace mla::detail
