// The two calls flashmla_bench.cu makes into FlashMLA: its b89eee2 dense decode kernel (b89_launch.cu) and its
// 69f3193 split combine (combine_launch.cu), from one struct of plain types, so the bench includes neither
// FlashMLA's headers (two params.h of different layouts) nor CUTLASS's.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// FlashMLA's fixed shapes (its config.h; the launch files check them): pages of 64 keys, 64 query rows a CTA, the
// scheduler's fixed overhead of 5 blocks a request.
constexpr int kFlashmlaPage = 64, kFlashmlaBlockM = 64, kFlashmlaFixedOverhead = 5;

// FlashMLA's DecodingSchedMeta (b89eee2): one SM part's work, requests begin_req..end_req (inclusive), blocks of
// 64 keys begin_block.. of the first and ..end_block of the last; the first request's split index; whether the
// first / last request is also worked on by another part (then this part writes split partials).
struct alignas(32) FlashmlaSchedMeta {
  int begin_req, end_req, begin_block, end_block, begin_split, first_split, last_split, pad;
};

struct FlashmlaDecodeArgs {
  int batch, heads, qlen, num_blocks, num_sm_parts, total_num_splits;  // (qlen > 1: causal)
  float scale;
  const void* q;   // [batch, qlen x heads, 576] bf16
  const void* kv;  // [num_blocks, 64, 576] bf16
  void* o;         // [batch, qlen x heads, 512] bf16
  float* lse;      // [batch, qlen x heads]
  const int* block_table;
  int64_t block_table_stride;
  const int* seqlens;
  const FlashmlaSchedMeta* sched;  // [num_sm_parts]
  const int* num_splits;           // [batch + 1]: split index prefix
  float* lse_accum;                // [total_num_splits, qlen x heads]
  float* o_accum;                  // [total_num_splits, qlen x heads, 512]
  cudaStream_t stream;
};

// FlashMLA's splitkv kernel (bf16), then its combine of the split partials (a PDL launch after it).
void flashmla_b89_splitkv(const FlashmlaDecodeArgs& a);
void flashmla_combine(const FlashmlaDecodeArgs& a);
