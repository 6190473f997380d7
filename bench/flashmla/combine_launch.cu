// flashmla_combine: FlashMLA's split combine at 69f3193 (mla_combine.cu, built from $FLASHMLA_DIR by
// scripts/flashmla-bench) from the same plain arguments as the kernel: the fields of Flash_fwd_mla_params it reads.
#include "params.h"
#include "config.h"
#include "mla_combine.h"

#include <cutlass/numeric_types.h>

#include "flashmla_launch.h"

static_assert(kFlashmlaBlockM == Config::BLOCK_SIZE_M, "flashmla_launch.h's shapes are FlashMLA's config.h's");

void flashmla_combine(const FlashmlaDecodeArgs& a) {
  const int rows = a.qlen * a.heads;  // q_seq_per_hk: one kv head
  Flash_fwd_mla_params p = {};
  p.b = a.batch;
  p.s_q = a.qlen;
  p.q_seq_per_hk = rows;
  p.h_q = a.heads;
  p.h_k = 1;
  p.d = Config::HEAD_DIM_K;
  p.d_v = Config::HEAD_DIM_V;
  p.o_ptr = a.o;
  p.softmax_lse_ptr = a.lse;
  p.o_batch_stride = int64_t(rows) * Config::HEAD_DIM_V;
  p.o_row_stride = Config::HEAD_DIM_V;
  p.o_head_stride = Config::HEAD_DIM_V;
  p.num_sm_parts = a.num_sm_parts;
  p.num_splits_ptr = const_cast<int*>(a.num_splits);
  p.total_num_splits = a.total_num_splits;
  p.softmax_lseaccum_ptr = a.lse_accum;
  p.oaccum_ptr = a.o_accum;
  run_flash_mla_combine_kernel<cutlass::bfloat16_t>(p, a.stream);
}
