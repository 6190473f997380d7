// DCP over NCCL, one rank per GPU (mla::make_nccl_communicator / wrap_nccl_communicator).
// NCCL moves contiguous buffers, the layer's slabs are strided (a head pad, a column of the
// gathered query): each collective packs into a staging buffer reserved at construction with
// cudaMemcpy2DAsync, runs one NCCL call (group), and unpacks, all on the caller's stream, so a
// step allocates nothing and the whole step can be captured in a CUDA graph.
// NVLink multicast stays off: NCCL_NVLS_ENABLE is forced to 0 before a communicator is made here
// (a wrapped communicator is the caller's: it must have been made with it off).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "cuda/check.hpp"
#include "cuda/handles.hpp"
#include "mla/comm.hpp"
#include "mla/error.hpp"

#if defined(MLA_WITH_NCCL) && MLA_WITH_NCCL
#include <nccl.h>
#endif

namespace mla {

#if defined(MLA_WITH_NCCL) && MLA_WITH_NCCL
namespace {

constexpr size_t kDefaultStaging = size_t(256) << 20;
constexpr size_t kHostBytes = 4096;  // the largest all_gather_host message

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, bool owned, int device, size_t staging_bytes)
      : comm_(comm), owned_(owned), device_(device) {
    cuda::DeviceGuard guard(device_);
    MLA_NCCL_CHECK(ncclCommCount(comm_, &size_));
    MLA_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    staging_ = cuda::DeviceBuffer(staging_bytes ? staging_bytes : kDefaultStaging);
    host_dev_ = cuda::DeviceBuffer(kHostBytes * (size_ + 1));
    MLA_CUDA_CHECK(cudaStreamCreateWithFlags(&host_stream_, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    cuda::DeviceGuard guard(device_);
    if (host_stream_) cudaStreamDestroy(host_stream_);
    if (owned_) ncclCommDestroy(comm_);
  }

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  Device device() const override { return Device::cuda; }
  int device_index() const override { return device_; }
  bool can_block(void* stream) const override { return cuda::stream_can_block(stream); }

  void all_gather_host(const void* send, void* recv, size_t bytes) override {
    MLA_REQUIRE(bytes <= kHostBytes, "all_gather_host: at most ", kHostBytes, " bytes, got ", bytes);
    cuda::DeviceGuard guard(device_);
    char* buf = host_dev_.get<char>();
    MLA_CUDA_CHECK(cudaMemcpyAsync(buf, send, bytes, cudaMemcpyHostToDevice, host_stream_));
    MLA_NCCL_CHECK(ncclAllGather(buf, buf + kHostBytes, bytes, ncclUint8, comm_, host_stream_));
    MLA_CUDA_CHECK(cudaMemcpyAsync(recv, buf + kHostBytes, bytes * size_, cudaMemcpyDeviceToHost, host_stream_));
    MLA_CUDA_CHECK(cudaStreamSynchronize(host_stream_));
  }

 protected:
  void do_all_gather_rows(const GatherRows& a, void* stream) override {
    const size_t slab = size_t(a.rows * a.chunk_bytes);
    if (slab == 0) return;
    need("all_gather_rows", (size_ + 1) * slab);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    cuda::DeviceGuard guard(device_);
    char* gathered = staging_.get<char>();  // [W, rows, chunk]
    char* packed = gathered + size_ * slab;  // [rows, chunk]
    copy_rows(packed, a.chunk_bytes, a.send, a.send_stride, a.rows, a.chunk_bytes, s);
    MLA_NCCL_CHECK(ncclAllGather(packed, gathered, slab, ncclUint8, comm_, s));
    for (int q = 0; q < size_; ++q)
      copy_rows(static_cast<char*>(a.recv) + q * a.chunk_bytes, a.recv_stride, gathered + q * slab, a.chunk_bytes,
                a.rows, a.chunk_bytes, s);
  }

  void do_all_to_all_rows(const ExchangeRows& a, void* stream) override {
    const size_t slab = size_t(a.rows * a.chunk_bytes);
    if (slab == 0) return;
    need("all_to_all_rows", 2 * size_ * slab);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    cuda::DeviceGuard guard(device_);
    char* out = staging_.get<char>();    // [W, rows, chunk]: block p for peer p
    char* in = out + size_ * slab;       // [W, rows, chunk]: block q from peer q
    const char* send = static_cast<const char*>(a.send);
    char* recv = static_cast<char*>(a.recv);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) copy_rows(out + p * slab, a.chunk_bytes, send + p * a.chunk_bytes, a.send_stride, a.rows, a.chunk_bytes, s);
    // One round: every pair exchanges its blocks at once.
    MLA_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MLA_NCCL_CHECK(ncclSend(out + p * slab, slab, ncclUint8, p, comm_, s));
      MLA_NCCL_CHECK(ncclRecv(in + p * slab, slab, ncclUint8, p, comm_, s));
    }
    MLA_NCCL_CHECK(ncclGroupEnd());
    copy_rows(recv + rank_ * a.recv_block_stride, a.recv_stride, send + rank_ * a.chunk_bytes, a.send_stride, a.rows,
              a.chunk_bytes, s);
    for (int q = 0; q < size_; ++q)
      if (q != rank_)
        copy_rows(recv + q * a.recv_block_stride, a.recv_stride, in + q * slab, a.chunk_bytes, a.rows, a.chunk_bytes, s);
  }

