// Bad input gets a clear error and loses nothing (issue 2 point 7): one test per rejected category,
// each through a real CPU Layer, asserting that mla::Error names the stage and the argument and
// that the KV cache and every output buffer stay byte-identical. Rejected calls never reach the
// backend, so these tests do not depend on the stages' arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/synthetic.hpp"
#include "core/validate.hpp"
#include "mla/dcp.hpp"
#include "mla/error.hpp"
#include "mla/layer.hpp"
#include "mla/weights.hpp"
#include "support/testing.hpp"

namespace {

using mla::DType;
using mla::Tensor;
using mla::TensorView;
namespace testing_ = mla::testing;

// One valid step of a small layer (N = 2 heads, G = 2) with every output allocated and poisoned.
struct Step {
  mla::LayerConfig cfg;
  mla::PreparedWeights weights;
  std::unique_ptr<mla::Layer> layer;
  mla::synth::Scenario sc;
  mla::StepMeta meta;
  mla::KVCache kv;
  Tensor q, gate, o, lse, o_split, lse_split, out;
  mla::PreOutputs pre_out;
  mla::AttendOutputs att_out, split_out;

  int64_t tokens() const { return meta.tokens(); }
  int64_t heads() const { return cfg.heads(); }
};

std::unique_ptr<Step> make_step(mla::GateLayout gate_layout = mla::GateLayout::merged,
                                DType q_dtype = DType::fp8_e4m3, uint64_t seed = 1) {
  auto st = std::make_unique<Step>();
  st->cfg = testing_::small_config("kimi-k3", gate_layout, 2);
  st->weights = mla::prepare_weights(st->cfg, mla::random_checkpoint_weights(st->cfg, seed));
  st->layer = std::make_unique<mla::Layer>(
      st->cfg, st->weights, mla::LayerOptions{.backend = mla::Backend::cpu, .q_dtype = q_dtype, .num_threads = 1});
  mla::synth::ScenarioSpec spec{.cfg = st->cfg, .seq_lens = {5, 0, 40, 17}, .qlen = 2, .page_size = 16,
                                .spare_pages = 2, .seed = seed};
  st->sc = mla::synth::make_scenario(spec, st->weights.k_scale);
  st->meta = st->sc.meta();
  st->kv = st->sc.kv();
  const int64_t s = st->tokens(), g = st->heads(), splits = 3;
  st->q = Tensor::empty(q_dtype, {s, g, 576});
  if (st->cfg.gate_dim() > 0) st->gate = Tensor::empty(DType::bf16, {s, st->cfg.gate_dim()});
  st->o = Tensor::empty(DType::f32, {s, g, 512});
  st->lse = Tensor::empty(DType::f32, {s, g});
  st->o_split = Tensor::empty(DType::f32, {splits, s, g, 512});
  st->lse_split = Tensor::empty(DType::f32, {splits, s, g});
  st->out = Tensor::empty(DType::bf16, {s, g * 128});
  for (const Tensor* t : {&st->q, &st->gate, &st->o, &st->lse, &st->o_split, &st->lse_split, &st->out})
    if (t->bytes()) testing_::poison(t->view());
  st->pre_out = {.q = st->q.view(), .gate = st->gate.bytes() ? st->gate.view() : TensorView{}};
  st->att_out = {.o = st->o.view(), .lse = st->lse.view()};
  st->split_out = {.o = st->o_split.view(), .lse = st->lse_split.view()};
  return st;
}

// Runs a call that must be rejected: the message names the stage and every needle (the argument,
// the expected value), and nothing the step owns changed.
void expect_rejected(const Step& st, const std::function<void()>& call, std::initializer_list<std::string> needles) {
  std::vector<std::vector<uint8_t>> before;
  const Tensor* owned[] = {&st.sc.cache, &st.q, &st.gate, &st.o, &st.lse, &st.o_split, &st.lse_split, &st.out};
  for (const Tensor* t : owned) before.push_back(t->bytes() ? testing_::snapshot(t->view()) : std::vector<uint8_t>{});
  const std::string msg = testing_::error_of(call);
  ASSERT_FALSE(msg.empty()) << "the call was accepted";
  for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
  for (size_t k = 0; k < std::size(owned); ++k) {
    if (!owned[k]->bytes()) continue;
    EXPECT_TRUE(testing_::snapshot(owned[k]->view()) == before[k]) << "tensor " << k << " changed: " << msg;
  }
}

// The three stages and step() on the fixture's (possibly edited) arguments.
void call_pre(Step& st) { st.layer->pre(st.sc.hidden.view(), st.meta, st.kv, st.pre_out); }
void call_attend(Step& st) { st.layer->attend(st.q.view(), st.kv, st.meta, st.att_out); }
void call_post(Step& st) { st.layer->post(st.att_out, st.pre_out.gate, st.meta, st.out.view()); }
void call_step(Step& st) { st.layer->step(st.sc.hidden.view(), st.meta, st.kv, st.out.view()); }

TensorView with_shape(TensorView v, int d, int64_t n) {
  v.shape[d] = n;
  return v;
}

TEST(Validate, AcceptsAValidStepInEveryStage) {
  for (auto gate : {mla::GateLayout::merged, mla::GateLayout::none}) {
    auto st = make_step(gate);
    const mla::detail::StageContext ctx{st->cfg, st->layer->options(), mla::Device::cpu};
    EXPECT_NO_THROW(mla::detail::validate_pre(ctx, st->sc.hidden.view(), st->meta, st->kv, st->pre_out));
    EXPECT_NO_THROW(mla::detail::validate_attend(ctx, st->q.view(), st->kv, st->meta, st->att_out));
    EXPECT_NO_THROW(mla::detail::validate_attend(ctx, st->q.view(), st->kv, st->meta, st->split_out));
    EXPECT_NO_THROW(mla::detail::validate_post(ctx, st->att_out, st->pre_out.gate, st->meta, st->out.view()));
    EXPECT_NO_THROW(mla::detail::validate_post(ctx, st->split_out, st->pre_out.gate, st->meta, st->out.view()));
    EXPECT_NO_THROW(mla::detail::validate_meta(ctx, "pre", st->meta, st->kv));
  }
}

// Random steps of every shape the generator makes pass validation (the generator, the synthetic
// scenario and the validator agree on what a valid step is).
TEST(Validate, AcceptsRandomSyntheticSteps) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const int w = seed % 2 ? 2 : 4;
    const testing_::RandomCase rc = testing_::random_case(
        seed, {.max_batch = 12, .max_context = 600, .max_total_context = 3000, .dcp_size = seed < 20 ? 1 : w});
    SCOPED_TRACE(rc.describe());
    const mla::synth::Scenario sc = mla::synth::make_scenario(rc.spec, 0.02f);
    mla::LayerOptions opts{.backend = mla::Backend::cpu, .q_dtype = rc.q_dtype, .dcp = rc.spec.dcp,
                           .q_head_pad = rc.q_head_pad};
    const mla::detail::StageContext ctx{rc.spec.cfg, opts, mla::Device::cpu};
    const int64_t s = sc.tokens(), g = int64_t(rc.spec.cfg.heads()) * rc.spec.dcp.size;
    const int64_t hq = rc.q_head_pad ? rc.q_head_pad : g;
    const Tensor q = Tensor::empty(rc.q_dtype, {s, hq, 576});
    const Tensor gate = Tensor::empty(DType::bf16, {s, std::max(rc.spec.cfg.gate_dim(), 1)});
    const Tensor o = Tensor::empty(DType::bf16, {rc.num_splits, s, g, 512});
    const Tensor lse = Tensor::empty(DType::f32, {rc.num_splits, s, g});
    const Tensor out = Tensor::empty(DType::bf16, {s, rc.spec.cfg.heads() * 128});
    const TensorView gate_v = rc.spec.cfg.gate_dim() ? gate.view() : TensorView{};
    EXPECT_NO_THROW(mla::detail::validate_pre(ctx, sc.hidden.view(), sc.meta(), sc.kv(), {q.view(), gate_v}));
    EXPECT_NO_THROW(mla::detail::validate_attend(ctx, q.view(), sc.kv(), sc.meta(), {o.view(), lse.view()}));
    EXPECT_NO_THROW(mla::detail::validate_post(ctx, {o.view(), lse.view()}, gate_v, sc.meta(), out.view()));
  }
}

