// The layer at W > 1 on CPU thread ranks (core/dcp_runner.hpp): every rank's out equals the DCP-1
// out of the same rank's weights on the same step (and the float64 end-to-end reference), each
// rank's cache holds exactly its own rows, and bad DCP input is rejected on every rank before
// anything is written.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "core/dcp_runner.hpp"
#include "mla/comm.hpp"
#include "mla/dcp.hpp"
#include "mla/error.hpp"
#include "reference/reference.hpp"
#include "reference/tolerances.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

struct DcpCase {
  int w, interleave, qlen, page_size;
  std::vector<int32_t> seq_lens{};  // global lengths; 0 = padding request
  DType kv_dtype = DType::fp8_e4m3;
  int num_splits = 1;
  const char* preset = "kimi-k3";
  GateLayout gate = GateLayout::merged;
  int heads = 3;
  uint64_t seed = 1;
};

std::string describe(const DcpCase& c) {
  std::string s = "W=" + std::to_string(c.w) + " I=" + std::to_string(c.interleave) + " qlen=" +
                  std::to_string(c.qlen) + " page=" + std::to_string(c.page_size) + " " + c.preset +
                  " kv=" + dtype_name(c.kv_dtype) + " splits=" + std::to_string(c.num_splits) + " seq_lens=";
  for (int32_t l : c.seq_lens) s += std::to_string(l) + ",";
  return s;
}

// The W = 1 result of one rank's weights on the same step (same hidden, same history).
Tensor dcp1_out(const LayerConfig& cfg, const PreparedWeights& w, const synth::ScenarioSpec& spec, int splits,
                synth::Scenario* scenario_out) {
  synth::ScenarioSpec one = spec;
  one.dcp = {};
  synth::Scenario sc = synth::make_scenario(one, w.k_scale);
  Layer layer(cfg, w, {.backend = Backend::cpu, .num_splits = splits, .num_threads = 1});
  Tensor out = Tensor::empty(DType::bf16, {sc.tokens(), int64_t(cfg.heads()) * cfg.v_head_dim});
  layer.step(sc.hidden, sc.meta(), sc.kv(), out);
  if (scenario_out) *scenario_out = std::move(sc);
  return out;
}