 private:
  void need(const char* what, size_t bytes) const {
    MLA_REQUIRE(bytes <= staging_.bytes(), what, ": needs ", bytes, " bytes of staging, the communicator reserved ",
                staging_.bytes(), " (raise staging_bytes)");
  }

  static void copy_rows(void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t rows, int64_t bytes,
                        cudaStream_t s) {
    if (dst == src && dst_stride == src_stride) return;
    MLA_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(std::max(dst_stride, bytes)), src, size_t(std::max(src_stride, bytes)),
                                     size_t(bytes), size_t(rows), cudaMemcpyDeviceToDevice, s));
  }

  ncclComm_t comm_;
  bool owned_;
  int device_;
  int size_ = 0, rank_ = 0;
  cuda::DeviceBuffer staging_, host_dev_;
  cudaStream_t host_stream_ = nullptr;
};

}  // namespace

NcclId nccl_unique_id() {
  static_assert(sizeof(NcclId) == sizeof(ncclUniqueId));
  ncclUniqueId id;
  MLA_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                                                     size_t staging_bytes) {
  MLA_REQUIRE(size >= 1 && rank >= 0 && rank < size, "make_nccl_communicator: rank expected in [0, ", size,
              "), got ", rank);
  // Never NVLink multicast (docs/dcp.md). Once per process, before any rank's init reads the
  // environment: setenv racing with another thread's getenv is undefined.
  static std::once_flag nvls_off;
  std::call_once(nvls_off, [] { setenv("NCCL_NVLS_ENABLE", "0", 1); });
  cuda::DeviceGuard guard(device);
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes, sizeof(nid.internal));
  ncclComm_t comm = nullptr;
  MLA_NCCL_CHECK(ncclCommInitRank(&comm, size, nid, rank));
  try {
    return std::make_unique<NcclCommunicator>(comm, true, device, staging_bytes);
  } catch (...) {
    ncclCommDestroy(comm);
    throw;
  }
}

std::unique_ptr<Communicator> wrap_nccl_communicator(void* nccl_comm, int device, size_t staging_bytes) {
  MLA_REQUIRE(nccl_comm != nullptr, "wrap_nccl_communicator: nccl_comm must not be null");
  return std::make_unique<NcclCommunicator>(static_cast<ncclComm_t>(nccl_comm), false, device, staging_bytes);
}

#else  // built without nccl.h / libnccl

NcclId nccl_unique_id() { detail::fail("nccl_unique_id: this build of mla-decode has no NCCL"); }
std::unique_ptr<Communicator> make_nccl_communicator(const NcclId&, int, int, int, size_t) {
  detail::fail("make_nccl_communicator: this build of mla-decode has no NCCL");
}
std::unique_ptr<Communicator> wrap_nccl_communicator(void*, int, size_t) {
  detail::fail("wrap_nccl_communicator: this build of mla-decode has no NCCL");
}

#endif

}  // namespace mla
