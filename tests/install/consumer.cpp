// The README's C++ example (CPU backend) against an installed mla_decode: a step of two requests,
// then the same step stage by stage; the outputs must be finite and the two paths must agree.
#include <mla/mla.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace mla;

int main() {
  const LayerConfig cfg = LayerConfig::preset("deepseek-v3");
  LayerConfig small = cfg;
  small.hidden = 512, small.q_lora_rank = 128;  // a small layer, the preset's attention shapes
  const PreparedWeights w = prepare_weights(small, random_checkpoint_weights(small, /*seed=*/1));
  Layer layer(small, w, {.backend = Backend::cpu, .q_dtype = DType::fp8_e4m3, .max_tokens = 8});

  const int B = 2, Q = 1, S = B * Q, page_size = 64;
  std::vector<int32_t> seq_lens{100, 30}, kv_indptr{0, 2, 3}, kv_indices{0, 1, 2};
  std::vector<int64_t> slot_mapping{1 * page_size + 35, 2 * page_size + 29};
  Tensor cache = Tensor::empty(DType::fp8_e4m3, {3, page_size, small.row_dim()});
  Tensor hidden = Tensor::empty(DType::bf16, {S, small.hidden});
  std::memset(cache.data(), 0x38, cache.bytes());  // fp8 e4m3 1.0 everywhere
  auto* h = static_cast<uint16_t*>(hidden.data());
  for (int64_t i = 0; i < hidden.view().numel(); ++i) h[i] = 0x3F80 ^ uint16_t((i * 37 % 11) << 4);  // bf16 ~1
  const StepMeta meta{.qlen = Q,
                      .seq_lens = TensorView::contiguous(seq_lens.data(), DType::i32, {B}),
                      .kv_indptr = TensorView::contiguous(kv_indptr.data(), DType::i32, {B + 1}),
                      .kv_indices = TensorView::contiguous(kv_indices.data(), DType::i32, {3}),
                      .slot_mapping = TensorView::contiguous(slot_mapping.data(), DType::i64, {S})};
  Tensor out = Tensor::empty(DType::bf16, {S, small.heads() * small.v_head_dim});
  Tensor cache2 = Tensor::empty(DType::fp8_e4m3, {3, page_size, small.row_dim()});
  cache2.copy_from(cache);
  layer.step(hidden, meta, KVCache{.pages = cache}, out);

  const int64_t G = layer.query_heads();
  Tensor q = Tensor::empty(DType::fp8_e4m3, {S, G, small.row_dim()});
  Tensor o = Tensor::empty(DType::f32, {S, G, small.kv_lora_rank}), lse = Tensor::empty(DType::f32, {S, G});
  Tensor out2 = Tensor::empty(DType::bf16, {S, small.heads() * small.v_head_dim});
  const KVCache kv2{.pages = cache2};
  layer.pre(hidden, meta, kv2, {.q = q});
  layer.attend(q, kv2, meta, {.o = o, .lse = lse});
  layer.post({.o = o, .lse = lse}, TensorView{}, meta, out2);

  const auto* a = static_cast<const uint16_t*>(out.data());
  const auto* b = static_cast<const uint16_t*>(out2.data());
  int bad = 0;
  for (int64_t i = 0; i < out.view().numel(); ++i) {
    uint32_t bits = uint32_t(a[i]) << 16;
    float x;
    std::memcpy(&x, &bits, 4);
    if (!std::isfinite(x) || a[i] != b[i]) ++bad;
  }
  const std::string kernel = layer.last_attend_kernel();  // (the installed API names the kernel it ran)
  std::printf("mla_decode consumer: %lld outputs, %d not finite or differing between step and stages; attend: %s\n",
              static_cast<long long>(out.view().numel()), bad, kernel.c_str());
  return bad == 0 && !kernel.empty() ? 0 : 1;
}
