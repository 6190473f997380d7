#pragma once
// The online-softmax state and the merge of normalized partials (SPEC.md, attend / split-KV),
// in one place for every user: the CPU and CUDA attend kernels fold blocks of scores into a
// SoftmaxState, and the split merge and the DCP combine merge partials (o_c, lse_c) with
// merge_partials(). This is the only code that decides what -inf and empty partials mean:
//   lse = logsumexp_c lse_c,  o = sum_c exp(lse_c - lse) * o_c,
//   a partial with lse_c = -inf adds nothing, all empty gives o = 0 and lse = -inf (never NaN).
// LSE is the natural log. Header-only and free of std:: containers: it compiles under nvcc for
// device code (MLA_HD) as well as under the host compiler.
#include <math.h>
#include <stdint.h>

#include "mla/host_device.hpp"

namespace mla {

// State of a softmax over the scores seen so far: m = their max, d = sum exp(score - m).
// The output accumulator lives with the caller (a [L] row in registers, scratch or shared memory)
// and is kept in the same frame as d: unnormalized, sum exp(score - m) * v. The merge of two
// states of normalized outputs (merge_weights) serves partials whose o is already divided by d.
struct SoftmaxState {
  float m = -INFINITY;
  float d = 0.0f;

  // A partial that is already normalized: lse_c as the max and 1 as the sum (exp(lse_c - lse_c)).
  // An empty partial (lse = -inf) becomes the empty state.
  MLA_HD static SoftmaxState from_lse(float lse) {
    SoftmaxState s;
    if (lse != -INFINITY) {
      s.m = lse;
      s.d = 1.0f;
    }
    return s;
  }

  MLA_HD bool empty() const { return !(d > 0.0f); }

  // Moves the state to a new max before a block of scores whose max is m_block is added: returns
  // alpha, the factor by which the caller must scale its accumulated output (and d is scaled
  // here). alpha is 1 when the max does not grow and 0 when the state was empty, so an empty
  // state never produces exp(-inf - -inf) = NaN.
  MLA_HD float rescale(float m_block) {
    const float m_new = fmaxf(m, m_block);
    if (m_new == m) return 1.0f;
    const float alpha = (m == -INFINITY) ? 0.0f : expf(m - m_new);
    d *= alpha;
    m = m_new;
    return alpha;
  }

  // exp(score - m) for a score of the current block (after rescale): the weight of its value row.
  // A masked score of -inf gets 0.
  MLA_HD float weight(float score) const { return score == -INFINITY ? 0.0f : expf(score - m); }
  MLA_HD void add(float w) { d += w; }

  // Adds one score directly (rescale + weight + add); returns {alpha, weight} through refs.
  MLA_HD void push(float score, float& alpha, float& w) {
    alpha = rescale(score);
    w = weight(score);
    add(w);
  }

  // Factor that turns the accumulated output into the normalized o: 1/d, or 0 when empty so that
  // an empty row comes out o = 0.
  MLA_HD float inv_sum() const { return empty() ? 0.0f : 1.0f / d; }
  // ln sum exp(score): -inf when empty.
  MLA_HD float lse() const { return empty() ? -INFINITY : m + logf(d); }

  // Merges another state into this one, for outputs normalized by their own d (FlashInfer
  // state_t::merge): afterwards o = w_self * o_self + w_other * o_other. Both weights are 0 when
  // both states are empty.
  MLA_HD void merge(const SoftmaxState& other, float& w_self, float& w_other) {
    const float m_new = fmaxf(m, other.m);
    if (m_new == -INFINITY) {  // both empty
      w_self = w_other = 0.0f;
      return;
    }
    const float a = empty() ? 0.0f : d * expf(m - m_new);
    const float b = other.empty() ? 0.0f : other.d * expf(other.m - m_new);
    const float sum = a + b;
    w_self = a / sum;
    w_other = b / sum;
    m = m_new;
    d = sum;
  }
};

// Weight of a normalized partial with log-sum-exp lse_c in the merge whose total is lse:
// exp(lse_c - lse), and exactly 0 for an empty partial (lse_c = -inf, which also covers lse = -inf).
MLA_HD float merge_weight(float lse_c, float lse) {
  return lse_c == -INFINITY ? 0.0f : expf(lse_c - lse);
}

// logsumexp of n partial LSEs at lse[c * lse_stride]; -inf when every partial is empty.
MLA_HD float merged_lse(int n, const float* lse, int64_t lse_stride) {
  float m = -INFINITY;
  for (int c = 0; c < n; ++c) m = fmaxf(m, lse[c * lse_stride]);
  if (m == -INFINITY) return -INFINITY;
  float sum = 0.0f;
  for (int c = 0; c < n; ++c) sum += merge_weight(lse[c * lse_stride], m);
  return m + logf(sum);
}

// Merges n normalized partials into out [len] (float) and returns the merged lse.
// Partial c: o at o + c * o_stride (len elements of type T read through to_float(T) -> float),
// lse at lse[c * lse_stride]. All empty: out = 0, returns -inf. The o of an empty partial is
// never read (weight 0), so garbage there cannot leak into the result.
template <class T, class ToFloat>
MLA_HD float merge_partials(int n, const float* lse, int64_t lse_stride, const T* o, int64_t o_stride,
                            int len, float* out, ToFloat to_float) {
  const float total = merged_lse(n, lse, lse_stride);
  for (int l = 0; l < len; ++l) out[l] = 0.0f;
  if (total == -INFINITY) return total;
  for (int c = 0; c < n; ++c) {
    const float w = merge_weight(lse[c * lse_stride], total);
    if (w == 0.0f) continue;  // empty (or negligible) partials are not read: their o may be anything
    const T* oc = o + c * o_stride;
    for (int l = 0; l < len; ++l) out[l] += w * to_float(oc[l]);
  }
  return total;
}

// The float-partials case.
MLA_HD float merge_partials(int n, const float* lse, int64_t lse_stride, const float* o, int64_t o_stride,
                            int len, float* out) {
  struct Identity {
    MLA_HD float operator()(float x) const { return x; }
  };
  return merge_partials(n, lse, lse_stride, o, o_stride, len, out, Identity{});
}

}  // namespace mla
