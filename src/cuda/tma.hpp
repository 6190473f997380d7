#pragma once
// Host side of the TMA building blocks (tma.cuh): tensor maps over byte matrices.
#include <cuda.h>

#include <cstdint>

namespace mla::cuda {

// A 2-D tensor map over `rows` rows of `row_bytes` bytes (uint8 elements) at `base`, rows
// `row_stride` bytes apart (a multiple of 16), boxes of 128 bytes x box_rows rows, 128-byte
// swizzle, out-of-bounds bytes filled with zero. Encoded through the driver entry point (no link
// against libcuda).
CUtensorMap make_tensor_map_bytes_sw128(const void* base, int64_t rows, int64_t row_bytes, int64_t row_stride,
                                        int box_rows);

struct AttendParams;
// The many-rows attend kernel's launch (attend_rows.cu), with the cache's tensor map.
// tma: the cache's tiles as TMA boxes (map); else gathered by cp.async (pages not a power of two).
void launch_attend_rows(const AttendParams& p, const CUtensorMap& map, bool tma, cudaStream_t stream);
// The same for a bf16 query and cache (attend_rows_bf16.cu).
void launch_attend_rows_bf16(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream);
// The 16-row kernel's bf16-query instances over an fp8 cache (attend_wgmma_q_split.cu; attend_wgmma_q_split
// in stages.hpp says where): tma, TMA boxes (map); else bulk row copies. And their shared-memory limit
// (once, where the switch is on).
void launch_attend_wgmma_q_split(const AttendParams& p, const CUtensorMap& map, bool tma, cudaStream_t stream);
void prepare_attend_wgmma_q_split();
// The many-rows kernel's bf16-query instances over an fp8 cache's TMA boxes, 32-row CTAs
// (attend_rows_q_split.cu; attend_rows_q_split in stages.hpp says where), and their shared-memory
// limit (once, unless MLA_ROWS_Q_SPLIT=0).
void launch_attend_rows_q_split(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream);
void prepare_attend_rows_q_split();
// The 16-row kernel's bf16-query-and-cache instance over TMA boxes (attend_wgmma_bf16.cu;
// attend_wgmma_bf16_cache in stages.hpp says where), and its shared-memory limit (where the switch is on).
void launch_attend_wgmma_bf16(const AttendParams& p, const CUtensorMap& map, cudaStream_t stream);
void prepare_attend_wgmma_bf16();
// The 16-row kernel's default TMA instance with skewed fixed splits (attend_wgmma_skew.cu, s33a;
// attend_wgmma_skews in stages.hpp says where): p with its multiply-shifts set (FastDivs), grid the
// launch's; and its shared-memory limit (unless MLA_ATTEND_SKEW=0).
void launch_attend_wgmma_skew(const AttendParams& p, const CUtensorMap& map, dim3 grid, cudaStream_t stream);
void prepare_attend_wgmma_skew();
// The same FastDivs instances, plain and skewed, without the flat plan's code, for launches of fixed
// splits (attend_wgmma_fixed.cu, s73a, the default unless MLA_ATTEND_FIXED_ONLY=0: attend_fixed_only_enabled
// in stages.hpp), and their shared-memory limit (where the switch is on).
void launch_attend_wgmma_fixed(const AttendParams& p, const CUtensorMap& map, dim3 grid, bool skew,
                               cudaStream_t stream);
void prepare_attend_wgmma_fixed();
// The bulk row copies' instance so (3-step q.k groups, a producer warpgroup: 2 x kThreads a CTA).
void launch_attend_wgmma_fixed_rows(const AttendParams& p, const CUtensorMap& map, dim3 grid, cudaStream_t stream);
// (the plain one's stamped twin, for MLA_ATTEND_TIMELINE under the switch: p.timeline set by the caller)
void launch_attend_wgmma_fixed_timeline(const AttendParams& p, const CUtensorMap& map, dim3 grid, cudaStream_t stream);

}  // namespace mla::cuda
