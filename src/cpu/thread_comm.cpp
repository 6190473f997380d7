// W DCP ranks as threads on the CPU (mla::make_thread_group): collectives are blocking memcpys
// pulled from the peers' buffers through a shared ThreadGroup.
#include "cpu/thread_comm.hpp"

#include <cstring>
#include <memory>

#include "mla/error.hpp"

namespace mla {
namespace detail {

void ThreadGroup::barrier() {
  std::unique_lock<std::mutex> lock(mu_);
  MLA_REQUIRE(!aborted_, "dcp thread group aborted: ", why_);
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  MLA_REQUIRE(generation_ != gen, "dcp thread group aborted: ", why_);
}

void ThreadGroup::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) why_ = why;
  aborted_ = true;
  cv_.notify_all();
}

void ThreadGroup::check_same_call(CollectiveOp op, const char* name) {
  // Every rank compares every slot with rank 0's, so all ranks reach the same verdict.
  std::string error;
  const RankSlot& s0 = slots_[0];
  for (int q = 0; q < size_ && error.empty(); ++q) {
    const RankSlot& s = slots_[q];
    if (s.op != op || s0.op != op) {
      error = std::string(name) + ": ranks called different collectives (rank " + std::to_string(q) + " is not in " + name + ")";
      break;
    }
    const bool same = op == CollectiveOp::all_gather_rows
                          ? s.gather.rows == s0.gather.rows && s.gather.chunk_bytes == s0.gather.chunk_bytes
                      : op == CollectiveOp::all_to_all_rows
                          ? s.exchange.rows == s0.exchange.rows && s.exchange.chunk_bytes == s0.exchange.chunk_bytes
                          : s.host_bytes == s0.host_bytes;
    if (!same) error = std::string(name) + ": rank " + std::to_string(q) + " passed other rows or chunk_bytes than rank 0";
  }
  if (error.empty()) return;
  barrier();  // no rank republishes its slot before every rank has read the slots
  throw Error(error);
}

namespace {

// Copies rows x bytes between two strided slabs.
// An in-place gather (src == dst: my own chunk already sits in my recv) copies nothing.
void copy_rows(void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t rows, int64_t bytes) {
  if (dst == src && dst_stride == src_stride) return;
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(dst) + i * dst_stride, static_cast<const char*>(src) + i * src_stride, bytes);
}

class ThreadCommunicator final : public Communicator, public GroupMember {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int size() const override { return group_->size(); }
  int rank() const override { return rank_; }
  Device device() const override { return Device::cpu; }
  ThreadGroup& group() override { return *group_; }

  void all_gather_host(const void* send, void* recv, size_t bytes) override {
    RankSlot& mine = publish(CollectiveOp::all_gather_host);
    mine.host_send = send;
    mine.host_bytes = bytes;
    exchange("all_gather_host", CollectiveOp::all_gather_host, [&](int q, const RankSlot& peer) {
      std::memcpy(static_cast<char*>(recv) + q * bytes, peer.host_send, bytes);
    });
  }

 protected:
  void do_all_gather_rows(const GatherRows& a, void*) override {
    publish(CollectiveOp::all_gather_rows).gather = a;
    exchange("all_gather_rows", CollectiveOp::all_gather_rows, [&](int q, const RankSlot& peer) {
      copy_rows(static_cast<char*>(a.recv) + q * a.chunk_bytes, a.recv_stride, peer.gather.send,
                peer.gather.send_stride, a.rows, a.chunk_bytes);
    });
  }

  void do_all_to_all_rows(const ExchangeRows& a, void*) override {
    publish(CollectiveOp::all_to_all_rows).exchange = a;
    exchange("all_to_all_rows", CollectiveOp::all_to_all_rows, [&](int q, const RankSlot& peer) {
      // Peer q's column chunk for me (chunk rank_) becomes my block q.
      copy_rows(static_cast<char*>(a.recv) + q * a.recv_block_stride, a.recv_stride,
                static_cast<const char*>(peer.exchange.send) + rank_ * a.chunk_bytes, peer.exchange.send_stride,
                a.rows, a.chunk_bytes);
    });
  }

 private:
  RankSlot& publish(CollectiveOp op) {
    RankSlot& s = group_->slot(rank_);
    s = RankSlot{};
    s.op = op;
    return s;
  }

  // Barrier, check, pull from every rank (own included), barrier: the second barrier keeps every
  // rank's send buffer alive and unchanged until all peers have read it.
  template <class Pull>
  void exchange(const char* name, CollectiveOp op, Pull pull) {
    group_->barrier();
    group_->check_same_call(op, name);
    for (int q = 0; q < size(); ++q) pull(q, group_->slot(q));
    group_->barrier();
  }

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
};

}  // namespace
}  // namespace detail

std::vector<std::unique_ptr<Communicator>> make_thread_group(int size) {
  MLA_REQUIRE(size >= 1, "make_thread_group: size expected >= 1, got ", size);
  auto group = std::make_shared<detail::ThreadGroup>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<detail::ThreadCommunicator>(group, r));
  return comms;
}

void abort_thread_group(Communicator& comm) {
  if (auto* m = dynamic_cast<detail::GroupMember*>(&comm)) m->group().abort("a rank's thread failed");
}

}  // namespace mla
