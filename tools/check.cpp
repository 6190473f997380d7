#include "check.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "reference/reference.hpp"
#include "reference/tolerances.hpp"
#include "support/testing.hpp"

namespace mla::cli {
namespace {

// SPEC.md, Tolerances. fp8 outputs (the query and the cache rows pre writes) are compared with the
// reference rounded to fp8 the same way (x / scale, RNE, saturated): what remains is the bf16
// rounding upstream flipping a code now and then (~1e-3), so the bf16 tolerance applies.
// The values and the end-to-end rule are in reference/tolerances.hpp.
using ref::kTolBf16, ref::kTolF32, ref::kTolLse;

double tol_for(DType dt) { return dt == DType::f32 ? kTolF32 : kTolBf16; }

// rel L2 of `a` against `ref`; fp8 views hold codes of x / scale, so the reference is scaled and
// rounded to fp8 too.
CheckRow rel_l2_row(std::string stage, std::string tensor, const TensorView& a, std::vector<double> ref,
                    double fp8_scale, double tol) {
  if (a.dtype == DType::fp8_e4m3)
    for (double& r : ref) r = fp8e4m3_to_float(float_to_fp8e4m3(float(r / fp8_scale)));
  const testing::Compare c = testing::compare(a, ref.data());
  return {std::move(stage), std::move(tensor), "rel_l2", c.rel_l2, tol, c.why};
}

CheckRow lse_row(std::string stage, const TensorView& a, const std::vector<double>& ref) {
  const testing::Compare c = testing::compare(a, ref.data());
  return {std::move(stage), "lse", "max_abs", c.max_abs, kTolLse, c.why};
}

// The backend's (possibly split) attend outputs as reference partials.
std::vector<ref::AttendResult> partials_of(const TensorView& o, const TensorView& lse, int splits) {
  const std::vector<double> od = testing::to_doubles(o), ld = testing::to_doubles(lse);
  const size_t on = od.size() / splits, ln = ld.size() / splits;
  std::vector<ref::AttendResult> parts(splits);
  for (int c = 0; c < splits; ++c) {
    parts[c].o.assign(od.begin() + c * on, od.begin() + (c + 1) * on);
    parts[c].lse.assign(ld.begin() + c * ln, ld.begin() + (c + 1) * ln);
  }
  return parts;
}

}  // namespace

StepSnapshot host_copies(const Step& st, Tensor cache_before) {
  StepSnapshot s;
  s.cache_before = std::move(cache_before);
  s.cache_after = st.dev.cache.to_host();
  s.q = st.q.to_host();
  if (st.gate.bytes()) s.gate = st.gate.to_host();
  s.o = st.o.to_host();
  s.lse = st.lse.to_host();
  s.out = st.out.to_host();
  return s;
}

std::vector<CheckRow> check_step(const Step& st, const StepSnapshot& snap) {
  const LayerConfig& cfg = st.cfg;
  const ref::Weights64 w = ref::dequantize(cfg, st.weights);
  const StepMeta meta = st.host.meta();
  const KVCache cache_after{.pages = snap.cache_after.view()};
  const int S = st.tokens(), row = cfg.row_dim();
  std::vector<CheckRow> rows;

  // pre: the query, the gate and the cache rows written, from hidden.
  const ref::PreResult pre = ref::pre(cfg, w, st.host.hidden, meta);
  rows.push_back(rel_l2_row("pre", "q", snap.q, pre.q, w.q_scale, tol_for(snap.q.view().dtype)));
  if (cfg.gate_dim() > 0) rows.push_back(rel_l2_row("pre", "gate", snap.gate, pre.gate, 1, kTolBf16));
  {
    // Gather the rows at this step's slots; every other byte of the cache must be unchanged.
    const TensorView pages = snap.cache_after.view();
    const DType kv = pages.dtype;
    const size_t row_bytes = size_t(row) * dtype_size(kv);
    const auto* slots = st.host.slot_mapping.ptr<const int64_t>();
    std::vector<int64_t> written;
    for (int s = 0; s < S; ++s)
      if (slots[s] >= 0) written.push_back(s);
    Tensor got = Tensor::empty(kv, {int64_t(std::max<size_t>(written.size(), 1)), row});
    std::vector<double> want(std::max<size_t>(written.size(), 1) * row, 0.0);
    std::vector<uint8_t> expect_after(snap.cache_before.bytes());
    std::memcpy(expect_after.data(), snap.cache_before.data(), expect_after.size());
    const auto* after = static_cast<const uint8_t*>(snap.cache_after.data());
    for (size_t k = 0; k < written.size(); ++k) {
      const size_t at = size_t(slots[written[k]]) * row_bytes;  // contiguous pages: slot * row
      std::memcpy(static_cast<uint8_t*>(got.data()) + k * row_bytes, after + at, row_bytes);
      std::memcpy(expect_after.data() + at, after + at, row_bytes);
      std::copy_n(&pre.kv_row[size_t(written[k]) * row], row, &want[k * row]);
    }
    if (!written.empty()) {
      TensorView got_rows = got.view();
      got_rows.shape[0] = int64_t(written.size());
      rows.push_back(rel_l2_row("pre", "cache_rows", got_rows, want, w.k_scale, tol_for(kv)));
    }
    int64_t changed = 0;
    for (size_t i = 0; i < expect_after.size(); ++i) changed += expect_after[i] != after[i];
    rows.push_back({"pre", "cache_elsewhere", "bytes_changed", double(changed), 0, ""});
  }

  // attend: from the backend's own query and the cache after pre.
  if (st.splits > 1) {
    const std::vector<ref::AttendResult> parts = ref::attend_splits(
        cfg, snap.q, st.layer->query_heads(), w.q_scale, cache_after, w.k_scale, meta, DcpInfo{}, st.splits);
    std::vector<double> o, lse;
    for (const auto& p : parts) {
      o.insert(o.end(), p.o.begin(), p.o.end());
      lse.insert(lse.end(), p.lse.begin(), p.lse.end());
    }
    rows.push_back(rel_l2_row("attend", "o (split partials)", snap.o, o, 1, tol_for(snap.o.view().dtype)));
    rows.push_back(lse_row("attend", snap.lse, lse));
  } else {
    const ref::AttendResult a =
        ref::attend(cfg, snap.q, st.layer->query_heads(), w.q_scale, cache_after, w.k_scale, meta, DcpInfo{});
    rows.push_back(rel_l2_row("attend", "o", snap.o, a.o, 1, tol_for(snap.o.view().dtype)));
    rows.push_back(lse_row("attend", snap.lse, a.lse));
  }

  // post: from the backend's own attend outputs and gate.
  const std::vector<ref::AttendResult> parts = partials_of(snap.o, snap.lse, st.splits);
  const ref::AttendResult merged = st.splits > 1 ? ref::merge(parts) : parts[0];
  const std::vector<double> gate = cfg.gate_dim() > 0 ? testing::to_doubles(snap.gate) : std::vector<double>{};
  rows.push_back(rel_l2_row("post", "out", snap.out, ref::post(cfg, w, merged, gate, 0), 1, kTolBf16));

  // The whole step against plain multi-head attention in float64.
  rows.push_back(rel_l2_row("end_to_end", "out", snap.out,
                            ref::end_to_end(cfg, w, st.host.hidden, cache_after, meta), 1,
                            ref::end_to_end_tolerance(snap.q.view().dtype)));
  return rows;
}

std::string format_check_table(const std::vector<CheckRow>& rows) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-11s %-20s %-14s %11s %11s  %s\n", "stage", "tensor", "metric", "error",
                "tolerance", "result");
  os << line;
  for (const CheckRow& r : rows) {
    std::snprintf(line, sizeof line, "%-11s %-20s %-14s %11.3e %11.3e  %s", r.stage.c_str(), r.tensor.c_str(),
                  r.metric.c_str(), r.error, r.tolerance, r.ok() ? "ok" : "FAIL");
    os << line;
    if (!r.why.empty()) os << " (" << r.why << ")";
    os << "\n";
  }
  return os.str();
}

}  // namespace mla::cli
