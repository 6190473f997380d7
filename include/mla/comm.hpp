#pragma once
// Collectives for decode context parallelism (docs/dcp.md), with exactly what the layer needs.
// Both move 2-D row slabs (rows of bytes, a byte stride between rows) so that no stage repacks:
//
//   all_gather_rows  the query gather along heads: rank q's [S, N*576] slab lands at column
//                    q*N*576 of every rank's [S, G*576] query (G = N*W, rank-major heads, the row
//                    stride may span a head pad).
//   all_to_all_rows  the combine's exchange: column chunk p of each of my rows goes to rank p, and
//                    I receive W blocks [rows, chunk], block q from rank q. Rank r sends peer p the
//                    partials o[:, p*N:(p+1)*N, :] and lse[:, p*N:(p+1)*N] of p's heads; each rank
//                    receives W partials of its own N heads: the [splits, S, N, L] form post merges.
//
// Collectives are stream-ordered on the CUDA communicators (the stream is a cudaStream_t passed
// as void*; null is the default stream) and blocking on the CPU (the stream is ignored). Every
// rank must call the same collectives in the same order with the same rows and chunk_bytes.
// Buffers live on device(): host memory for the CPU, device memory for the CUDA communicators.
#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <vector>

#include "mla/tensor.hpp"

namespace mla {

// all_gather_rows' arguments (strides in bytes).
struct GatherRows {
  const void* send = nullptr;  // [rows, chunk_bytes], rows send_stride apart
  int64_t send_stride = 0;
  void* recv = nullptr;        // [rows, W*chunk_bytes], rows recv_stride apart: rank q's at column q*chunk_bytes
  int64_t recv_stride = 0;
  int64_t rows = 0;
  int64_t chunk_bytes = 0;
};

// all_to_all_rows' arguments (strides in bytes).
struct ExchangeRows {
  const void* send = nullptr;   // [rows, W*chunk_bytes], rows send_stride apart: chunk p goes to rank p
  int64_t send_stride = 0;
  void* recv = nullptr;         // [W, rows, chunk_bytes]: block q (from rank q) at recv + q*recv_block_stride
  int64_t recv_block_stride = 0;
  int64_t recv_stride = 0;      // between rows of a block
  int64_t rows = 0;
  int64_t chunk_bytes = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual Device device() const = 0;  // where the buffers of the collectives live
  virtual int device_index() const { return 0; }

  // Checks the slab shapes (mla::Error naming the field) and runs the collective. Rank r's own
  // chunk is copied locally. all_gather_rows may run in place (send = recv + rank*chunk_bytes with
  // the same stride: pre's query); otherwise recv must not overlap send.
  void all_gather_rows(const GatherRows& a, void* stream = nullptr);
  void all_to_all_rows(const ExchangeRows& a, void* stream = nullptr);

  // Host control data, blocking (not stream-ordered, not capturable in a CUDA graph): every rank
  // sends `bytes` bytes and receives [W, bytes], rank q's at recv + q*bytes. The layer uses it to
  // check, before anything is written, that all ranks run the same step.
  virtual void all_gather_host(const void* send, void* recv, size_t bytes) = 0;
  // Whether all_gather_host may run now: false while `stream` is being captured into a CUDA graph
  // (a blocking host exchange has no place in a graph; the layer then skips its step check).
  virtual bool can_block(void* stream) const { return true; }

 protected:
  virtual void do_all_gather_rows(const GatherRows& a, void* stream) = 0;
  virtual void do_all_to_all_rows(const ExchangeRows& a, void* stream) = 0;
};

// W ranks as threads of this process on the CPU: element r is rank r. Each communicator must be
// used by one thread. The shared group lives as long as any of its communicators; if a rank's
// thread fails, abort_thread_group() wakes the others, whose collectives then throw mla::Error.
std::vector<std::unique_ptr<Communicator>> make_thread_group(int size);

// W ranks as threads sharing ONE CUDA device (the whole GPU path of DCP on one GPU): each rank
// passes its own stream; collectives are device-to-device copies ordered by cross-stream events.
// Throws mla::Error in a build without CUDA.
std::vector<std::unique_ptr<Communicator>> make_cuda_thread_group(int size, int device = 0);

// Marks the group of a thread or CUDA-thread communicator failed: peers blocked in (or later
// entering) a collective throw instead of waiting forever. No-op for NCCL communicators.
void abort_thread_group(Communicator& comm);

// NCCL, one rank per GPU (processes or threads). ncclUniqueId's bytes, created on one rank with
// nccl_unique_id() and sent to the others by the caller. staging_bytes is reserved up front (the
// 2*W slabs of the largest all_to_all_rows; 0 picks 256 MiB) so that a step allocates nothing.
// NVLink multicast (NCCL_NVLS_ENABLE) is never enabled. Throws mla::Error without CUDA or NCCL.
struct NcclId {
  char bytes[128];  // NCCL_UNIQUE_ID_BYTES
};
NcclId nccl_unique_id();
std::unique_ptr<Communicator> make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                                                     size_t staging_bytes = 0);
// Wraps an ncclComm_t the caller owns (and keeps alive and destroys), passed as void*.
std::unique_ptr<Communicator> wrap_nccl_communicator(void* nccl_comm, int device, size_t staging_bytes = 0);

}  // namespace mla