TEST(Validate, RejectsViewsOnAnotherDevice) {
  auto st = make_step();
  TensorView hidden = st->sc.hidden.view();
  hidden.device = mla::Device::cuda;  // never dereferenced: validation rejects it first
  expect_rejected(*st, [&] { st->layer->pre(hidden, st->meta, st->kv, st->pre_out); }, {"pre: hidden", "cpu", "cuda"});
  st->meta.kv_indices.device = mla::Device::cuda;
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.kv_indices", "device"});
}

TEST(Validate, RejectsWrongShapes) {
  auto st = make_step();
  const TensorView hidden = st->sc.hidden.view();
  expect_rejected(*st, [&] { st->layer->pre(with_shape(hidden, 1, 255), st->meta, st->kv, st->pre_out); },
                  {"pre: hidden", "D=256", "255"});
  TensorView flat = TensorView::contiguous(hidden.data, DType::bf16, {hidden.numel()});
  expect_rejected(*st, [&] { st->layer->pre(flat, st->meta, st->kv, st->pre_out); }, {"pre: hidden", "rank 2"});
  st->pre_out.gate = with_shape(st->pre_out.gate, 1, 128);
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: out.gate", "N*V=256"});
  expect_rejected(*st, [&] { st->layer->post(st->att_out, st->pre_out.gate, st->meta, st->out.view()); },
                  {"post: gate", "N*V=256"});
  expect_rejected(*st, [&] { st->layer->post(st->att_out, st->gate.view(), st->meta, with_shape(st->out.view(), 1, 200)); },
                  {"post: out", "N*V=256"});
}

