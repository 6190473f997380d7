#pragma once
// Decode context parallelism (DCP): which rank holds a token (SPEC.md, "DCP: which rank holds a
// token"). W ranks share each request's KV cache: global position p lives on rank (p / I) % W at
// local index (p / (I*W)) * I + p % I, I the interleave. The index math is header-inline and
// usable from CUDA device code (MLA_HD under nvcc); the slot mapping of a step is host code.
//
//   DcpInfo d{.size = 4, .rank = 1, .interleave = 16};
//   dcp::owner(d, p) == d.rank  ->  the row of position p is in this rank's cache at local_index(d, p)
//   dcp::global_position(d, j)      the position of this rank's local row j (for the causal mask)
//   dcp::local_length(d, p + 1)     how many of this rank's rows have a position <= p
#include <stdint.h>

#include <span>
#include <vector>

#include "mla/config.hpp"

#include "mla/host_device.hpp"

namespace mla::dcp {

// The rank that stores global position p.
MLA_HD int owner(const DcpInfo& d, int64_t p) { return static_cast<int>((p / d.interleave) % d.size); }

// Where rank owner(d, p) stores position p among its own rows of the request.
MLA_HD int64_t local_index(const DcpInfo& d, int64_t p) {
  const int64_t i = d.interleave;
  return (p / (i * d.size)) * i + p % i;
}

// The reverse map on rank d.rank: the global position of local row j.
MLA_HD int64_t global_position(const DcpInfo& d, int64_t j) {
  const int64_t i = d.interleave;
  return (j / i) * d.size * i + int64_t(d.rank) * i + j % i;
}

// Rows rank d.rank holds of a request of global length global_len (positions 0 .. global_len-1).
// Because global_position is increasing in j, local_length(d, p + 1) is also the number of this
// rank's rows at positions <= p: the causal mask of query position p keeps local rows j below it.
MLA_HD int64_t local_length(const DcpInfo& d, int64_t global_len) {
  const int64_t i = d.interleave;
  const int64_t base = (global_len / (i * d.size)) * i;
  int64_t tail = global_len - base * d.size - int64_t(d.rank) * i;
  tail = tail < 0 ? 0 : (tail > i ? i : tail);
  return base + tail;
}

// The slot (page * page_size + offset) of global position p on rank d.rank, given the request's
// pages on this rank in position order; -1 where another rank stores p.
MLA_HD int64_t slot_of(const DcpInfo& d, int64_t p, const int32_t* request_pages, int page_size) {
  if (owner(d, p) != d.rank) return -1;
  const int64_t j = local_index(d, p);
  return int64_t(request_pages[j / page_size]) * page_size + j % page_size;
}

// slot_mapping [B*Q] of a step's new tokens on rank d.rank from this rank's CSR page table: token
// b*Q + i sits at position seq_lens[b] - Q + i; -1 where another rank stores it and for every
// token of an empty request (seq_lens[b] == 0). Throws mla::Error naming the request when
// seq_lens[b] is in (0, Q) or its pages cannot hold local_length(seq_lens[b]) rows.
void slot_mapping(const DcpInfo& d, std::span<const int32_t> seq_lens, int qlen,
                  std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices, int page_size,
                  std::span<int64_t> out);
std::vector<int64_t> slot_mapping(const DcpInfo& d, std::span<const int32_t> seq_lens, int qlen,
                                  std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                                  int page_size);

// Checks a DCP layout against the model: size >= 1 dividing cfg.tp_size (the gathered heads
// G = N*W are W of the T tensor-parallel ranks' head groups, so W must divide T), rank in
// [0, size), interleave >= 1. Throws mla::Error naming the field.
void validate(const LayerConfig& cfg, const DcpInfo& d);

}  // namespace mla::dcp
