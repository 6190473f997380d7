#include "support/testing.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "core/backend.hpp"
#include "mla/error.hpp"
#include "mla/formats.hpp"

namespace mla::testing {

namespace {

// Byte offset of logical element i (row-major over the view's shape).
int64_t byte_offset(const TensorView& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.rank - 1; d >= 0; --d) {
    off += (i % v.shape[d]) * v.stride[d];
    i /= v.shape[d];
  }
  return off * int64_t(dtype_size(v.dtype));
}

std::string index_str(const TensorView& v, int64_t i) {
  std::vector<int64_t> idx(v.rank);
  for (int d = v.rank - 1; d >= 0; --d) {
    idx[d] = i % v.shape[d];
    i /= v.shape[d];
  }
  std::ostringstream os;
  os << "[";
  for (int d = 0; d < v.rank; ++d) os << (d ? ", " : "") << idx[d];
  os << "]";
  return os.str();
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    f = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    f = std::ldexp(float(man | 0x400), int(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool all_ff(const uint8_t* p, size_t n) {
  for (size_t k = 0; k < n; ++k)
    if (p[k] != 0xFF) return false;
  return true;
}

bool is_float(DType dt) {
  return dt == DType::bf16 || dt == DType::f16 || dt == DType::f32 || dt == DType::f64 ||
         dt == DType::fp8_e4m3;
}

}  // namespace

void poison(const TensorView& t) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const size_t es = dtype_size(t.dtype);
  if (t.device == Device::cpu) {
    auto* base = static_cast<uint8_t*>(t.data);
    for (int64_t i = 0; i < n; ++i) std::memset(base + byte_offset(t, i), 0xFF, es);
    return;
  }
  // Device: one copy per contiguous innermost run, so a strided view's pad is left alone.
  const bool inner_contiguous = t.stride[t.rank - 1] == 1;
  const int64_t run = inner_contiguous ? t.shape[t.rank - 1] : 1;
  const std::vector<uint8_t> pattern(size_t(run) * es, 0xFF);
  if (t.is_contiguous()) {
    const std::vector<uint8_t> all(size_t(n) * es, 0xFF);
    detail::cuda_copy(t.data, all.data(), all.size());
    return;
  }
  for (int64_t i = 0; i < n; i += run)
    detail::cuda_copy(static_cast<uint8_t*>(t.data) + byte_offset(t, i), pattern.data(), pattern.size());
}

int64_t count_poison(const TensorView& host) {
  MLA_REQUIRE(host.device == Device::cpu, "count_poison: expected a host view, got ", host.str());
  const size_t es = dtype_size(host.dtype);
  const auto* base = static_cast<const uint8_t*>(host.data);
  int64_t count = 0;
  for (int64_t i = 0, n = host.numel(); i < n; ++i) count += all_ff(base + byte_offset(host, i), es);
  return count;
}

bool has_poison(const TensorView& host) { return count_poison(host) > 0; }

double element(const TensorView& host, int64_t i) {
  MLA_REQUIRE(host.device == Device::cpu, "element: expected a host view, got ", host.str());
  MLA_REQUIRE(i >= 0 && i < host.numel(), "element: index ", i, " out of range [0, ", host.numel(), ")");
  const auto* p = static_cast<const uint8_t*>(host.data) + byte_offset(host, i);
  switch (host.dtype) {
    case DType::bf16: { uint16_t b; std::memcpy(&b, p, 2); return bf16_to_float(b); }
    case DType::f16: { uint16_t b; std::memcpy(&b, p, 2); return half_to_float(b); }
    case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::f64: { double f; std::memcpy(&f, p, 8); return f; }
    case DType::fp8_e4m3: return fp8e4m3_to_float(*p);
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::i64: { int64_t v; std::memcpy(&v, p, 8); return double(v); }
    case DType::u8: return *p;
  }
  detail::fail("element: unknown dtype ", int(host.dtype));
}

std::vector<double> to_doubles(const TensorView& host) {
  std::vector<double> out(size_t(host.numel()));
  for (int64_t i = 0; i < host.numel(); ++i) out[size_t(i)] = element(host, i);
  return out;
}

Compare compare(const TensorView& a, const double* ref) {
  MLA_REQUIRE(is_float(a.dtype), "compare: expected a float view, got ", a.str());
  Compare c;
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0, n = a.numel(); i < n; ++i) {
    const double x = element(a, i), r = ref[i];
    if (!std::isfinite(x) || !std::isfinite(r)) {
      const bool same = (std::isnan(x) && std::isnan(r)) || x == r;
      if (!same) {
        std::ostringstream os;
        os << "element " << index_str(a, i) << " of " << a.str() << ": got " << x << ", expected " << r;
        c.why = os.str();
        c.rel_l2 = std::numeric_limits<double>::infinity();
        return c;
      }
      continue;
    }
    diff2 += (x - r) * (x - r);
    ref2 += r * r;
    c.max_abs = std::max(c.max_abs, std::abs(x - r));
  }
  c.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return c;
}

std::vector<uint8_t> snapshot(const TensorView& t) {
  const size_t bytes = size_t(t.extent()) * dtype_size(t.dtype);
  std::vector<uint8_t> out(bytes);
  if (bytes == 0) return out;
  if (t.device == Device::cpu)
    std::memcpy(out.data(), t.data, bytes);
  else
    detail::cuda_copy(out.data(), t.data, bytes);
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// --- random configurations ------------------------------------------------------------------

LayerConfig small_config(std::string_view preset, GateLayout gate, int heads_per_rank) {
  LayerConfig c = LayerConfig::preset(preset);
  c.hidden = 256;
  c.q_lora_rank = 128;
  c.total_heads = heads_per_rank * c.tp_size;
  c.gate = gate;
  c.validate();
  return c;
}

SmallModel small_model(std::string_view preset, GateLayout gate, int heads, std::vector<int32_t> lens, int qlen,
                       int page_size, uint64_t seed) {
  SmallModel m;
  m.cfg = small_config(preset, gate, heads);
  m.w = prepare_weights(m.cfg, random_checkpoint_weights(m.cfg, seed));
  m.spec = {.cfg = m.cfg, .seq_lens = std::move(lens), .qlen = qlen, .page_size = page_size, .seed = seed + 1};
  return m;
}

namespace {

template <class T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

}  // namespace

RandomCase random_case(uint64_t seed, const RandomCaseLimits& lim) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 12345);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };

  RandomCase rc;
  synth::ScenarioSpec& s = rc.spec;
  const std::vector<std::string> presets = LayerConfig::preset_names();
  const std::string& preset = pick(rng, presets);
  const GateLayout gate = pick(rng, std::vector<GateLayout>{GateLayout::none, GateLayout::merged,
                                                           GateLayout::separate});
  if (lim.small_model) {
    s.cfg = small_config(preset, gate, pick(rng, std::vector<int>{1, 2, 3, 5, 8}));
  } else {
    s.cfg = LayerConfig::preset(preset);
    s.cfg.gate = gate;
  }
  s.qlen = uniform(1, std::max(1, lim.max_qlen));
  s.page_size = pick(rng, lim.page_sizes);
  s.kv_dtype = lim.allow_bf16_kv && chance(0.3) ? DType::bf16 : DType::fp8_e4m3;
  s.dcp.size = lim.dcp_size;
  s.dcp.rank = uniform(0, lim.dcp_size - 1);
  s.dcp.interleave = pick(rng, lim.interleaves);
  s.shuffle_pages = chance(0.9);
  s.spare_pages = uniform(0, 4);
  s.nan_fill = true;
  s.seed = seed;

  // Uneven lengths: empty requests, short ones (within a page or two), long ones.
  const int batch = uniform(lim.min_batch, std::max(lim.min_batch, lim.max_batch));
  s.seq_lens.resize(size_t(batch));
  int64_t total = 0;
  for (int32_t& len : s.seq_lens) {
    if (chance(lim.empty_fraction)) {
      len = 0;
    } else if (chance(0.3)) {
      len = uniform(s.qlen, std::max(s.qlen, std::min(lim.max_context, 2 * s.page_size + s.qlen)));
    } else {
      len = uniform(s.qlen, std::max(s.qlen, lim.max_context));
    }
    total += len;
  }
  if (total > lim.max_total_context) {
    const double f = double(lim.max_total_context) / double(total);
    for (int32_t& len : s.seq_lens)
      if (len > 0) len = std::max(s.qlen, int32_t(len * f));
  }

  rc.q_dtype = lim.allow_bf16_q && lim.dcp_size == 1 && chance(0.3) ? DType::bf16 : DType::fp8_e4m3;
  rc.num_splits = uniform(1, 4);
  const int g = s.cfg.heads() * lim.dcp_size;
  rc.q_head_pad = chance(0.3) ? g + uniform(1, 8) : 0;
  return rc;
}

std::string RandomCase::describe() const {
  std::ostringstream os;
  int64_t total = 0;
  int empty = 0;
  for (int32_t l : spec.seq_lens) {
    total += l;
    empty += l == 0;
  }
  const char* gates[] = {"none", "merged", "separate"};
  os << spec.cfg.name << " N=" << spec.cfg.heads() << " D=" << spec.cfg.hidden
     << " gate=" << gates[int(spec.cfg.gate)] << " B=" << spec.seq_lens.size() << " (empty " << empty
     << ", total ctx " << total << ") Q=" << spec.qlen << " page=" << spec.page_size
     << " kv=" << dtype_name(spec.kv_dtype) << " q=" << dtype_name(q_dtype) << " splits=" << num_splits
     << " q_head_pad=" << q_head_pad << " dcp=" << spec.dcp.rank << "/" << spec.dcp.size << " I="
     << spec.dcp.interleave << " seed=" << spec.seed << " seq_lens=[";
  for (size_t b = 0; b < spec.seq_lens.size() && b < 16; ++b) os << (b ? "," : "") << spec.seq_lens[b];
  if (spec.seq_lens.size() > 16) os << ",...";
  os << "]";
  return os.str();
}

}  // namespace mla::testing
