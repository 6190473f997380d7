#include "core/rope.hpp"

#include <algorithm>
#include <numbers>

namespace mla::rope {

namespace {
// The dimension index whose wavelength makes `rotations` turns over `max_position` tokens.
double correction_dim(double rotations, int dim, double theta, double max_position) {
  return dim * std::log(max_position / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
}
}  // namespace

double yarn_get_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

double yarn_cos_sin_mscale(const YarnParams& y) {
  return yarn_get_mscale(y.factor, y.mscale) / yarn_get_mscale(y.factor, y.mscale_all_dim);
}

std::vector<double> yarn_inv_freq(const YarnParams& y, int dim) {
  const int pairs = dim / 2;
  // Correction range, floored/ceiled and clamped to [0, dim-1] as in DeepSeek's code.
  const double low = std::max(std::floor(correction_dim(y.beta_fast, dim, y.theta, y.original_max_position)), 0.0);
  double high = std::min(std::ceil(correction_dim(y.beta_slow, dim, y.theta, y.original_max_position)),
                         double(dim - 1));
  if (low == high) high += 0.001;  // DeepSeek's guard against a zero-width ramp
  std::vector<double> inv_freq(pairs);
  for (int i = 0; i < pairs; ++i) {
    const double extrapolated = 1.0 / std::pow(y.theta, 2.0 * i / dim);
    const double interpolated = extrapolated / y.factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);  // 0: fast pair, 1: slow pair
    inv_freq[i] = interpolated * ramp + extrapolated * (1.0 - ramp);
  }
  return inv_freq;
}

RopeTable make_table(const LayerConfig& cfg) {
  RopeTable t;
  if (cfg.rope != RopeType::yarn || cfg.qk_rope_dim == 0) return t;
  t.enabled = true;
  t.inv_freq = yarn_inv_freq(cfg.yarn, cfg.qk_rope_dim);
  t.mscale = yarn_cos_sin_mscale(cfg.yarn);
  return t;
}

}  // namespace mla::rope
