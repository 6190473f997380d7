// flashmla_b89_splitkv: FlashMLA's dense decode kernel at b89eee2 (splitkv_mla.cuh, built from $FLASHMLA_B89_DIR
// by scripts/flashmla-bench) from plain arguments. One kv head; qlen 1-8, causal past 1 (flash_api.cpp's rule).
#include "splitkv_mla.cuh"

#include "flashmla_launch.h"

static_assert(sizeof(FlashmlaSchedMeta) == sizeof(DecodingSchedMeta), "FlashmlaSchedMeta mirrors DecodingSchedMeta");
static_assert(kFlashmlaPage == Config::PAGE_BLOCK_SIZE && kFlashmlaBlockM == Config::BLOCK_SIZE_M &&
                  kFlashmlaFixedOverhead == Config::FIXED_OVERHEAD_NUM_BLOCKS,
              "flashmla_launch.h's shapes are FlashMLA's config.h's");

void flashmla_b89_splitkv(const FlashmlaDecodeArgs& a) {
  DenseAttnDecodeParams p = {};
  p.b = a.batch;
  p.s_q = a.qlen;
  p.q_seq_per_hk = a.qlen * a.heads;
  p.d = Config::HEAD_DIM_K;
  p.d_v = Config::HEAD_DIM_V;
  p.h_q = a.heads;
  p.h_k = 1;
  p.num_blocks = a.num_blocks;
  p.q_head_per_hk = a.heads;
  p.is_causal = a.qlen > 1;
  p.scale_softmax = a.scale;
  p.scale_softmax_log2 = float(a.scale * M_LOG2E);
  p.q_ptr = const_cast<void*>(a.q);
  p.k_ptr = const_cast<void*>(a.kv);
  p.o_ptr = a.o;
  p.softmax_lse_ptr = a.lse;
  p.q_batch_stride = int64_t(a.qlen) * a.heads * Config::HEAD_DIM_K;
  p.k_batch_stride = int64_t(Config::PAGE_BLOCK_SIZE) * Config::HEAD_DIM_K;
  p.o_batch_stride = int64_t(a.qlen) * a.heads * Config::HEAD_DIM_V;
  p.q_row_stride = Config::HEAD_DIM_K;
  p.k_row_stride = Config::HEAD_DIM_K;
  p.o_row_stride = Config::HEAD_DIM_V;
  p.q_head_stride = Config::HEAD_DIM_K;
  p.k_head_stride = Config::HEAD_DIM_K;
  p.o_head_stride = Config::HEAD_DIM_V;
  p.block_table = const_cast<int*>(a.block_table);
  p.block_table_batch_stride = a.block_table_stride;
  p.page_block_size = Config::PAGE_BLOCK_SIZE;
  p.seqlens_k_ptr = const_cast<int*>(a.seqlens);
  p.tile_scheduler_metadata_ptr = reinterpret_cast<DecodingSchedMeta*>(const_cast<FlashmlaSchedMeta*>(a.sched));
  p.num_sm_parts = a.num_sm_parts;
  p.num_splits_ptr = const_cast<int*>(a.num_splits);
  p.total_num_splits = a.total_num_splits;
  p.softmax_lseaccum_ptr = a.lse_accum;
  p.oaccum_ptr = a.o_accum;
  p.stream = a.stream;
  sm90::decode::dense::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);
}
