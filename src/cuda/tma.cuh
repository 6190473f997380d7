#pragma once
// Hopper bulk tensor copies (TMA) and the mbarriers they complete on, for the wgmma attend kernel's
// page loads (docs/attention.md). tests/gpu/test_wgmma.cpp (Wgmma.TmaSwizzledQgmmaMatchesFloat64)
// checks a page-shaped load with the 128-byte swizzle and QGMMA on it against float64 (H200,
// session 4: rel L2 4.5e-4, the fp8 accumulator's one-chain figure).
#include <cuda.h>

#include <cstdint>

namespace mla::cuda::tma {

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA) and the other threads; follow it
// with a CTA barrier.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One plain arrival (a consumer's: it is done with the stage).
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also announces `bytes` of transactions (the TMA loads of this phase).
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits for the phase with this parity to complete; false if it did not within max_polls polls (a
// probe reports that instead of hanging).
__device__ __forceinline__ bool wait_parity(uint32_t bar, uint32_t parity, uint32_t max_polls = 1u << 24) {
  for (uint32_t i = 0; i < max_polls; ++i) {
    uint32_t done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return true;
  }
  return false;
}

// Whether the phase with this parity has completed, without waiting (test_wait: never blocks; the
// many-rows kernel's stamped twin polls the next pair's tiles with it, session 67).
__device__ __forceinline__ bool test_parity(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// MLA_CLUSTER_SCOPE_SYNC (a diagnostic build only: -DMLA_CLUSTER_SCOPE_SYNC, `scripts/device-check
// cluster-race`): the waits acquire and the remote arrivals release at cluster scope, the PTX memory
// model's formal order between a CTA's reads and its cluster peer's later copies into them, to tell
// whether compute-sanitizer racecheck's reports on the clusters' row copies are about the scope.
#ifdef MLA_CLUSTER_SCOPE_SYNC
#define MLA_WAIT_SEM ".acquire.cluster"
#define MLA_REMOTE_ARRIVE_SEM ".release.cluster"
#else
#define MLA_WAIT_SEM ""
#define MLA_REMOTE_ARRIVE_SEM ""
#endif

// Waits for the phase with this parity to complete, however long it takes (kernels).
__device__ __forceinline__ void wait_parity_forever(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity" MLA_WAIT_SEM ".shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// The tensor map's 128 bytes into the SM's descriptor cache ahead of the first box (CUTLASS's
// prefetch_tma_descriptor): the map is a kernel parameter, fetched cold at every launch.
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// The line holding addr into L2 (no register waits on it).
__device__ __forceinline__ void prefetch_l2(const void* addr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(addr));
}

// The box of `map` at (x = byte column, y = row) into shared memory at dst (1024-byte aligned for
// the 128-byte swizzle), completing on bar.
__device__ __forceinline__ void load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// The same box into shared address dst of every CTA of the cluster in cta_mask (the same offset in
// each), completing on the mbarrier at bar's offset in each (the many-rows kernel's 2-CTA clusters,
// whose row tiles read the same keys: one CTA issues a tile for both).
__device__ __forceinline__ void load_2d_multicast(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar,
                                                  uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(cta_mask)
      : "memory");
}
// One plain arrival on the mbarrier at bar's offset in CTA `rank` of the cluster: a consumer's
// "done with the stage" for the other CTA's producer. The default semantics (release at CTA scope),
// as CUTLASS's ClusterBarrier::arrive: `.release.cluster` compiles to a MEMBAR.ALL.GPU before it.
__device__ __forceinline__ void arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive" MLA_REMOTE_ARRIVE_SEM ".shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// Every thread of every CTA of the cluster (mbarrier inits before remote use; no CTA exits while
// another may still arrive on its mbarriers or copy into its shared memory).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The float4 at this CTA's shared address `src` (16-byte aligned), as CTA `rank` of the cluster holds
// it (distributed shared memory; between two cluster_sync()s that order its writes and the reads).
__device__ __forceinline__ float4 load_cluster_float4(const void* src, uint32_t rank) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(src));
  float4 v;
  asm volatile(
      "{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %4, %5;\n"
      " ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [remote];\n}\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "r"(local), "r"(rank)
      : "memory");
  return v;
}

// `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned), completing on bar:
// the bulk copy without a tensor map (the attend kernel's key rows, Tiles::kRows).
__device__ __forceinline__ void load_bytes(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// `bytes` (a multiple of 16) from shared src to global dst (both 16-byte aligned) as one bulk copy in this thread's
// bulk group (the many-rows kernel's o rows, kBulkO): commit_store, then wait_store_read before src is written again
// or the CTA exits.
__device__ __forceinline__ void store_bytes(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void commit_store() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void wait_store_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// The same into shared address dst of every CTA of the cluster in cta_mask (the same offset in each),
// completing on the mbarrier at bar's offset in each (the many-rows kernel's row copies in 2-CTA
// clusters: one CTA copies a tile's rows for both).
__device__ __forceinline__ void load_bytes_multicast(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                     uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar), "h"(cta_mask)
      : "memory");
}

// The mbarrier gets one arrival when all of this thread's earlier cp.async copies have landed
// (.noinc: the arrival is one of those its init count expects).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

}  // namespace mla::cuda::tma
