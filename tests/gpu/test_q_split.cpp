// A bf16 query over an fp8 cache in whole steps against the CPU backend, at shapes the planner gives
// the 16-row kernel (12 and 16 heads, 8 x qlen 2, 24 rows at B = 1) and at many-rows ones (32-128
// rows a request, which the many-rows kernel's split takes for this pair by default over boxed pages,
// attend_rows_q_split.cu, unless MLA_ROWS_Q_SPLIT=0): under MLA_ATTEND_Q_SPLIT=1 (the default) the
// 16-row wgmma kernel with each query row split into two e4m3 rows (core/query_split.hpp,
// attend_wgmma_q_split.cu) on TMA boxes (pages of 8+ rows, a power of two) or bulk row copies (pages
// 1 and 3 here); without the switch the mma.sync kernel, which these cases then check. Fixed splits and the flat plan, NaN in
// unused pages, poisoned outputs. (scripts/device-check q-split runs the GPU tests under the switch,
// with MLA_ATTEND_KERNEL=wgmma too, where attend()'s LSE meets SPEC's 1e-3 through the split.)
// Without a GPU every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "core/query_split.hpp"
#include "cuda/query_split_probe.hpp"
#include "cuda/stages.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/formats.hpp"
#include "mla/mla.hpp"

namespace mla {
namespace {

using testing::Shape;

// The kernel family a bf16 query over an fp8 cache must take at the 16-row heights: the 16-row
// kernel's split (MLA_ATTEND_Q_SPLIT=0: mma.sync).
std::optional<cuda::AttendKernel> split16_family(const Shape&) {
  if (testing::attend_rerouted()) return std::nullopt;
  return cuda::attend_q_split_enabled() ? cuda::AttendKernel::kWgmmaQSplit : cuda::AttendKernel::kMma;
}
// At the many-rows heights: the many-rows kernel's split over pages TMA boxes (unless
// MLA_ROWS_Q_SPLIT=0), else the 16-row one (in these tests the power-of-two pages; page 3 is not boxed).
std::optional<cuda::AttendKernel> rows_family(const Shape& sh) {
  if (testing::attend_rerouted()) return std::nullopt;
  if (!cuda::attend_q_split_enabled()) return cuda::AttendKernel::kMma;
  const bool boxed = (sh.page & (sh.page - 1)) == 0;
  return cuda::attend_rows_q_split_enabled() && boxed ? cuda::AttendKernel::kRowsQSplit : cuda::AttendKernel::kWgmmaQSplit;
}

TEST(QuerySplit, Bf16QueryFp8CacheStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the bf16-query steps");
  testing::steps_match_cpu({{"kimi-k3", 12, 1, 8, 64, 900, true},        // the flat plan
                            {"kimi-k3", 16, 1, 6, 16, 700, false},       // fixed splits, 4 boxes a tile
                            {"deepseek-v3", 8, 2, 5, 64, 600, true},     // 16 rows, causal inside the tile
                            {"kimi-k3", 12, 2, 1, 64, 3000, false},      // 24 rows at B = 1: two row tiles
                            {"kimi-k2", 4, 1, 3, 32, 500, false},        // a part-empty row tile, page 32
                            {"kimi-k3", 12, 1, 4, 1, 500, true},         // page 1: bulk row copies, the flat plan
                            {"deepseek-v3", 16, 1, 5, 3, 400, false}},   // page 3: row copies, fixed splits
                           DType::fp8_e4m3, DType::bf16, 1300, testing::RowsKernel::kSixteen, {.family = split16_family});
}

// Shapes the planner gives many rows: by default the many-rows kernel's split (32-row CTAs,
// attend_rows_q_split.cu) over boxes of whole pages, of 4 rows and of one row, and the 16-row split
// on page 3 (no boxes: its row copies and plan); under MLA_ROWS_Q_SPLIT=0 the 16-row kernel's split
// everywhere (3 and 8 row tiles a request); MLA_ATTEND_Q_SPLIT=0: mma.sync. Each step is
// checked to launch that family (unless a switch in the environment reroutes attend).
TEST(QuerySplit, Bf16QueryFp8CacheManyRowsStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the bf16-query steps");
  testing::steps_match_cpu({{"kimi-k3", 12, 4, 40, 64, 600, false},      // 48 rows, fixed splits
                            {"deepseek-v3", 128, 1, 24, 16, 400, true},  // 128 heads, the flat plan
                            {"kimi-k3", 12, 8, 32, 64, 500, true},       // 96 rows, causal inside the tiles
                            {"kimi-k3", 12, 8, 20, 1, 300, true},        // page 1, the flat plan
                            {"deepseek-v3", 16, 2, 6, 4, 400, false},    // 32 rows at B = 6, page 4
                            {"kimi-k3", 12, 4, 10, 3, 300, false}},      // page 3 (not boxed)
                           DType::fp8_e4m3, DType::bf16, 1400, testing::RowsKernel::kMany, {.family = rows_family});
}

// Query rows far apart in magnitude inside one row tile: head 0's q_b rows times 2^-100 (its query
// rows ~2^-97, the split's exponent ~+105: scores ~0, a flat softmax), head 1's times 2^2 (4x the
// scores: a sharp one), head 2's zero (a zero row), the rest as drawn. Each row's scores are taken
// times its own 2^-e (SplitQueryTile's q_exp): a row given another's would be off by 2^2 to 2^100
// (review of session 36: only the split probe fed such rows before). Both heights, both splits.
void scale_heads(const LayerConfig& cfg, CheckpointWeights& w) {
  const int64_t rows_a_head = cfg.qk_head_dim(), cols = cfg.q_lora_rank;
  auto scale = [&](int head, int exp2, bool zero) {
    for (int64_t i = head * rows_a_head * cols; i < (head + 1) * rows_a_head * cols; ++i)
      w.q_b[size_t(i)] = float_to_bf16(zero ? 0.0f : std::ldexp(bf16_to_float(w.q_b[size_t(i)]), exp2));
  };
  scale(0, -100, false);
  scale(1, 2, false);  // (8x left the step's 1e-2 only a 2-4x margin: review of session 36)
  scale(2, 0, true);
}

TEST(QuerySplit, ExtremeQueryRowsStepMatchesCpu) {
  MLA_SKIP_WITHOUT_GPU("the bf16-query steps");
  testing::steps_match_cpu({{"kimi-k3", 12, 1, 8, 64, 900, true},    // 16-row tiles, the flat plan
                            {"kimi-k3", 12, 1, 4, 1, 500, false}},  // page 1: bulk row copies
                           DType::fp8_e4m3, DType::bf16, 1500, testing::RowsKernel::kSixteen,
                           {.family = split16_family, .weights = scale_heads});
  testing::steps_match_cpu({{"kimi-k3", 12, 4, 40, 64, 600, false},      // 48 rows, fixed splits
                            {"deepseek-v3", 128, 1, 24, 16, 400, true},  // 128 heads, the flat plan
                            {"kimi-k3", 12, 8, 20, 1, 300, true}},       // page 1, 96 rows
                           DType::fp8_e4m3, DType::bf16, 1600, testing::RowsKernel::kMany,
                           {.family = rows_family, .weights = scale_heads});
}

// SplitQueryTile as the kernels run it (query_split_probe: the 16-row kernel's form and the many-rows
// kernel's): each row's exponent and every byte of its
// hi and lo rows against the host split (core/query_split.hpp) at b_offset_n<32>'s places, on a
// head-padded (strided) bf16 query whose rows span 2^-20 .. 2^19 in magnitude, with a zero row, small
// dims inside rows (1/64 of the rest) and a row tile that runs past the request's rows (zeros).
// Byte d of row n in wgmma's K-major core-matrix layout of a 32-row B operand: 16-byte chunk d / 16,
// core matrices of 8 rows x 16 bytes, the 4 of a chunk 128 bytes apart (what b_offset_n<32> in
// attend_wgmma_tiles.cuh computes, written out here from the layout).
int tile_offset(int n, int d) { return (d / 16) * (4 * 128) + (n / 8) * 128 + (n % 8) * 16 + d % 16; }

TEST(QuerySplit, SplitQueryTileMatchesTheHostSplit) {
  MLA_SKIP_WITHOUT_GPU("the query split probe");
  constexpr int kBatch = 2, kQlen = 3, kHeads = 7, kPadded = 9, kDims = 576;  // 21 rows a request
  const int64_t tokens = kBatch * kQlen;
  Tensor host = Tensor::empty(DType::bf16, {tokens, kPadded, kDims});
  uint16_t* q = host.ptr<uint16_t>();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < kPadded; ++h) {
      const float scale = std::ldexp(1.0f, int((t * kPadded + h) * 7 % 40) - 20);
      for (int d = 0; d < kDims; ++d) {
        float v = (t == 1 && h == 2) ? 0.0f : unit(rng) * scale * (d % 7 == 0 ? 1.0f / 64 : 1.0f);
        if (t == 4 && h == 5 && d == 100) v = -INFINITY;  // a row with an infinity: kQuerySplitInfRow
        q[(t * kPadded + h) * kDims + d] = float_to_bf16(v);
      }
    }
  Tensor dev = Tensor::empty(DType::bf16, {tokens, kPadded, kDims}, Device::cuda);
  dev.copy_from(host);
  Tensor tile = Tensor::empty(DType::u8, {2 * 32 * kDims}, Device::cuda);
  Tensor exps = Tensor::empty(DType::i32, {32}, Device::cuda);
  cuda::AttendParams p{};
  p.q = dev.data();
  p.q_fp8 = false;
  p.q_s_stride = kPadded * kDims, p.q_h_stride = kDims;
  p.qlen = kQlen, p.heads = kHeads, p.batch = kBatch;
  // 16 rows (the 16-row kernel's tile: lo rows 16..31 of it) from rows 0 and 16; 32 rows (the many-rows
  // kernel's: the lo rows' tile after the hi rows') from row 0, 11 of them past the request's.
  for (const auto& [rows, m_base] : {std::pair{16, 0}, std::pair{16, 16}, std::pair{32, 0}})
    for (int b = 0; b < kBatch; ++b) {
      SCOPED_TRACE("request " + std::to_string(b) + ", " + std::to_string(rows) + " rows from " + std::to_string(m_base));
      cuda::query_split_probe(p, b, m_base, tile.ptr<uint8_t>(), exps.ptr<int32_t>(), nullptr, rows);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Tensor tile_host = tile.to_host(), exps_host = exps.to_host();
      const uint8_t* got = tile_host.ptr<uint8_t>();
      for (int n = 0; n < rows; ++n) {
        const int m = m_base + n;
        const bool valid = m < kQlen * kHeads;
        const uint16_t* row = valid ? q + ((int64_t(b) * kQlen + m / kHeads) * kPadded + m % kHeads) * kDims : nullptr;
        float amax = 0.0f;
        for (int d = 0; valid && d < kDims; ++d) amax = std::fmax(amax, std::fabs(bf16_to_float(row[d])));
        const int e = query_split_exponent(amax);
        ASSERT_EQ(exps_host.ptr<int32_t>()[n], std::isinf(amax) ? kQuerySplitInfRow : e) << "row " << n;
        for (int d = 0; d < kDims; ++d) {
          const E4m3Split want = valid ? split_e4m3(bf16_to_float(row[d]) * pow2_float(e)) : E4m3Split{0, 0};
          const int at = tile_offset(n, d), at_lo = rows == 16 ? tile_offset(16 + n, d) : 32 * kDims + tile_offset(n, d);
          ASSERT_EQ(got[at], want.hi) << "row " << n << " dim " << d << " (hi)";
          ASSERT_EQ(got[at_lo], want.lo) << "row " << n << " dim " << d << " (lo)";
        }
      }
    }
}

}  // namespace
}  // namespace mla