void run_case(const DcpCase& c) {
  SCOPED_TRACE(describe(c));
  const LayerConfig cfg = testing::small_config(c.preset, c.gate, c.heads);
  std::vector<PreparedWeights> weights;
  for (const CheckpointWeights& ck : dcp::rank_checkpoints(cfg, c.seed, c.w)) weights.push_back(prepare_weights(cfg, ck));
  synth::ScenarioSpec spec{.cfg = cfg, .seq_lens = c.seq_lens, .qlen = c.qlen, .page_size = c.page_size,
                           .kv_dtype = c.kv_dtype, .dcp = {.size = c.w, .rank = 0, .interleave = c.interleave},
                           .seed = c.seed};
  const auto ranks = dcp::run_ranks(weights, spec, {.backend = Backend::cpu, .num_splits = c.num_splits});
  ASSERT_EQ(int(ranks.size()), c.w);

  const int64_t rows = cfg.row_dim(), ps = c.page_size;
  const size_t row_bytes = size_t(rows) * dtype_size(c.kv_dtype);
  for (int r = 0; r < c.w; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Tensor want = dcp1_out(cfg, weights[r], spec, c.num_splits, nullptr);
    const std::vector<double> want_d = testing::to_doubles(want);
    const testing::Compare vs_dcp1 = testing::compare(ranks[r].out, want_d.data());
    EXPECT_TRUE(vs_dcp1.ok(1e-2)) << "vs DCP-1: rel_l2 " << vs_dcp1.rel_l2 << " " << vs_dcp1.why;
    EXPECT_FALSE(testing::has_poison(ranks[r].out));

    // The float64 end-to-end reference of this rank's heads (W = 1 form: all positions).
    synth::ScenarioSpec one_spec = spec;
    one_spec.dcp = {};
    const synth::Scenario hist = synth::make_scenario(one_spec, weights[r].k_scale);
    const std::vector<double> ref =
        ref::end_to_end(cfg, ref::dequantize(cfg, weights[r]), hist.hidden, hist.kv(), hist.meta());
    // The fp8 query (always at W > 1) gets the project's 1e-1 end-to-end tolerance instead of
    // SPEC.md's 5e-2 (measured 2.5-6.5% at W = 1: tests/test_end_to_end.cpp); DCP-1 above is the tight check.
    const testing::Compare vs_ref = testing::compare(ranks[r].out, ref.data());
    EXPECT_TRUE(vs_ref.ok(ref::kTolEndToEndFp8Query)) << "vs float64: rel_l2 " << vs_ref.rel_l2 << " " << vs_ref.why;
  }
  // Rank r's cache: every local row j of a request is the DCP-1 cache's row at global position
  // global_position(j) (history and this step's new rows alike); every other byte is as it was.
  // One DCP-1 run serves every rank: cache rows do not depend on the q-side weights (kv_a is shared).
  synth::Scenario one;
  dcp1_out(cfg, weights[0], spec, c.num_splits, &one);
  const auto* one_indptr = one.kv_indptr.ptr<const int32_t>();
  const auto* one_indices = one.kv_indices.ptr<const int32_t>();
  for (int r = 0; r < c.w; ++r) {
    SCOPED_TRACE("cache of rank " + std::to_string(r));
    const DcpInfo d{.size = c.w, .rank = r, .interleave = c.interleave};
    const synth::Scenario& sc = ranks[r].scenario;
    synth::ScenarioSpec before_spec = spec;
    before_spec.dcp.rank = r;
    const synth::Scenario before = synth::make_scenario(before_spec, weights[r].k_scale);
    const auto* indptr = sc.kv_indptr.ptr<const int32_t>();
    const auto* indices = sc.kv_indices.ptr<const int32_t>();
    const auto* cache = static_cast<const uint8_t*>(sc.cache.data());
    std::vector<uint8_t> expect(static_cast<const uint8_t*>(before.cache.data()),
                                static_cast<const uint8_t*>(before.cache.data()) + before.cache.bytes());
    for (size_t b = 0; b < c.seq_lens.size(); ++b) {
      const int64_t local = dcp::local_length(d, c.seq_lens[b]);
      ASSERT_LE(local, int64_t(indptr[b + 1] - indptr[b]) * ps);
      for (int64_t j = 0; j < local; ++j) {
        const int64_t p = dcp::global_position(d, j);
        const int64_t row = int64_t(indices[indptr[b] + j / ps]) * ps + j % ps;
        const int64_t one_row = int64_t(one_indices[one_indptr[b] + p / ps]) * ps + p % ps;
        std::memcpy(&expect[size_t(row) * row_bytes], static_cast<const uint8_t*>(one.cache.data()) + one_row * row_bytes,
                    row_bytes);
      }
    }
    ASSERT_EQ(sc.cache.bytes(), expect.size());
    // NaN fill compares bytewise, so memcmp is exact here.
    EXPECT_EQ(std::memcmp(cache, expect.data(), expect.size()), 0) << "a cache row differs from its position's";
  }
}

// The sampled product W x I x qlen x page size: every value of each factor appears with several
// of the others; lengths include 0, the shortest legal ones and requests shorter than W*I.
std::vector<DcpCase> cases() {
  const int ws[] = {2, 4, 8}, ils[] = {1, 16, 64}, qlens[] = {1, 4, 8}, pages[] = {1, 16, 64};
  std::vector<DcpCase> out;
  uint64_t seed = 100;
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      DcpCase c{.w = ws[a], .interleave = ils[b], .qlen = qlens[(a + b) % 3], .page_size = pages[(2 * a + b) % 3]};
      const int wi = c.w * c.interleave, q = c.qlen;
      // Padding, contexts 0 and 1, shorter than W*I (ranks with nothing), a ragged tail, long.
      c.seq_lens = {0, q, q + 1, std::max(q, wi / 2 + 1), 2 * wi + 3 + q, std::min(3 * wi + 7, 700) + q};
      c.kv_dtype = (a + b) % 2 ? DType::bf16 : DType::fp8_e4m3;
      c.num_splits = 1 + (a * 3 + b) % 3;
      c.preset = b == 1 ? "deepseek-v3" : "kimi-k3";  // RoPE at global positions too
      c.gate = b == 1 ? GateLayout::none : GateLayout::merged;
      c.heads = 1 + 2 * ((a + b) % 2);
      c.seed = ++seed;
      out.push_back(c);
    }
  return out;
}

