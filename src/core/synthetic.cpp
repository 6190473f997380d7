// Synthetic decode steps (synthetic.hpp). The history is generated row by row from a counter-based
// seed so that the result does not depend on the thread count, and with a cheap generator: a
// kimi-k3 batch of 16 x 4096 tokens is 38M cache values and must build in about a second.
#include "core/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "mla/dcp.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"

namespace mla::synth {

namespace {

// splitmix64: a counter-based stream, one per row.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Approximately N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled to
  // unit variance. Bounded by +-3.46: enough spread for softmax, no outliers to saturate fp8.
  float normal() {
    const uint64_t r = next();
    const float sum = float(r & 0xFFFF) + float((r >> 16) & 0xFFFF) + float((r >> 32) & 0xFFFF) +
                      float(r >> 48);
    constexpr float kMean = 2.0f * 65535.0f;
    constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(12 / 4) / 2^16
    return (sum - kMean) * kScale;
  }
};

uint64_t mix_seed(uint64_t seed, uint64_t stream, uint64_t index) {
  SplitMix m{seed ^ (stream * 0xD1B54A32D192ED03ull) ^ (index * 0x8CB92BA72F3D8DD7ull)};
  return m.next();
}

Tensor make_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(DType::i32, {int64_t(v.size())});
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

void validate_spec(const ScenarioSpec& s) {
  s.cfg.validate();
  MLA_REQUIRE(s.qlen >= 1 && s.qlen <= 8, "make_scenario: qlen: expected 1..8, got ", s.qlen);
  MLA_REQUIRE(s.page_size >= 1, "make_scenario: page_size: expected >= 1, got ", s.page_size);
  MLA_REQUIRE(s.kv_dtype == DType::fp8_e4m3 || s.kv_dtype == DType::bf16,
              "make_scenario: kv_dtype: expected fp8_e4m3 or bf16, got ", dtype_name(s.kv_dtype));
  MLA_REQUIRE(s.dcp.size >= 1 && s.dcp.rank >= 0 && s.dcp.rank < s.dcp.size && s.dcp.interleave >= 1,
              "make_scenario: dcp: expected size >= 1, rank in [0, size), interleave >= 1, got size ",
              s.dcp.size, " rank ", s.dcp.rank, " interleave ", s.dcp.interleave);
  MLA_REQUIRE(s.spare_pages >= 0, "make_scenario: spare_pages: expected >= 0, got ", s.spare_pages);
  MLA_REQUIRE(!s.seq_lens.empty(), "make_scenario: seq_lens: expected at least one request, got none");
  for (size_t b = 0; b < s.seq_lens.size(); ++b)
    MLA_REQUIRE(s.seq_lens[b] == 0 || s.seq_lens[b] >= s.qlen, "make_scenario: seq_lens[", b,
                "]: expected 0 or >= qlen ", s.qlen, ", got ", s.seq_lens[b]);
}

}  // namespace

