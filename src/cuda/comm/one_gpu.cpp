// W DCP ranks as threads sharing ONE GPU (mla::make_cuda_thread_group): every rank pulls its
// peers' slabs with device-to-device cudaMemcpy2DAsync on its own stream. Cross-stream events
// keep it stream-ordered without a host sync:
//   record ready on my stream; publish; barrier; wait on every peer's ready; copy; record done;
//   barrier; wait on every peer's done (so nothing later on my stream overwrites my send buffer
//   while a peer's copies may still read it).
// Re-recording an event is safe: a peer's cudaStreamWaitEvent captures the event's state when
// it is called, and every wait on my ready/done events is issued before the next barrier I pass.
// The copies read peers' buffers in place: no staging, so a step allocates nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/dcp_runner.hpp"
#include "cpu/thread_comm.hpp"
#include "cuda/check.hpp"
#include "cuda/handles.hpp"
#include "mla/comm.hpp"

namespace mla {
namespace detail {
namespace {

class CudaThreadCommunicator final : public Communicator, public GroupMember {
 public:
  CudaThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank, int device)
      : group_(std::move(group)), rank_(rank), device_(device), ready_(make_event()), done_(make_event()),
        peer_done_(size_t(group_->size())) {}
  ~CudaThreadCommunicator() override {
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
  }

  int size() const override { return group_->size(); }
  int rank() const override { return rank_; }
  Device device() const override { return Device::cuda; }
  int device_index() const override { return device_; }
  bool can_block(void* stream) const override { return cuda::stream_can_block(stream); }
  ThreadGroup& group() override { return *group_; }

  void all_gather_host(const void* send, void* recv, size_t bytes) override {
    RankSlot& mine = publish(CollectiveOp::all_gather_host);
    mine.host_send = send;
    mine.host_bytes = bytes;
    guarded([&] { group_->barrier(); });
    // Every rank reads the same slots, so all throw alike here and the group stays usable.
    group_->check_same_call(CollectiveOp::all_gather_host, "all_gather_host");
    guarded([&] {
      for (int q = 0; q < size(); ++q)
        std::copy_n(static_cast<const char*>(group_->slot(q).host_send), bytes, static_cast<char*>(recv) + q * bytes);
      group_->barrier();
    });
  }

 protected:
  void do_all_gather_rows(const GatherRows& a, void* stream) override {
    publish(CollectiveOp::all_gather_rows).gather = a;
    exchange("all_gather_rows", CollectiveOp::all_gather_rows, stream, [&](int q, const RankSlot& peer, cudaStream_t s) {
      char* dst = static_cast<char*>(a.recv) + q * a.chunk_bytes;
      if (dst == peer.gather.send && a.recv_stride == peer.gather.send_stride) return;  // in place
      copy_rows(dst, a.recv_stride, peer.gather.send, peer.gather.send_stride, a.rows, a.chunk_bytes, s);
    });
  }

  void do_all_to_all_rows(const ExchangeRows& a, void* stream) override {
    publish(CollectiveOp::all_to_all_rows).exchange = a;
    exchange("all_to_all_rows", CollectiveOp::all_to_all_rows, stream, [&](int q, const RankSlot& peer, cudaStream_t s) {
      copy_rows(static_cast<char*>(a.recv) + q * a.recv_block_stride, a.recv_stride,
                static_cast<const char*>(peer.exchange.send) + rank_ * a.chunk_bytes, peer.exchange.send_stride,
                a.rows, a.chunk_bytes, s);
    });
  }

 private:
  static cudaEvent_t make_event() {
    cudaEvent_t e = nullptr;
    MLA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  static void copy_rows(void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t rows,
                        int64_t bytes, cudaStream_t s) {
    if (rows == 0 || bytes == 0) return;
    // A single row may come with any stride; cudaMemcpy2DAsync wants pitches >= the width.
    MLA_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(std::max(dst_stride, bytes)), src, size_t(std::max(src_stride, bytes)),
                                     size_t(bytes), size_t(rows), cudaMemcpyDeviceToDevice, s));
  }

  RankSlot& publish(CollectiveOp op) {
    RankSlot& s = group_->slot(rank_);
    s = RankSlot{};
    s.op = op;
    s.ready = ready_;
    s.done = done_;
    return s;
  }

  // A failure between the barriers would leave the peers waiting: abort the group first (a no-op
  // when it is already aborted, which keeps the first reason).
  template <class Fn>
  void guarded(Fn fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      group_->abort(e.what());
      throw;
    }
  }

  template <class Pull>
  void exchange(const char* name, CollectiveOp op, void* stream, Pull pull) {
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    cuda::DeviceGuard guard(device_);
    guarded([&] {
      MLA_CUDA_CHECK(cudaEventRecord(ready_, s));
      group_->barrier();
    });
    group_->check_same_call(op, name);  // all ranks throw alike: no abort
    guarded([&] {
      for (int q = 0; q < size(); ++q)
        if (q != rank_) MLA_CUDA_CHECK(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(group_->slot(q).ready), 0));
      for (int q = 0; q < size(); ++q) pull(q, group_->slot(q), s);
      // The slots are only stable until the second barrier (a peer past it publishes its next
      // collective): take the peers' done events now.
      for (int q = 0; q < size(); ++q) peer_done_[q] = static_cast<cudaEvent_t>(group_->slot(q).done);
      MLA_CUDA_CHECK(cudaEventRecord(done_, s));
      group_->barrier();
      for (int q = 0; q < size(); ++q)
        if (q != rank_) MLA_CUDA_CHECK(cudaStreamWaitEvent(s, peer_done_[q], 0));
    });
  }

  std::shared_ptr<ThreadGroup> group_;
  int rank_, device_;
  cudaEvent_t ready_, done_;
  std::vector<cudaEvent_t> peer_done_;  // [W] the peers' done events of the collective in flight
};

}  // namespace

std::shared_ptr<void> make_rank_stream(int device) {
  cuda::DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  MLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::shared_ptr<void>(s, [device](void* p) {
    cuda::DeviceGuard g(device);
    cudaStreamDestroy(static_cast<cudaStream_t>(p));
  });
}

void sync_rank_stream(void* stream, int device) {
  cuda::DeviceGuard guard(device);
  MLA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace detail

std::vector<std::unique_ptr<Communicator>> make_cuda_thread_group(int size, int device) {
  MLA_REQUIRE(size >= 1, "make_cuda_thread_group: size expected >= 1, got ", size);
  int count = 0;
  MLA_REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess && device >= 0 && device < count,
              "make_cuda_thread_group: device expected in [0, ", count, "), got ", device);
  cuda::DeviceGuard guard(device);
  auto group = std::make_shared<detail::ThreadGroup>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r)
    comms.push_back(std::make_unique<detail::CudaThreadCommunicator>(group, r, device));
  return comms;
}

}  // namespace mla
