#pragma once
// The rendezvous shared by W ranks that are threads of one process: a barrier that can be
// aborted and a slot per rank where each publishes its collective's arguments. The CPU
// ThreadCommunicator (thread_comm.cpp) and the one-GPU CUDA communicator (src/cuda/comm) both
// pull their peers' data through it: publish, barrier, copy from every peer, barrier (so that no
// rank reuses its send buffer while a peer still reads it).
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mla/comm.hpp"

namespace mla::detail {

enum class CollectiveOp : uint8_t { none, all_gather_rows, all_to_all_rows, all_gather_host };

// One rank's published arguments.
struct RankSlot {
  CollectiveOp op = CollectiveOp::none;
  GatherRows gather{};
  ExchangeRows exchange{};
  const void* host_send = nullptr;
  size_t host_bytes = 0;
  void* ready = nullptr;  // CUDA: event marking this rank's send data ready on its stream
  void* done = nullptr;   // CUDA: event marking this rank's reads of its peers' buffers done
};

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(size) {}
  int size() const { return size_; }

  RankSlot& slot(int rank) { return slots_[rank]; }
  // Waits until all ranks arrive; throws mla::Error if the group is or becomes aborted.
  void barrier();
  // Wakes every waiter; their barriers (and all later ones) throw with `why`.
  void abort(const std::string& why);
  // Call between the two barriers of a collective: unless all ranks published `op` with the same
  // rows and chunk sizes, waits for every rank to reach the same verdict (they all read the same
  // slots, which stay unchanged until all have passed this barrier) and throws mla::Error on all.
  void check_same_call(CollectiveOp op, const char* name);

 private:
  const int size_;
  std::vector<RankSlot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
};

// Implemented by the thread-group communicators so that abort_thread_group() can reach the group.
class GroupMember {
 public:
  virtual ~GroupMember() = default;
  virtual ThreadGroup& group() = 0;
};

}  // namespace mla::detail