class DcpLayer : public ::testing::TestWithParam<int> {};

TEST_P(DcpLayer, EveryRankMatchesDcp1AndHoldsItsOwnRows) { run_case(cases()[GetParam()]); }

INSTANTIATE_TEST_SUITE_P(Sampled, DcpLayer, ::testing::Range(0, 9));

TEST(DcpLayer, AllPaddingAndContextOne) {
  run_case({.w = 4, .interleave = 1, .qlen = 1, .page_size = 16, .seq_lens = {0, 0}, .seed = 7});
  run_case({.w = 8, .interleave = 64, .qlen = 1, .page_size = 1, .seq_lens = {1, 0, 1}, .seed = 8});
}

// --- bad input ---------------------------------------------------------------------------------

TEST(DcpLayerErrors, SizeNotDividingTpRankOutOfRangeOrWrongComm) {
  const LayerConfig cfg = testing::small_config("kimi-k3", GateLayout::merged, 2);  // T = 8
  const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, 3));
  auto three = make_thread_group(3);
  std::string e = testing::error_of([&] {
    Layer l(cfg, w, {.backend = Backend::cpu, .dcp = {.size = 3, .rank = 0, .interleave = 1}, .comm = three[0].get()});
  });
  EXPECT_NE(e.find("divisor of tp_size"), std::string::npos) << e;
  auto four = make_thread_group(4);
  e = testing::error_of([&] {
    Layer l(cfg, w, {.backend = Backend::cpu, .dcp = {.size = 4, .rank = 4, .interleave = 1}, .comm = four[0].get()});
  });
  EXPECT_NE(e.find("dcp.rank"), std::string::npos) << e;
  e = testing::error_of([&] {
    Layer l(cfg, w, {.backend = Backend::cpu, .dcp = {.size = 2, .rank = 0, .interleave = 1}, .comm = four[0].get()});
  });
  EXPECT_NE(e.find("comm"), std::string::npos) << e;
  e = testing::error_of([&] {
    Layer l(cfg, w, {.backend = Backend::cpu, .dcp = {.size = 4, .rank = 1, .interleave = 1}, .comm = four[2].get()});
  });
  EXPECT_NE(e.find("rank()"), std::string::npos) << e;
}

