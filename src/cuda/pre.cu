// pre on the GPU (SPEC.md pre), after the cuBLASLt qkv_a product: the metadata check, one kernel
// per token for the norms, k_pe's RoPE, the cache row and the gate, and the query kernel (q_b's
// output -> ql_nope through W_UK in MXFP4, q_pe's RoPE, quantization into the query view).
// Rounding points match src/cpu/pre.cpp: bf16 after each norm and rotation, fp8 as x / scale.
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda {
namespace {

// Position of query i of request b (rope::token_position): empty requests rotate at 0.
__device__ __forceinline__ int64_t token_position(const int32_t* seq_lens, int qlen, int64_t s) {
  const int32_t len = seq_lens[s / qlen];
  return len > 0 ? int64_t(len) - qlen + s % qlen : 0;
}

// Rotates the pair (x0, x1) by position * inv_freq[i], cos and sin formed in double (the angle
// loses precision in fp32 at long positions), then applied in fp32 as the CPU does. (The 40-byte
// stack frame ptxas reports for pre_norm is double sincos's argument reduction for huge angles,
// taken only for very large angles.)
__device__ __forceinline__ void rope_pair(float& x0, float& x1, int64_t position, const double* inv_freq, int i,
                                         double mscale) {
  double sn, cs;
  sincos(double(position) * inv_freq[i], &sn, &cs);
  const float c = float(cs * mscale), s = float(sn * mscale);
  const float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
  x0 = r0;
  x1 = r1;
}

constexpr int kMetaThreads = 256;

__global__ void __launch_bounds__(kMetaThreads) meta_check_kernel(const __grid_constant__ MetaCheckParams p) {
  uint32_t err = 0;
  const int64_t tokens = int64_t(p.batch) * p.qlen;
  for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
    const int32_t len = p.seq_lens[b];
    if (len < 0 || (len > 0 && len < p.qlen)) err |= kBadSeqLen;
  }
  for (int64_t s = threadIdx.x; s < tokens; s += blockDim.x) {
    const int64_t slot = p.slot_mapping[s];
    if (slot < -1 || slot >= p.num_slots) err |= kBadSlot;
    if (slot >= 0 && p.seq_lens[s / p.qlen] == 0) err |= kBadSeqLen;  // an empty request writes nothing
    if (slot >= 0)
      for (int64_t t = s + 1; t < tokens; ++t)
        if (p.slot_mapping[t] == slot) err |= kDuplicateSlot;
  }
  if (err) atomicOr(p.error, err);
}

constexpr int kNormThreads = 256;

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += scratch[w];
  return total;
}