Scenario make_scenario(const ScenarioSpec& spec, float k_scale) {
  validate_spec(spec);
  MLA_REQUIRE(std::isfinite(k_scale) && k_scale > 0, "make_scenario: k_scale: expected finite > 0, got ",
              k_scale);
  const LayerConfig& cfg = spec.cfg;
  const int batch = int(spec.seq_lens.size()), qlen = spec.qlen, ps = spec.page_size;
  const int64_t tokens = int64_t(batch) * qlen, row_dim = cfg.row_dim();

  Scenario sc;
  sc.spec = spec;
  sc.seq_lens_host = spec.seq_lens;
  sc.seq_lens = make_i32(spec.seq_lens);

  // Page table: each request gets ceil(local_len / page_size) pages, drawn from a (shuffled)
  // permutation of all pages; the rest are spare.
  std::vector<int64_t> local_len(static_cast<size_t>(batch));
  std::vector<int32_t> indptr(size_t(batch) + 1, 0);
  for (int b = 0; b < batch; ++b) {
    local_len[size_t(b)] = dcp::local_length(spec.dcp, spec.seq_lens[size_t(b)]);
    indptr[size_t(b) + 1] = indptr[size_t(b)] + int32_t((local_len[size_t(b)] + ps - 1) / ps);
  }
  const int64_t num_pages = int64_t(indptr.back()) + spec.spare_pages;
  std::vector<int32_t> order(static_cast<size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  if (spec.shuffle_pages) {
    std::mt19937_64 rng(mix_seed(spec.seed, 1, 0));
    std::shuffle(order.begin(), order.end(), rng);
  }
  const std::vector<int32_t> indices(order.begin(), order.begin() + indptr.back());
  sc.kv_indptr = make_i32(indptr);
  sc.kv_indices = make_i32(indices);

  // This step's tokens: the rows pre writes, where this rank owns the position.
  sc.slot_mapping = Tensor::empty(DType::i64, {tokens});
  dcp::slot_mapping(spec.dcp, spec.seq_lens, qlen, indptr, indices, ps,
                    std::span<int64_t>(sc.slot_mapping.ptr<int64_t>(), size_t(tokens)));

  // The cache: NaN (or zero) everywhere nothing is stored, random history rows elsewhere.
  const bool fp8 = spec.kv_dtype == DType::fp8_e4m3;
  sc.cache = Tensor::empty(spec.kv_dtype, {num_pages, ps, row_dim});
  const int64_t cache_elems = num_pages * ps * row_dim;
  if (fp8) {
    std::memset(sc.cache.data(), spec.nan_fill ? 0x7F : 0, size_t(cache_elems));
  } else {
    const uint16_t fill = spec.nan_fill ? 0x7FC0 : 0;
    std::fill_n(sc.cache.ptr<uint16_t>(), cache_elems, fill);
  }
  // History rows: [kv_c | k_pe] as pre makes them, unit-variance values rounded to bf16 (pre's
  // output format) and then, for an fp8 cache, quantized with k_scale.
  // The fp8 code of every bf16 value at this k_scale: one table lookup per element instead of a
  // conversion (the fp8 cache is built 3-4x faster).
  std::vector<uint8_t> fp8_of_bf16;
  if (fp8) {
    fp8_of_bf16.resize(65536);
    for (uint32_t bits = 0; bits < 65536; ++bits)
      fp8_of_bf16[bits] = float_to_fp8e4m3(bf16_to_float(uint16_t(bits)) / k_scale);
  }
  const int64_t total_rows = int64_t(indptr.back()) * ps;  // rows of the requests' pages
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t r = 0; r < total_rows; ++r) {
    // r enumerates the requests' page rows in page-table order: find the request and local index.
    const int64_t k = r / ps;  // position in kv_indices
    const int b = int(std::upper_bound(indptr.begin(), indptr.end(), int32_t(k)) - indptr.begin()) - 1;
    const int64_t j = (k - indptr[size_t(b)]) * ps + r % ps;
    if (j >= local_len[size_t(b)]) continue;  // page tail: nothing stored
    const int64_t p = dcp::global_position(spec.dcp, j);
    if (p >= int64_t(spec.seq_lens[size_t(b)]) - qlen) continue;  // this step's row: pre writes it
    SplitMix rng{mix_seed(spec.seed, 2 + uint64_t(b), uint64_t(p))};
    const int64_t row = int64_t(indices[size_t(k)]) * ps + r % ps;
    if (fp8) {
      uint8_t* dst = sc.cache.ptr<uint8_t>() + row * row_dim;
      for (int64_t c = 0; c < row_dim; ++c) dst[c] = fp8_of_bf16[float_to_bf16(rng.normal())];
    } else {
      uint16_t* dst = sc.cache.ptr<uint16_t>() + row * row_dim;
      for (int64_t c = 0; c < row_dim; ++c) dst[c] = float_to_bf16(rng.normal());
    }
  }

  // hidden: rows like input_layernorm's output, scaled to unit RMS before the bf16 rounding.
  sc.hidden = Tensor::empty(DType::bf16, {tokens, int64_t(cfg.hidden)});
  std::vector<float> row(static_cast<size_t>(cfg.hidden));
  for (int64_t s = 0; s < tokens; ++s) {
    SplitMix rng{mix_seed(spec.seed, 0, uint64_t(s))};
    double ss = 0;
    for (float& x : row) {
      x = rng.normal();
      ss += double(x) * x;
    }
    const float inv_rms = float(1.0 / std::sqrt(ss / cfg.hidden));
    uint16_t* dst = sc.hidden.ptr<uint16_t>() + s * cfg.hidden;
    for (int c = 0; c < cfg.hidden; ++c) dst[c] = float_to_bf16(row[size_t(c)] * inv_rms);
  }
  return sc;
}

StepMeta Scenario::meta() const {
  return StepMeta{.qlen = spec.qlen,
                  .seq_lens = seq_lens.view(),
                  .kv_indptr = kv_indptr.view(),
                  .kv_indices = kv_indices.view(),
                  .slot_mapping = slot_mapping.view(),
                  .seq_lens_host = std::span<const int32_t>(seq_lens_host)};
}

KVCache Scenario::kv() const { return KVCache{.pages = cache.view()}; }

Scenario to_device(const Scenario& host, int device_index) {
  auto copy = [device_index](const Tensor& t) {
    const TensorView& v = t.view();
    Tensor d = Tensor::empty(v.dtype, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.rank),
                             Device::cuda, device_index);
    d.copy_from(v);
    return d;
  };
  Scenario d;
  d.spec = host.spec;
  d.seq_lens_host = host.seq_lens_host;
  d.hidden = copy(host.hidden);
  d.seq_lens = copy(host.seq_lens);
  d.kv_indptr = copy(host.kv_indptr);
  d.kv_indices = copy(host.kv_indices);
  d.slot_mapping = copy(host.slot_mapping);
  d.cache = copy(host.cache);
  return d;
}

}  // namespace mla::synth