TEST(Validate, RejectsWrongDtypes) {
  auto st = make_step();
  TensorView hidden = st->sc.hidden.view();
  hidden.dtype = DType::f16;
  expect_rejected(*st, [&] { st->layer->pre(hidden, st->meta, st->kv, st->pre_out); }, {"pre: hidden", "bf16", "f16"});
  st->meta.seq_lens.dtype = DType::i64;
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.seq_lens", "i32"});
  st = make_step();
  st->meta.slot_mapping.dtype = DType::i32;
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.slot_mapping", "i64"});
  st->meta.slot_mapping.dtype = DType::i64;
  st->pre_out.gate.dtype = DType::f32;
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: out.gate", "bf16"});
  st = make_step();
  st->att_out.o.dtype = DType::f16;
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: out.o", "f32 or bf16"});
  expect_rejected(*st, [&] { call_post(*st); }, {"post: attn.o", "f32 or bf16"});
  st->att_out.o.dtype = DType::f32;
  st->att_out.lse.dtype = DType::bf16;
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: out.lse", "f32"});
  TensorView out = st->out.view();
  out.dtype = DType::f32;
  expect_rejected(*st, [&] { st->layer->post({st->o.view(), st->lse.view()}, st->gate.view(), st->meta, out); },
                  {"post: out", "bf16"});
}

TEST(Validate, RejectsTokenCountsThatDisagreeWithBTimesQ) {
  auto st = make_step();  // B = 4, Q = 2: S = 8
  expect_rejected(*st, [&] { st->layer->pre(with_shape(st->sc.hidden.view(), 0, 7), st->meta, st->kv, st->pre_out); },
                  {"pre: hidden", "S=B*Q=8", "7"});
  st->meta.slot_mapping = with_shape(st->meta.slot_mapping, 0, 6);
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.slot_mapping", "S=B*Q=8"});
  st = make_step();
  st->pre_out.q = with_shape(st->pre_out.q, 0, 4);
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: out.q", "S=8"});
  expect_rejected(*st, [&] { st->layer->attend(st->pre_out.q, st->kv, st->meta, st->att_out); }, {"attend: q", "S=8"});
  st->att_out.lse = with_shape(st->att_out.lse, 0, 9);
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: out.lse", "S=8"});
  expect_rejected(*st, [&] { call_post(*st); }, {"post: attn.lse", "S=8"});
  st->split_out.lse = with_shape(st->split_out.lse, 0, 2);  // 2 splits of lse for 3 of o
  expect_rejected(*st, [&] { st->layer->attend(st->q.view(), st->kv, st->meta, st->split_out); },
                  {"attend: out.lse", "splits=3"});
}

TEST(Validate, RejectsQlenOutsideOneToEight) {
  for (int qlen : {0, 9, -1}) {
    auto st = make_step();
    st->meta.qlen = qlen;
    expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.qlen", "1..8"});
    expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.qlen", "1..8"});
    expect_rejected(*st, [&] { call_post(*st); }, {"post: meta.qlen", "1..8"});
  }
}