// One CTA per token.
__global__ void __launch_bounds__(kNormThreads) pre_norm_kernel(const __grid_constant__ PreNormParams p) {
  __shared__ float scratch[kNormThreads / 32];
  __shared__ float kv_row[kRow];  // [kv_c | k_pe] after norm / rotation, bf16-valued
  const int64_t s = blockIdx.x;
  const uint16_t* y = p.y + s * p.y_stride;

  float sq_q = 0.0f, sq_kv = 0.0f;
  for (int i = threadIdx.x; i < p.rq; i += blockDim.x) {
    const float x = bf16_to_float(y[i]);
    sq_q += x * x;
  }
  for (int i = threadIdx.x; i < kLatent; i += blockDim.x) {
    const float x = bf16_to_float(y[p.rq + i]);
    sq_kv += x * x;
  }
  sq_q = block_sum(sq_q, scratch);
  sq_kv = block_sum(sq_kv, scratch);
  const float inv_rms_q = 1.0f / sqrtf(sq_q / float(p.rq) + p.rms_eps);
  const float inv_rms_kv = 1.0f / sqrtf(sq_kv / float(kLatent) + p.rms_eps);

  for (int i = threadIdx.x; i < p.rq; i += blockDim.x)
    p.q_c[s * p.q_c_stride + i] = float_to_bf16(bf16_to_float(y[i]) * inv_rms_q * p.q_a_norm[i]);
  for (int i = threadIdx.x; i < kLatent; i += blockDim.x)
    kv_row[i] = round_bf16(bf16_to_float(y[p.rq + i]) * inv_rms_kv * p.kv_a_norm[i]);
  if (threadIdx.x < kRope / 2) {
    const int i = threadIdx.x;
    float x0 = bf16_to_float(y[p.rq + kLatent + 2 * i]), x1 = bf16_to_float(y[p.rq + kLatent + 2 * i + 1]);
    if (p.inv_freq) rope_pair(x0, x1, token_position(p.seq_lens, p.qlen, s), p.inv_freq, i, p.rope_mscale);
    kv_row[kLatent + 2 * i] = round_bf16(x0);
    kv_row[kLatent + 2 * i + 1] = round_bf16(x1);
  }
  if (p.gate) {
    const uint16_t* logits = y + p.rq + kRow;
    for (int j = threadIdx.x; j < p.gate_dim; j += blockDim.x)
      p.gate[s * p.gate_stride + j] = float_to_bf16(1.0f / (1.0f + expf(-bf16_to_float(logits[j]))));
  }
  __syncthreads();

  // The cache row, unless the metadata check found anything wrong with this step (a rejected
  // step leaves the cache as it was) or this rank does not hold the token.
  const int64_t slot = p.slot_mapping[s];
  if (slot < 0 || slot >= p.num_slots || *p.error != 0) return;
  const int64_t row = (slot / p.page_size) * p.page_stride + (slot % p.page_size) * p.row_stride;
  if (p.cache_fp8) {
    uint8_t* dst = static_cast<uint8_t*>(p.cache) + row;
    for (int i = threadIdx.x; i < kRow; i += blockDim.x) dst[i] = float_to_fp8(kv_row[i] / p.k_scale);
  } else {
    uint16_t* dst = static_cast<uint16_t*>(p.cache) + row;
    for (int i = threadIdx.x; i < kRow; i += blockDim.x) dst[i] = float_to_bf16(kv_row[i]);
  }
}

constexpr int kQueryThreads = 128;  // one latent row l of W_UK^T a thread
constexpr int kQueryTokens = 8;     // tokens sharing each decoded weight row
constexpr int kMaxNope = 256;

__device__ __forceinline__ void store_query(const QueryParams& p, int64_t offset, float v) {
  if (p.out_fp8) static_cast<uint8_t*>(p.out)[offset] = float_to_fp8(v / p.q_scale);
  else static_cast<uint16_t*>(p.out)[offset] = float_to_bf16(v);
}