// Ranks that disagree on the step (or one whose own input is bad): every rank throws, and no
// rank's cache changes.
TEST(DcpLayerErrors, RanksDisagreeingOnTheStepWriteNothing) {
  const int w = 4;
  const LayerConfig cfg = testing::small_config("kimi-k3", GateLayout::merged, 1);
  std::vector<PreparedWeights> weights;
  for (const auto& ck : dcp::rank_checkpoints(cfg, 5, w)) weights.push_back(prepare_weights(cfg, ck));
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    auto comms = make_thread_group(w);
    std::vector<synth::Scenario> sc;
    for (int r = 0; r < w; ++r) {
      synth::ScenarioSpec s{.cfg = cfg, .seq_lens = {40, 9, 0}, .qlen = 2, .page_size = 16,
                            .dcp = {.size = w, .rank = r, .interleave = 4}, .seed = 11};
      if (r == 2 && variant == 0) s.seq_lens = {40, 11, 0};  // other seq_lens
      if (r == 1 && variant == 1) s.qlen = 1, s.seq_lens = {40, 9, 0, 5, 7, 1};  // same S, other qlen
      sc.push_back(synth::make_scenario(s, weights[r].k_scale));
    }
    if (variant == 2) sc[3].slot_mapping.ptr<int64_t>()[0] = int64_t(1) << 40;  // rank 3's slot out of range
    std::vector<std::vector<uint8_t>> before;
    for (const auto& s : sc) before.push_back(testing::snapshot(s.cache.view()));
    std::vector<std::string> errors(w);
    std::vector<std::thread> threads;
    for (int r = 0; r < w; ++r)
      threads.emplace_back([&, r] {
        errors[r] = testing::error_of([&] {
          Layer layer(cfg, weights[r], {.backend = Backend::cpu, .dcp = {.size = w, .rank = r, .interleave = 4},
                                        .comm = comms[r].get(), .num_threads = 1});
          Tensor out = Tensor::empty(DType::bf16, {sc[r].tokens(), int64_t(cfg.heads()) * cfg.v_head_dim});
          layer.step(sc[r].hidden, sc[r].meta(), sc[r].kv(), out);
        });
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < w; ++r) {
      EXPECT_NE(errors[r], "") << "rank " << r << " ran the step";
      EXPECT_EQ(testing::snapshot(sc[r].cache.view()), before[r]) << "rank " << r << "'s cache changed";
    }
  }
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// The three public stages called one by one at W > 1, with the caller's buffers: a head-padded
// query (the gather writes through its row stride) and split partials [splits, S, G, L] that
// post exchanges and merges with the ranks' partials in one merge.
TEST(DcpLayer, StagesWithPaddedQueryAndSplitPartials) {
  const int w = 4, splits = 3, pad = 5;
  const LayerConfig cfg = testing::small_config("kimi-k3", GateLayout::merged, 3);
  std::vector<PreparedWeights> weights;
  for (const auto& ck : dcp::rank_checkpoints(cfg, 21, w)) weights.push_back(prepare_weights(cfg, ck));
  const synth::ScenarioSpec spec{.cfg = cfg, .seq_lens = {70, 0, 2, 9}, .qlen = 2, .page_size = 16,
                                 .dcp = {.size = w, .rank = 0, .interleave = 2}, .seed = 23};
  auto comms = make_thread_group(w);
  std::vector<Tensor> outs(w);
  std::vector<std::string> errors(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      errors[r] = testing::error_of([&] {
        synth::ScenarioSpec rs = spec;
        rs.dcp.rank = r;
        const synth::Scenario sc = synth::make_scenario(rs, weights[r].k_scale);
        Layer layer(cfg, weights[r], {.backend = Backend::cpu, .dcp = rs.dcp, .comm = comms[r].get(), .num_threads = 1});
        const int64_t s = sc.tokens(), g = layer.query_heads(), l = cfg.kv_lora_rank;
        Tensor q = Tensor::empty(DType::fp8_e4m3, {s, g + pad, cfg.row_dim()});
        Tensor gate = Tensor::empty(DType::bf16, {s, cfg.gate_dim()});
        Tensor o = Tensor::empty(DType::f32, {splits, s, g, l}), lse = Tensor::empty(DType::f32, {splits, s, g});
        outs[r] = Tensor::empty(DType::bf16, {s, int64_t(cfg.heads()) * cfg.v_head_dim});
        for (const Tensor* t : {&q, &gate, &o, &lse, &outs[r]}) testing::poison(*t);
        layer.pre(sc.hidden, sc.meta(), sc.kv(), {.q = q.view(), .gate = gate.view()});
        layer.attend(q.view(), sc.kv(), sc.meta(), {.o = o.view(), .lse = lse.view()});
        layer.post({.o = o.view(), .lse = lse.view()}, gate.view(), sc.meta(), outs[r]);
        // Every gathered head of the query was written; the pad heads were not.
        int64_t poisoned_pad = 0;
        for (int64_t t = 0; t < s; ++t)
          for (int64_t h = 0; h < g + pad; ++h) {
            const TensorView head = TensorView::contiguous(q.ptr<uint8_t>() + (t * (g + pad) + h) * cfg.row_dim(),
                                                           DType::fp8_e4m3, {cfg.row_dim()});
            const int64_t left = testing::count_poison(head);
            MLA_REQUIRE(h >= g || left == 0, "query token ", t, " head ", h, " not written by the gather");
            poisoned_pad += h >= g ? left : 0;
          }
        MLA_REQUIRE(poisoned_pad == s * pad * cfg.row_dim(), "the gather wrote into the head pad");
      });
      if (!errors[r].empty()) abort_thread_group(*comms[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < w; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_FALSE(testing::has_poison(outs[r]));
    const Tensor want = dcp1_out(cfg, weights[r], spec, splits, nullptr);
    const std::vector<double> want_d = testing::to_doubles(want);
    const testing::Compare c = testing::compare(outs[r], want_d.data());
    EXPECT_TRUE(c.ok(1e-2)) << "rank " << r << ": rel_l2 " << c.rel_l2 << " " << c.why;
  }
}

}  // namespace
}  // namespace mla
