// The float64 reference of attend and of the merge of partials (SPEC.md, attend / split-KV).
// Written for clarity: one (token, head) at a time, every key looked up through the page table,
// every value dequantized on the spot.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "mla/dcp.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"
#include "reference/reference.hpp"

namespace mla::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Element at `offset` (in elements) of a host view, as a double (fp8 as its code's value).
double read(const TensorView& v, int64_t offset) {
  switch (v.dtype) {
    case DType::f32: return v.ptr<const float>()[offset];
    case DType::f64: return v.ptr<const double>()[offset];
    case DType::bf16: return bf16_to_float(v.ptr<const uint16_t>()[offset]);
    case DType::fp8_e4m3: return fp8e4m3_to_float(v.ptr<const uint8_t>()[offset]);
    case DType::i32: return v.ptr<const int32_t>()[offset];
    case DType::i64: return double(v.ptr<const int64_t>()[offset]);
    default: detail::fail("ref::attend: unsupported dtype ", dtype_name(v.dtype), " in ", v.str());
  }
}

int64_t read_int(const TensorView& v, int64_t i) { return int64_t(read(v, i * v.stride[0])); }

struct Inputs {
  const LayerConfig& cfg;
  const TensorView& q;
  int heads_g;
  double q_scale;
  const KVCache& cache;
  double k_scale;
  const StepMeta& meta;
  const DcpInfo& dcp;
};

// Attention of every token and head over the local keys [lo(n), hi(n)) of its request, n the
// request's local length on this rank; keys outside the causal mask are left out as well.
template <class Range>
AttendResult attend_range(const Inputs& in, Range range) {
  const int rows = in.cfg.row_dim(), width = in.cfg.kv_lora_rank;
  const int qlen = in.meta.qlen, batch = in.meta.batch(), g = in.heads_g;
  const int page_size = in.cache.page_size();
  const TensorView& pages = in.cache.pages;
  const double k_scale = pages.dtype == DType::fp8_e4m3 ? in.k_scale : 1.0;
  const double q_scale = in.q.dtype == DType::fp8_e4m3 ? in.q_scale : 1.0;
  const double sm_scale = in.cfg.sm_scale();

  AttendResult res;
  res.o.assign(size_t(batch) * qlen * g * width, 0.0);
  res.lse.assign(size_t(batch) * qlen * g, kNegInf);

  for (int b = 0; b < batch; ++b) {
    const int64_t global_len = read_int(in.meta.seq_lens, b);
    const int64_t local_len = dcp::local_length(in.dcp, global_len);
    const int64_t page_begin = read_int(in.meta.kv_indptr, b);
    const auto [lo, hi] = range(local_len);

    // The dequantized key rows of local indices [lo, hi) (the first `width` columns are the value).
    std::vector<double> keys(size_t(hi - lo) * rows);
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t page = read_int(in.meta.kv_indices, page_begin + j / page_size);
      const int64_t base = page * pages.stride[0] + (j % page_size) * pages.stride[1];
      for (int c = 0; c < rows; ++c)
        keys[size_t(j - lo) * rows + c] = read(pages, base + c * pages.stride[2]) * k_scale;
    }

    for (int i = 0; i < qlen; ++i) {
      const int64_t s = int64_t(b) * qlen + i;
      const int64_t position = global_len - qlen + i;
      for (int h = 0; h < g; ++h) {
        std::vector<double> qrow(rows);
        for (int c = 0; c < rows; ++c)
          qrow[c] = read(in.q, s * in.q.stride[0] + h * in.q.stride[1] + c * in.q.stride[2]) * q_scale;

        // Scores of the visible keys: this rank's rows in [lo, hi) at global positions <= position.
        std::vector<int64_t> visible;
        std::vector<double> scores;
        for (int64_t j = lo; j < hi; ++j) {
          if (dcp::global_position(in.dcp, j) > position) continue;
          const double* k = &keys[size_t(j - lo) * rows];
          double dot = 0;
          for (int c = 0; c < rows; ++c) dot += qrow[c] * k[c];
          visible.push_back(j);
          scores.push_back(sm_scale * dot);
        }
        if (visible.empty()) continue;  // o = 0, lse = -inf

        double max_score = kNegInf;
        for (double x : scores) max_score = std::max(max_score, x);
        double sum = 0;
        for (double x : scores) sum += std::exp(x - max_score);
        double* o = &res.o[(size_t(s) * g + h) * width];
        for (size_t t = 0; t < visible.size(); ++t) {
          const double* v = &keys[size_t(visible[t] - lo) * rows];
          const double p = std::exp(scores[t] - max_score) / sum;
          for (int c = 0; c < width; ++c) o[c] += p * v[c];
        }
        res.lse[size_t(s) * g + h] = max_score + std::log(sum);
      }
    }
  }
  return res;
}

}  // namespace

AttendResult attend(const LayerConfig& cfg, const TensorView& q, int heads_g, double q_scale,
                    const KVCache& cache, double k_scale, const StepMeta& meta, const DcpInfo& dcp) {
  const Inputs in{cfg, q, heads_g, q_scale, cache, k_scale, meta, dcp};
  return attend_range(in, [](int64_t n) { return std::pair<int64_t, int64_t>{0, n}; });
}

std::vector<AttendResult> attend_splits(const LayerConfig& cfg, const TensorView& q, int heads_g,
                                        double q_scale, const KVCache& cache, double k_scale,
                                        const StepMeta& meta, const DcpInfo& dcp, int splits) {
  MLA_REQUIRE(splits >= 1, "ref::attend_splits: splits must be >= 1, got ", splits);
  const Inputs in{cfg, q, heads_g, q_scale, cache, k_scale, meta, dcp};
  std::vector<AttendResult> parts;
  for (int c = 0; c < splits; ++c) {
    parts.push_back(attend_range(in, [c, splits](int64_t n) {
      const int64_t chunk = (n + splits - 1) / splits;
      return std::pair<int64_t, int64_t>{std::min(n, c * chunk), std::min(n, (c + 1) * chunk)};
    }));
  }
  return parts;
}

AttendResult merge(std::span<const AttendResult> partials) {
  MLA_REQUIRE(!partials.empty(), "ref::merge: no partials");
  const size_t rows = partials[0].lse.size();
  const size_t width = rows ? partials[0].o.size() / rows : 0;
  for (const AttendResult& p : partials)
    MLA_REQUIRE(p.lse.size() == rows && p.o.size() == rows * width,
                "ref::merge: partials of different shapes: lse ", p.lse.size(), " vs ", rows);

  AttendResult res;
  res.o.assign(rows * width, 0.0);
  res.lse.assign(rows, kNegInf);
  for (size_t r = 0; r < rows; ++r) {
    double max_lse = kNegInf;
    for (const AttendResult& p : partials) max_lse = std::max(max_lse, p.lse[r]);
    if (max_lse == kNegInf) continue;  // every partial empty: o = 0, lse = -inf
    double sum = 0;
    for (const AttendResult& p : partials)
      if (p.lse[r] != kNegInf) sum += std::exp(p.lse[r] - max_lse);
    const double lse = max_lse + std::log(sum);
    res.lse[r] = lse;
    for (const AttendResult& p : partials) {
      if (p.lse[r] == kNegInf) continue;  // an empty partial adds nothing, whatever its o holds
      const double w = std::exp(p.lse[r] - lse);
      for (size_t c = 0; c < width; ++c) res.o[r * width + c] += w * p.o[r * width + c];
    }
  }
  return res;
}

}  // namespace mla::ref