TEST(Validate, RejectsSeqLenBelowQlen) {
  auto st = make_step();  // qlen 2
  st->sc.seq_lens.ptr<int32_t>()[3] = 1;
  st->meta.seq_lens_host = {};
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.seq_lens[3]", ">= qlen = 2", "got 1"});
  expect_rejected(*st, [&] { call_step(*st); }, {"meta.seq_lens[3]"});
  st->sc.seq_lens.ptr<int32_t>()[3] = -4;
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.seq_lens[3]", "got -4"});
  // seq_lens_host disagreeing with seq_lens, or of the wrong size.
  st = make_step();
  st->sc.seq_lens_host[2] = 41;
  st->meta = st->sc.meta();
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.seq_lens_host[2]", "40", "41"});
  st->meta.seq_lens_host = st->meta.seq_lens_host.subspan(1);
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.seq_lens_host", "4 entries"});
}

TEST(Validate, RejectsKvIndptrNotMonotone) {
  auto st = make_step();  // pages per request: 1, 0, 3, 2 -> indptr 0 1 1 4 6
  int32_t* indptr = st->sc.kv_indptr.ptr<int32_t>();
  indptr[1] = 2;
  indptr[2] = 1;
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.kv_indptr[2]", "monotone", "got 1"});
  st = make_step(mla::GateLayout::merged, DType::fp8_e4m3, 2);
  st->sc.kv_indptr.ptr<int32_t>()[0] = 1;
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.kv_indptr[0]", "expected 0", "got 1"});
  st = make_step();
  st->sc.kv_indptr.ptr<int32_t>()[4] = 7;  // past the end of kv_indices (6 entries)
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.kv_indptr[4]", "kv_indices", "got 7"});
  st->meta.kv_indptr = with_shape(st->meta.kv_indptr, 0, 4);
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.kv_indptr", "B+1=5"});
}

TEST(Validate, RejectsKvIndptrTooShortForASeqLen) {
  auto st = make_step();
  // Request 2 (seq_len 40, page 16) has 3 pages; make it 2 by shifting request 3's start.
  st->sc.kv_indptr.ptr<int32_t>()[3] = 3;
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.kv_indptr[2..3]", "at least 3 pages", "got 2"});
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.kv_indptr[2..3]"});
  // A longer seq_len than the pages hold.
  st = make_step();
  st->sc.seq_lens.ptr<int32_t>()[0] = 17;  // one page of 16
  st->meta.seq_lens_host = {};
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.kv_indptr[0..1]", "local length 17"});
}

TEST(Validate, RejectsPagesOutOfRange) {
  for (int32_t bad : {-1, 0}) {
    auto st = make_step();
    const int32_t num_pages = int32_t(st->kv.num_pages());
    st->sc.kv_indices.ptr<int32_t>()[3] = bad == 0 ? num_pages : bad;
    expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.kv_indices[3]", "[0, " + std::to_string(num_pages) + ")"});
    expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.kv_indices[3]"});
  }
}

TEST(Validate, RejectsSlotsOutOfRange) {
  auto st = make_step();
  const int64_t rows = st->kv.num_pages() * st->kv.page_size();
  for (int64_t bad : {rows, rows + 100, int64_t(-2)}) {
    int64_t* slots = st->sc.slot_mapping.ptr<int64_t>();
    const int64_t keep = slots[7];
    slots[7] = bad;
    expect_rejected(*st, [&] { call_pre(*st); },
                    {"pre: meta.slot_mapping[7]", "[0, " + std::to_string(rows) + ")", std::to_string(bad)});
    expect_rejected(*st, [&] { call_step(*st); }, {"meta.slot_mapping[7]"});
    slots[7] = keep;
  }
}

