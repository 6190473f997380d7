// FLASHMLA_PROBES=skeleton (scripts/flashmla-bench): FlashMLA's kernel with neither its MMAs (the nomma probe's
// no-op cute::gemm) nor its loads past a block's first two tiles, our MLA_ROWS_BF16_PROBE=skeleton's twin (session
// 52). WRONG RESULTS BY DESIGN: the buffers keep the first two tiles and the scores are zero.
//
// The build's sed renames the main loop's four reloads (launch_kv_tiles_copy_tma<A, B>(tma_gK(_, _, nxt_...)) to
// this function and includes this file before FlashMLA's "Prefetch some KV tiles" helper, so the prologue's two
// tiles still load. Instead of a TMA copy of sub-tile i (64 keys x 64 dims, 8 KB) it completes the 8 KB the copy
// would have brought on the sub-tile's mbarrier (mbarrier.complete_tx, the same thread that would have issued):
// every arrival, expected byte count, wait, barrier and softmax stays as it is, only the memory system leaves.
// (A complete_tx before the waiter's arrive.expect_tx leaves the phase's tx-count at -8192 until it comes, as a
// fast TMA does; the phase completes at the arrival, as with the copy.)
#pragma once

template <int START_HEAD_DIM_TILE_IDX, int END_HEAD_DIM_TILE_IDX, typename TMA_K_OneTile, typename Engine0,
          typename Layout0, typename Engine1, typename Layout1>
__forceinline__ __device__ void flashmla_probe_kv_tiles_complete(cute::Tensor<Engine0, Layout0> const&,
                                                                 cute::Tensor<Engine1, Layout1>&, TMA_K_OneTile&,
                                                                 TMABarrier* barriers_K, int idx_in_warpgroup) {
  if (idx_in_warpgroup == 0) {
#pragma unroll
    for (int i = START_HEAD_DIM_TILE_IDX; i < END_HEAD_DIM_TILE_IDX; ++i) {
      const uint32_t bar = cute::cast_smem_ptr_to_uint(&barriers_K[i]);
      asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(64 * 64 * 2)
                   : "memory");
    }
  }
}
