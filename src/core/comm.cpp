// The shape checks every communicator shares (mla/comm.hpp); transports live in src/cpu and src/cuda/comm.
#include "mla/comm.hpp"

#include "mla/error.hpp"

namespace mla {

void Communicator::all_gather_rows(const GatherRows& a, void* stream) {
  const int64_t w = size();
  MLA_REQUIRE(a.rows >= 0 && a.chunk_bytes >= 0, "all_gather_rows: rows and chunk_bytes expected >= 0, got ",
              a.rows, " and ", a.chunk_bytes);
  // No early return for empty slabs: every rank must enter the collective, or its peers would wait.
  MLA_REQUIRE(a.rows * a.chunk_bytes == 0 || (a.send != nullptr && a.recv != nullptr), "all_gather_rows: send and recv must not be null");
  MLA_REQUIRE(a.rows <= 1 || a.send_stride >= a.chunk_bytes, "all_gather_rows: send_stride expected >= chunk_bytes = ",
              a.chunk_bytes, ", got ", a.send_stride);
  MLA_REQUIRE(a.rows <= 1 || a.recv_stride >= w * a.chunk_bytes, "all_gather_rows: recv_stride expected >= W*chunk_bytes = ",
              w * a.chunk_bytes, ", got ", a.recv_stride);
  do_all_gather_rows(a, stream);
}

void Communicator::all_to_all_rows(const ExchangeRows& a, void* stream) {
  const int64_t w = size();
  MLA_REQUIRE(a.rows >= 0 && a.chunk_bytes >= 0, "all_to_all_rows: rows and chunk_bytes expected >= 0, got ",
              a.rows, " and ", a.chunk_bytes);
  MLA_REQUIRE(a.rows * a.chunk_bytes == 0 || (a.send != nullptr && a.recv != nullptr), "all_to_all_rows: send and recv must not be null");
  MLA_REQUIRE(a.rows <= 1 || a.send_stride >= w * a.chunk_bytes, "all_to_all_rows: send_stride expected >= W*chunk_bytes = ",
              w * a.chunk_bytes, ", got ", a.send_stride);
  MLA_REQUIRE(a.rows <= 1 || a.recv_stride >= a.chunk_bytes, "all_to_all_rows: recv_stride expected >= chunk_bytes = ",
              a.chunk_bytes, ", got ", a.recv_stride);
  const int64_t block = (a.rows - 1) * a.recv_stride + a.chunk_bytes;
  MLA_REQUIRE(w == 1 || a.rows * a.chunk_bytes == 0 || a.recv_block_stride >= block, "all_to_all_rows: recv_block_stride expected >= ", block,
              " (a block's extent), got ", a.recv_block_stride);
  do_all_to_all_rows(a, stream);
}

}  // namespace mla
