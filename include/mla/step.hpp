#pragma once
// One decode step's metadata and the paged KV cache (SPEC.md, "One step's inputs").
#include <cstdint>
#include <span>
#include <vector>

#include "mla/tensor.hpp"

namespace mla {

// The paged cache: [num_pages, page_size, L+R] rows, fp8 e4m3 (scaled by the weights' k_scale)
// or bf16. Pages are contiguous rows; the page stride may exceed page_size*(L+R).
struct KVCache {
  TensorView pages;  // [num_pages, page_size, 576] fp8_e4m3 or bf16
  int page_size() const { return static_cast<int>(pages.shape[1]); }
  int64_t num_pages() const { return pages.shape[0]; }
};

struct StepMeta {
  int qlen = 1;               // Q in 1..8: query tokens per request; S = B*Q
  TensorView seq_lens{};      // [B] i32: global context length incl. this step's Q tokens
  TensorView kv_indptr{};     // [B+1] i32: CSR row pointers into kv_indices
  TensorView kv_indices{};    // [kv_indptr[B]] i32: this rank's pages of each request, by position
  TensorView slot_mapping{};  // [S] i64: page*page_size + offset of token s's row here, or -1
  // Host copy of seq_lens, where the caller has one: the CUDA backend plans splits from it
  // without a device-to-host copy. Empty: the CPU reads seq_lens; CUDA uses a static plan.
  std::span<const int32_t> seq_lens_host{};

  int batch() const { return static_cast<int>(seq_lens.shape[0]); }
  int tokens() const { return batch() * qlen; }
};

// CSR page table built from a block table [B, max_pages] (i32) and each request's local length.
struct PageTable {
  std::vector<int32_t> kv_indptr;   // [B+1]
  std::vector<int32_t> kv_indices;  // [kv_indptr[B]]
};
PageTable page_table_from_block_table(std::span<const int32_t> block_table, int batch,
                                      int max_pages, std::span<const int32_t> local_seq_lens,
                                      int page_size);

}  // namespace mla