// grid (N * L/128, ceil(S / 8)). At small S this is memory-bound on W_UK (1.6 bytes a weight):
// each thread streams its row's 16-byte code groups once for up to 8 tokens.
__global__ void __launch_bounds__(kQueryThreads) query_kernel(const __grid_constant__ QueryParams p) {
  __shared__ float q_nope[kQueryTokens][kMaxNope];
  constexpr int kChunks = kLatent / kQueryThreads;
  const int n = blockIdx.x / kChunks, l = (blockIdx.x % kChunks) * kQueryThreads + threadIdx.x;
  const int64_t s0 = int64_t(blockIdx.y) * kQueryTokens;
  const int tokens = int(min(int64_t(kQueryTokens), int64_t(p.tokens) - s0));
  const int head_dim = p.nope_dim + kRope;

  for (int i = threadIdx.x; i < kQueryTokens * p.nope_dim; i += blockDim.x) {
    const int t = i / p.nope_dim, d = i % p.nope_dim;
    q_nope[t][d] = t < tokens ? bf16_to_float(p.q[(s0 + t) * p.q_stride + int64_t(n) * head_dim + d]) : 0.0f;
  }
  __syncthreads();

  // All of the row's code groups are loaded before any is used (latency-bound at small S).
  constexpr int kMaxBlocks = kMaxNope / 32;
  const int blocks = p.nope_dim / 32;
  const uint8_t* codes = p.w_codes + (int64_t(n) * kLatent + l) * (p.nope_dim / 2);
  const uint8_t* scales = p.w_scales + (int64_t(n) * kLatent + l) * blocks;
  uint4 packed[kMaxBlocks];
  uint32_t scale_bits[kMaxBlocks];
#pragma unroll
  for (int blk = 0; blk < kMaxBlocks; ++blk) {
    if (blk < blocks) {
      packed[blk] = *reinterpret_cast<const uint4*>(codes + blk * 16);
      scale_bits[blk] = scales[blk];
    }
  }
  float acc[kQueryTokens] = {};
#pragma unroll
  for (int blk = 0; blk < kMaxBlocks; ++blk) {
    if (blk >= blocks) break;
    const uint32_t words[4] = {packed[blk].x, packed[blk].y, packed[blk].z, packed[blk].w};
    float part[kQueryTokens] = {};
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float wv = e2m1_to_float(words[wi] >> (4 * e));
        const int d = blk * 32 + wi * 8 + e;
#pragma unroll
        for (int t = 0; t < kQueryTokens; ++t) part[t] += wv * q_nope[t][d];
      }
    }
    const float scale = e8m0_to_float(scale_bits[blk]);
#pragma unroll
    for (int t = 0; t < kQueryTokens; ++t) acc[t] += scale * part[t];
  }
  const int h = p.head_offset + n;
#pragma unroll
  for (int t = 0; t < kQueryTokens; ++t)  // constant indices keep acc in registers
    if (t < tokens) store_query(p, (s0 + t) * p.out_s_stride + int64_t(h) * p.out_h_stride + l, acc[t]);

  // q_pe: rotated (RoPE models), rounded to bf16, then quantized like ql_nope.
  if (blockIdx.x % kChunks == 0) {
    for (int i = threadIdx.x; i < tokens * (kRope / 2); i += blockDim.x) {
      const int t = i / (kRope / 2), pair = i % (kRope / 2);
      const int64_t s = s0 + t;
      const uint16_t* qpe = p.q + s * p.q_stride + int64_t(n) * head_dim + p.nope_dim;
      float x0 = bf16_to_float(qpe[2 * pair]), x1 = bf16_to_float(qpe[2 * pair + 1]);
      if (p.inv_freq) {
        rope_pair(x0, x1, token_position(p.seq_lens, p.qlen, s), p.inv_freq, pair, p.rope_mscale);
        x0 = round_bf16(x0);
        x1 = round_bf16(x1);
      }
      const int64_t base = s * p.out_s_stride + int64_t(h) * p.out_h_stride + kLatent + 2 * pair;
      store_query(p, base, x0);
      store_query(p, base + 1, x1);
    }
  }
}

}  // namespace

void launch_meta_check(const MetaCheckParams& p, cudaStream_t stream) {
  meta_check_kernel<<<1, kMetaThreads, 0, stream>>>(p);
  MLA_CUDA_CHECK_LAUNCH();
}

void launch_pre_norm(const PreNormParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  pre_norm_kernel<<<p.tokens, kNormThreads, 0, stream>>>(p);
  MLA_CUDA_CHECK_LAUNCH();
}

void launch_query(const QueryParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  MLA_REQUIRE(p.nope_dim % 32 == 0 && p.nope_dim <= kMaxNope, "CUDA pre: qk_nope_dim must be a multiple of 32 <= ",
              kMaxNope, ", got ", p.nope_dim);
  const dim3 grid(unsigned(p.heads * (kLatent / kQueryThreads)),
                  unsigned((p.tokens + kQueryTokens - 1) / kQueryTokens));
  query_kernel<<<grid, kQueryThreads, 0, stream>>>(p);
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
