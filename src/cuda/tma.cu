// Tensor maps for TMA (tma.hpp), checked on the H200 by Wgmma.TmaSwizzledQgmmaMatchesFloat64.
#include "cuda/tma.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "cuda/check.hpp"
#include "cuda/stages.hpp"

namespace mla::cuda {

namespace {
// The maps' L2 promotion: 128 bytes (as CuTe's maps and FlashMLA's; session 39's reading of
// FlashMLA, docs/attention.md); MLA_TMA_L2_PROMOTION=256, 64 or none for an A/B (a measurement
// switch, read once). Session 40 (H200, each twice): 128 against 256 made B 288.7 -> 281.6 us,
// C 81.5 -> 80.0, B64 81.6 -> 80.0, the uneven batch 157.6 -> 155.9, page 16 84.8 -> 84.0; D, F, G,
// 96 heads, 128K, page 1 and the bf16 kernel within 0.5%.
CUtensorMapL2promotion l2_promotion() {
  static const auto promotion = CUtensorMapL2promotion(env_choice("MLA_TMA_L2_PROMOTION",
                                                                  {{"none", CU_TENSOR_MAP_L2_PROMOTION_NONE},
                                                                   {"64", CU_TENSOR_MAP_L2_PROMOTION_L2_64B},
                                                                   {"128", CU_TENSOR_MAP_L2_PROMOTION_L2_128B},
                                                                   {"256", CU_TENSOR_MAP_L2_PROMOTION_L2_256B}},
                                                                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B));
  return promotion;
}
}  // namespace

CUtensorMap make_tensor_map_bytes_sw128(const void* base, int64_t rows, int64_t row_bytes, int64_t row_stride,
                                        int box_rows) {
  MLA_REQUIRE(row_stride % 16 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0,
              "tensor map: base and row stride must be 16-byte aligned, got stride ", row_stride);
  MLA_REQUIRE(box_rows >= 1 && box_rows <= 256, "tensor map: box_rows must be in [1, 256], got ", box_rows);
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    MLA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
    MLA_REQUIRE(status == cudaDriverEntryPointSuccess && fn, "cuTensorMapEncodeTiled: not found in the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(row_bytes), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_stride)};
  const cuuint32_t box[2] = {128, cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            l2_promotion(), CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MLA_REQUIRE(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed with CUresult ", int(r));
  return map;
}

}  // namespace mla::cuda