TEST(Validate, RejectsTwoTokensWithTheSameSlot) {
  auto st = make_step();
  int64_t* slots = st->sc.slot_mapping.ptr<int64_t>();  // tokens 0,1: request 0; 4,5: request 2
  slots[5] = slots[0];
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.slot_mapping[", std::to_string(slots[0]), "token"});
}

TEST(Validate, RejectsASlotForAnEmptyRequest) {
  auto st = make_step();
  // Request 1 is empty: tokens 2 and 3 must not write. Slot 0's row is a free row of a spare page?
  // Any in-range slot no other token uses will do: the last row of the cache.
  st->sc.slot_mapping.ptr<int64_t>()[3] = st->kv.num_pages() * st->kv.page_size() - 1;
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.slot_mapping[3]", "-1", "empty request 1"});
}

TEST(Validate, RejectsABadCache) {
  auto st = make_step();
  TensorView pages = st->kv.pages;
  pages.dtype = DType::f32;
  expect_rejected(*st, [&] { st->layer->pre(st->sc.hidden.view(), st->meta, {pages}, st->pre_out); },
                  {"pre: cache.pages", "fp8_e4m3 or bf16", "f32"});
  TensorView narrow = with_shape(st->kv.pages, 2, 512);
  expect_rejected(*st, [&] { st->layer->attend(st->q.view(), {narrow}, st->meta, st->att_out); },
                  {"attend: cache.pages", "L+R=576"});
  // Pages overlapping each other: a page stride shorter than page_size rows.
  TensorView overlap = st->kv.pages;
  overlap.stride[0] = 576 * 8;
  expect_rejected(*st, [&] { st->layer->pre(st->sc.hidden.view(), st->meta, {overlap}, st->pre_out); },
                  {"pre: cache.pages.stride[0]", "9216"});
  TensorView gapped = st->kv.pages;
  gapped.stride[1] = 600;  // rows padded apart inside a page
  gapped.stride[0] = 600 * 16;
  expect_rejected(*st, [&] { st->layer->pre(st->sc.hidden.view(), st->meta, {gapped}, st->pre_out); },
                  {"pre: cache.pages.stride[1]", "576"});
  TensorView zero_page = with_shape(st->kv.pages, 1, 0);
  expect_rejected(*st, [&] { st->layer->pre(st->sc.hidden.view(), st->meta, {zero_page}, st->pre_out); },
                  {"pre: cache.pages", "page_size >= 1"});
}

TEST(Validate, RejectsAQueryOfTheWrongDtypeOrHeads) {
  auto st = make_step();  // q_dtype fp8
  const Tensor q16 = Tensor::empty(DType::bf16, {st->tokens(), st->heads(), 576});
  expect_rejected(*st, [&] { st->layer->attend(q16.view(), st->kv, st->meta, st->att_out); },
                  {"attend: q", "fp8_e4m3", "bf16"});
  expect_rejected(*st, [&] { st->layer->pre(st->sc.hidden.view(), st->meta, st->kv, {q16.view(), st->gate.view()}); },
                  {"pre: out.q", "fp8_e4m3"});
  // Fewer heads than G; a row that is not 576.
  expect_rejected(*st, [&] { st->layer->attend(with_shape(st->q.view(), 1, 1), st->kv, st->meta, st->att_out); },
                  {"attend: q", "Hq>=G=2"});
  expect_rejected(*st, [&] { st->layer->attend(with_shape(st->q.view(), 2, 512), st->kv, st->meta, st->att_out); },
                  {"attend: q", "L+R=576"});
  // Output heads must be G exactly.
  const Tensor o3 = Tensor::empty(DType::f32, {st->tokens(), 3, 512});
  const Tensor lse3 = Tensor::empty(DType::f32, {st->tokens(), 3});
  expect_rejected(*st, [&] { st->layer->attend(st->q.view(), st->kv, st->meta, {o3.view(), lse3.view()}); },
                  {"attend: out.o", "G=2"});
  expect_rejected(*st, [&] { st->layer->post({o3.view(), lse3.view()}, st->gate.view(), st->meta, st->out.view()); },
                  {"post: attn.o", "G=2"});
}

TEST(Validate, RejectsAQueryViewTooSmallForItsStrides) {
  auto st = make_step();
  // A head-padded query buffer (Hq = 4 > G = 2) whose row stride must span all 4 heads.
  const Tensor buf = Tensor::empty(DType::fp8_e4m3, {st->tokens(), 4, 576});
  TensorView q = buf.view();
  EXPECT_NO_THROW(mla::detail::validate_attend({st->cfg, st->layer->options(), mla::Device::cpu}, q, st->kv,
                                               st->meta, st->att_out));
  q.stride[0] = 3 * 576;  // rows overlap: row s+1 starts inside row s's heads
  expect_rejected(*st, [&] { st->layer->attend(q, st->kv, st->meta, st->att_out); },
                  {"attend: q.stride[0]", "2304", "1728"});
  expect_rejected(*st, [&] { st->layer->pre(st->sc.hidden.view(), st->meta, st->kv, {q, st->gate.view()}); },
                  {"pre: out.q.stride[0]", "2304"});
  q = buf.view();
  q.stride[1] = 500;  // heads overlap
  expect_rejected(*st, [&] { st->layer->attend(q, st->kv, st->meta, st->att_out); }, {"attend: q.stride[1]", "576"});
  q = buf.view();
  q.stride[2] = 2;  // a 576-row that is not contiguous
  q.stride[1] = 2 * 576;
  q.stride[0] = 4 * 2 * 576;
  expect_rejected(*st, [&] { st->layer->attend(q, st->kv, st->meta, st->att_out); }, {"attend: q.stride[2]", "1"});
}

TEST(Validate, RejectsNonPositiveStrides) {
  auto st = make_step();
  TensorView hidden = st->sc.hidden.view();
  hidden.stride[0] = -256;
  expect_rejected(*st, [&] { st->layer->pre(hidden, st->meta, st->kv, st->pre_out); },
                  {"pre: hidden.stride[0]", ">= 1", "-256"});
  st->att_out.lse.stride[0] = 0;
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: out.lse.stride[0]", ">= 1"});
  st = make_step();
  st->att_out.o.stride[1] = 256;  // heads overlap inside a token's output
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: out.o.stride[1]", "512"});
}

TEST(Validate, RejectsOutputsAliasingTheCacheOrEachOther) {
  auto st = make_step();
  // The query written over the first pages of the cache.
  TensorView q = st->q.view();
  q.data = st->kv.pages.data;
  expect_rejected(*st, [&] { st->layer->pre(st->sc.hidden.view(), st->meta, st->kv, {q, st->gate.view()}); },
                  {"pre: out.q", "cache.pages", "overlapping"});
  TensorView lse = st->lse.view();
  lse.data = st->o.data();
  expect_rejected(*st, [&] { st->layer->attend(st->q.view(), st->kv, st->meta, {st->o.view(), lse}); },
                  {"attend: out.o", "out.lse", "overlapping"});
  TensorView out = st->out.view();
  out.data = st->gate.data();
  expect_rejected(*st, [&] { st->layer->post(st->att_out, st->gate.view(), st->meta, out); },
                  {"post: out", "gate", "overlapping"});
}

TEST(Validate, RejectsMissingOrUnexpectedGate) {
  auto st = make_step(mla::GateLayout::merged);
  expect_rejected(*st, [&] { st->layer->pre(st->sc.hidden.view(), st->meta, st->kv, {st->q.view(), {}}); },
                  {"pre: out.gate", "undefined"});
  expect_rejected(*st, [&] { st->layer->post(st->att_out, {}, st->meta, st->out.view()); }, {"post: gate", "undefined"});
  auto none = make_step(mla::GateLayout::none);
  const Tensor gate = Tensor::empty(DType::bf16, {none->tokens(), 256});
  expect_rejected(*none, [&] { none->layer->pre(none->sc.hidden.view(), none->meta, none->kv, {none->q.view(), gate.view()}); },
                  {"pre: out.gate", "no gate"});
  expect_rejected(*none, [&] { none->layer->post(none->att_out, gate.view(), none->meta, none->out.view()); },
                  {"post: gate", "no gate"});
}

TEST(Validate, RejectsMissingAndNullTensors) {
  auto st = make_step();
  st->meta.slot_mapping = {};
  expect_rejected(*st, [&] { call_pre(*st); }, {"pre: meta.slot_mapping", "undefined"});
  st = make_step();
  st->meta.kv_indptr = {};
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: meta.kv_indptr", "undefined"});
  st = make_step();
  st->att_out.o.data = nullptr;
  expect_rejected(*st, [&] { call_attend(*st); }, {"attend: out.o", "null"});
  st = make_step();
  st->meta.seq_lens = {};
  expect_rejected(*st, [&] { call_post(*st); }, {"post: meta.seq_lens", "B >= 1"});
}

// Post reads G = N * dcp.size heads; checked on the validator directly (a W > 1 Layer needs a
// communicator, which rejection does not reach).
TEST(Validate, PostExpectsTheGatheredHeadCountUnderDcp) {
  auto st = make_step();
  mla::LayerOptions opts = st->layer->options();
  opts.dcp = {.size = 4, .rank = 1};
  const mla::detail::StageContext ctx{st->cfg, opts, mla::Device::cpu};
  const std::string msg = testing_::error_of(
      [&] { mla::detail::validate_post(ctx, st->att_out, st->gate.view(), st->meta, st->out.view()); });
  EXPECT_NE(msg.find("post: attn.o"), std::string::npos) << msg;
  EXPECT_NE(msg.find("G=8"), std::string::npos) << msg;
  const Tensor o = Tensor::empty(DType::f32, {st->tokens(), 8, 512});
  const Tensor lse = Tensor::empty(DType::f32, {st->tokens(), 8});
  EXPECT_NO_THROW(mla::detail::validate_post(ctx, {o.view(), lse.view()}, st->gate.view(), st->meta, st->out.view()));
  // The page table must hold the local length of rank 1, not the global one: request 2 (40
  // tokens) has 10 rows on rank 1 of 4, one page; the scenario's 3 pages are more than enough.
  EXPECT_NO_THROW(mla::detail::validate_meta(ctx, "attend", st->meta, st->kv));
}

// A CUDA layer's metadata lives on the GPU: the validator checks shapes, dtypes and devices, never
// reads the values (the pointers below are not host memory: a read would crash), and checks the
// values of seq_lens_host. Views on the host or on another GPU are rejected.
TEST(Validate, DeviceMetadataIsCheckedByShapeAndHostSeqLensByValue) {
  auto st = make_step();
  mla::LayerOptions opts = st->layer->options();
  opts.cuda_device = 1;
  const mla::detail::StageContext ctx{st->cfg, opts, mla::Device::cuda};
  auto on_gpu = [](TensorView v) {
    v.device = mla::Device::cuda;
    v.device_index = 1;
    v.data = reinterpret_cast<void*>(uintptr_t(0x40));  // not dereferenceable on the host
    return v;
  };
  // Disjoint fake addresses so that the aliasing checks see separate buffers.
  auto at = [&](TensorView v, uintptr_t addr) {
    v = on_gpu(v);
    v.data = reinterpret_cast<void*>(addr << 32);
    return v;
  };
  mla::StepMeta meta = st->meta;
  meta.seq_lens = at(meta.seq_lens, 1);
  meta.kv_indptr = at(meta.kv_indptr, 2);
  meta.kv_indices = at(meta.kv_indices, 3);
  meta.slot_mapping = at(meta.slot_mapping, 4);
  const mla::KVCache kv{at(st->kv.pages, 5)};
  const TensorView hidden = at(st->sc.hidden.view(), 6), q = at(st->q.view(), 7), gate = at(st->gate.view(), 8);
  const mla::AttendOutputs att{at(st->o.view(), 9), at(st->lse.view(), 10)};
  const TensorView out = at(st->out.view(), 11);
  EXPECT_NO_THROW(mla::detail::validate_pre(ctx, hidden, meta, kv, {q, gate}));
  EXPECT_NO_THROW(mla::detail::validate_attend(ctx, q, kv, meta, att));
  EXPECT_NO_THROW(mla::detail::validate_post(ctx, att, gate, meta, out));

  std::vector<int32_t> host_lens = st->sc.seq_lens_host;
  host_lens[2] = 1;  // below qlen 2
  mla::StepMeta bad = meta;
  bad.seq_lens_host = host_lens;
  std::string msg = testing_::error_of([&] { mla::detail::validate_attend(ctx, q, kv, bad, att); });
  EXPECT_NE(msg.find("attend: meta.seq_lens_host[2]"), std::string::npos) << msg;

  bad = meta;
  bad.kv_indices = st->meta.kv_indices;  // left on the host
  msg = testing_::error_of([&] { mla::detail::validate_pre(ctx, hidden, bad, kv, {q, gate}); });
  EXPECT_NE(msg.find("pre: meta.kv_indices"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
  TensorView other_gpu = q;
  other_gpu.device_index = 0;
  msg = testing_::error_of([&] { mla::detail::validate_attend(ctx, other_gpu, kv, meta, att); });
  EXPECT_NE(msg.find("attend: q"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda:1"), std::string::npos) << msg;
}

TEST(Validate, StepRejectsBeforeTheCacheIsWritten) {
  // A bad post argument (out too short) must stop step() before pre writes the cache.
  auto st = make_step();
  expect_rejected(*st, [&] { st->layer->step(st->sc.hidden.view(), st->meta, st->kv, with_shape(st->out.view(), 0, 3)); },
                  {"post: out", "S=8"});
  st->meta.qlen = 3;  // S = 12 rows of hidden expected
  expect_rejected(*st, [&] { call_step(*st); }, {"meta."});
}

// Random steps (every page size, DCP layouts, qlen, empty requests) with one corrupted value each:
// pre's validation rejects it, names the argument, and the cache stays byte-identical.
TEST(Validate, RandomCorruptionsAreRejectedWithoutWriting) {
  int rejected = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    testing_::RandomCase rc = testing_::random_case(
        500 + seed, {.min_batch = 2, .max_batch = 8, .max_context = 300, .max_total_context = 1200,
                     .empty_fraction = 0.2, .dcp_size = seed % 3 == 0 ? 2 : 1});
    rc.spec.cfg = testing_::small_config("kimi-k3", mla::GateLayout::none, 1);
    SCOPED_TRACE(rc.describe());
    mla::synth::Scenario sc = mla::synth::make_scenario(rc.spec, 0.02f);
    mla::LayerOptions opts{.backend = mla::Backend::cpu, .q_dtype = rc.q_dtype, .dcp = rc.spec.dcp, .num_threads = 1};
    const mla::detail::StageContext ctx{rc.spec.cfg, opts, mla::Device::cpu};
    const int64_t s = sc.tokens(), batch = int64_t(rc.spec.seq_lens.size());
    const Tensor q = Tensor::empty(rc.q_dtype, {s, rc.spec.cfg.heads() * rc.spec.dcp.size, 576});
    auto* slots = sc.slot_mapping.ptr<int64_t>();
    auto* indptr = sc.kv_indptr.ptr<int32_t>();
    std::vector<int64_t> stored;
    for (int64_t t = 0; t < s; ++t)
      if (slots[t] >= 0) stored.push_back(t);
    int64_t widest = -1;  // a request with pages
    for (int64_t b = 0; b < batch; ++b)
      if (indptr[b + 1] > indptr[b] && (widest < 0 || indptr[b + 1] - indptr[b] > indptr[widest + 1] - indptr[widest])) widest = b;

    const std::vector<uint8_t> before = testing_::snapshot(sc.cache.view());
    std::string needle;
    switch (seed % 5) {
      case 0:
        if (stored.empty()) continue;
        slots[stored[0]] = sc.kv().num_pages() * rc.spec.page_size;
        needle = "meta.slot_mapping[" + std::to_string(stored[0]) + "]";
        break;
      case 1:
        if (stored.size() < 2) continue;
        slots[stored[1]] = slots[stored[0]];
        needle = "meta.slot_mapping[" + std::to_string(stored[1]) + "]";
        break;
      case 2:
        if (widest < 0) continue;
        sc.kv_indices.ptr<int32_t>()[indptr[widest]] = int32_t(sc.kv().num_pages());
        needle = "meta.kv_indices[" + std::to_string(indptr[widest]) + "]";
        break;
      case 3: {
        if (widest < 0) continue;
        // A global length whose local length on this rank is one row more than its pages hold.
        const int64_t interleave = rc.spec.dcp.interleave, pages = indptr[widest + 1] - indptr[widest];
        const int64_t k = pages * rc.spec.page_size / interleave + 1;
        sc.seq_lens.ptr<int32_t>()[widest] = int32_t(k * interleave * rc.spec.dcp.size);
        sc.seq_lens_host.clear();
        needle = "meta.kv_indptr[" + std::to_string(widest) + ".." + std::to_string(widest + 1) + "]";
        break;
      }
      case 4:
        if (rc.spec.qlen < 2) {
          sc.seq_lens.ptr<int32_t>()[batch - 1] = -1;
        } else {
          sc.seq_lens.ptr<int32_t>()[batch - 1] = rc.spec.qlen - 1;
        }
        sc.seq_lens_host.clear();
        needle = "meta.seq_lens[" + std::to_string(batch - 1) + "]";
        break;
    }
    const std::string msg = testing_::error_of(
        [&] { mla::detail::validate_pre(ctx, sc.hidden.view(), sc.meta(), sc.kv(), {q.view(), {}}); });
    EXPECT_NE(msg.find("pre: " + needle), std::string::npos) << "corruption " << seed % 5 << ": '" << msg << "'";
    EXPECT_TRUE(testing_::snapshot(sc.cache.view()) == before);
    ++rejected;
  }
  EXPECT_GE(rejected, 15) << "too few cases could be corrupted";
}

TEST(Validate, RejectsNonFiniteOrNonPositiveScales) {
  const mla::LayerConfig cfg = testing_::small_config("kimi-k3", mla::GateLayout::merged, 1);
  const mla::CheckpointWeights good = mla::random_checkpoint_weights(cfg, 3);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    mla::CheckpointWeights w = good;
    w.k_scale = bad;
    EXPECT_NE(testing_::error_of([&] { mla::prepare_weights(cfg, w); }).find("k_scale"), std::string::npos) << bad;
    w = good;
    w.q_scale = bad;
    EXPECT_NE(testing_::error_of([&] { mla::prepare_weights(cfg, w); }).find("q_scale"), std::string::npos) << bad;
  }
}

}  // namespace
