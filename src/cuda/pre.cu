// pre on the GPU (SPEC.md pre), around the qkv_a and q_b products: the metadata check (its own
// kernel, or inside pre_norm at decode sizes), one kernel for the norms, k_pe's RoPE, the cache
// row and the gate, and the query kernel (q_b's output -> ql_nope through W_UK in MXFP4, q_pe's
// RoPE, quantization into the query view): on the CUDA cores at decode's few tokens
// (query_kernel), on the tensor cores from 16 tokens (query_mma_kernel, mxfp4_mma.cuh).
// Rounding points match src/cpu/pre.cpp: bf16 after each norm and rotation, fp8 as x / scale.
#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/mxfp4_mma.cuh"
#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda {
namespace {

// Position of query i of request b (rope::token_position): empty requests rotate at 0.
__device__ __forceinline__ int64_t token_position(int32_t len, int qlen, int64_t s) {
  return len > 0 ? int64_t(len) - qlen + s % qlen : 0;
}
__device__ __forceinline__ int64_t token_position(const int32_t* seq_lens, int qlen, int64_t s) {
  return token_position(seq_lens[s / qlen], qlen, s);
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

// The step's metadata check, threadIdx.x's share of it (requests and tokens strided by blockDim.x);
// seq_lens and slot_mapping in global or shared memory. Returns the error bits found.
__device__ __forceinline__ uint32_t check_metadata(const int32_t* seq_lens, const int64_t* slot_mapping, int batch,
                                                   int qlen, int64_t num_slots) {
  uint32_t err = 0;
  const int64_t tokens = int64_t(batch) * qlen;
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    const int32_t len = seq_lens[b];
    if (len < 0 || (len > 0 && len < qlen)) err |= kBadSeqLen;
  }
  for (int64_t s = threadIdx.x; s < tokens; s += blockDim.x) {
    const int64_t slot = slot_mapping[s];
    if (slot < -1 || slot >= num_slots) err |= kBadSlot;
    if (slot >= 0 && seq_lens[s / qlen] == 0) err |= kBadSeqLen;  // an empty request writes nothing
    if (slot >= 0)
      for (int64_t t = s + 1; t < tokens; ++t)
        if (slot_mapping[t] == slot) err |= kDuplicateSlot;
  }
  return err;
}

__global__ void __launch_bounds__(kMetaThreads) meta_check_kernel(const __grid_constant__ MetaCheckParams p) {
  const uint32_t err = check_metadata(p.seq_lens, p.slot_mapping, p.batch, p.qlen, p.num_slots);
  if (err) atomicOr(p.error, err);
}

constexpr int kNormThreads = 256;
constexpr int kNormQPer = 8;                           // q_c elements a thread holds: Rq <= 2048 in registers
constexpr int kNormKvPer = kLatent / kNormThreads;     // kv_c elements a thread holds
constexpr int kGatePer = 8;                            // gate elements a thread of a gate CTA converts
static_assert(kLatent % kNormThreads == 0 && kRope / 2 <= 32, "pre_norm's thread layout");
static_assert(kFusedCheckTokens <= kNormThreads, "pre_norm stages the fused check's metadata one entry a thread");

// grid (S, 1 + gate CTAs). blockIdx.y == 0: the token's two RMSNorms, k_pe's RoPE and its cache
// row (and, for S <= kFusedCheckTokens, the step's metadata check, done by every token's CTA on
// the whole step so that none writes a rejected step); blockIdx.y > 0: kGatePer * kNormThreads
// gate elements each. At decode sizes this is latency-bound, so every thread issues all of its
// loads (y, the norm weights, the slot, the error word, the metadata) before it uses any. The
// norms' sums are taken in the same order as the CPU-checked one-CTA loop of the first version.
__global__ void __launch_bounds__(kNormThreads) pre_norm_kernel(const __grid_constant__ PreNormParams p) {
  const int64_t s = blockIdx.x;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint16_t* y = p.y + s * p.y_stride;
  allow_dependents();

  if (blockIdx.y > 0) {  // the gate: sigmoid of the logits after [q_c | kv_c | k_pe]
    wait_for_prior_grids();
    const uint16_t* logits = y + p.rq + kRow;
    const int j0 = int(blockIdx.y - 1) * kGatePer * kNormThreads + tid;
    uint16_t raw[kGatePer];
#pragma unroll
    for (int k = 0; k < kGatePer; ++k)
      if (j0 + k * kNormThreads < p.gate_dim) raw[k] = logits[j0 + k * kNormThreads];
#pragma unroll
    for (int k = 0; k < kGatePer; ++k) {
      const int j = j0 + k * kNormThreads;
      if (j < p.gate_dim) p.gate[s * p.gate_stride + j] = float_to_bf16(1.0f / (1.0f + expf(-bf16_to_float(raw[k]))));
    }
    return;
  }

  __shared__ float scratch[2][kNormThreads / 32];
  __shared__ int32_t step_lens[kFusedCheckTokens];
  __shared__ int64_t step_slots[kFusedCheckTokens];

  // 1. Every load, before any is used: the norm weights, then (once qkv_a's y is complete) y,
  //    the slot, the error word and the metadata.
  float xq[kNormQPer], wq[kNormQPer], xkv[kNormKvPer], wkv[kNormKvPer];
#pragma unroll
  for (int k = 0; k < kNormQPer; ++k) {
    const int i = tid + k * kNormThreads;
    wq[k] = i < p.rq ? p.q_a_norm[i] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kNormKvPer; ++k) wkv[k] = p.kv_a_norm[tid + k * kNormThreads];
  wait_for_prior_grids();
#pragma unroll
  for (int k = 0; k < kNormQPer; ++k) {
    const int i = tid + k * kNormThreads;
    xq[k] = i < p.rq ? bf16_to_float(y[i]) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kNormKvPer; ++k) xkv[k] = bf16_to_float(y[p.rq + tid + k * kNormThreads]);
  float pe0 = 0.0f, pe1 = 0.0f;
  int32_t len = 0;
  if (tid < kRope / 2) {
    pe0 = bf16_to_float(y[p.rq + kLatent + 2 * tid]);
    pe1 = bf16_to_float(y[p.rq + kLatent + 2 * tid + 1]);
    if (p.inv_freq) len = p.seq_lens[s / p.qlen];
  }
  const int64_t slot = p.slot_mapping[s];
  const uint32_t earlier_error = *p.error;  // sticky bits of an earlier check (meta_check_kernel or a past step)
  if (p.check_meta) {
    if (tid < p.tokens) step_slots[tid] = p.slot_mapping[tid];
    if (tid < p.batch) step_lens[tid] = p.seq_lens[tid];
  }

  // 2. The two sums of squares, warp-reduced, then across warps after the barrier below.
  float sq_q = 0.0f, sq_kv = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormQPer; ++k) sq_q += xq[k] * xq[k];
  for (int i = tid + kNormQPer * kNormThreads; i < p.rq; i += kNormThreads) {
    const float x = bf16_to_float(y[i]);
    sq_q += x * x;
  }
#pragma unroll
  for (int k = 0; k < kNormKvPer; ++k) sq_kv += xkv[k] * xkv[k];
  for (int o = 16; o > 0; o >>= 1) {
    sq_q += __shfl_xor_sync(0xffffffffu, sq_q, o);
    sq_kv += __shfl_xor_sync(0xffffffffu, sq_kv, o);
  }
  if (lane == 0) {
    scratch[0][warp] = sq_q;
    scratch[1][warp] = sq_kv;
  }
  uint32_t err = 0;
  if (p.check_meta) {
    __syncthreads();  // step_lens and step_slots
    err = check_metadata(step_lens, step_slots, p.batch, p.qlen, p.num_slots);
    if (err) atomicOr(p.error, err);
  }
  const bool rejected = __syncthreads_or(err != 0) || earlier_error != 0;  // also publishes scratch
  sq_q = 0.0f;
  sq_kv = 0.0f;
  for (int w = 0; w < kNormThreads / 32; ++w) {
    sq_q += scratch[0][w];
    sq_kv += scratch[1][w];
  }
  const float inv_rms_q = 1.0f / sqrtf(sq_q / float(p.rq) + p.rms_eps);
  const float inv_rms_kv = 1.0f / sqrtf(sq_kv / float(kLatent) + p.rms_eps);

  // 3. q_c.
  uint16_t* q_c = p.q_c + s * p.q_c_stride;
#pragma unroll
  for (int k = 0; k < kNormQPer; ++k) {
    const int i = tid + k * kNormThreads;
    if (i < p.rq) q_c[i] = float_to_bf16(xq[k] * inv_rms_q * wq[k]);
  }
  for (int i = tid + kNormQPer * kNormThreads; i < p.rq; i += kNormThreads)
    q_c[i] = float_to_bf16(bf16_to_float(y[i]) * inv_rms_q * p.q_a_norm[i]);

  // 4. The cache row [kv_c | k_pe] (bf16-rounded after the norm and the rotation), unless the
  //    step was rejected (a rejected step leaves the cache as it was) or this rank does not hold
  //    the token.
  if (rejected || slot < 0 || slot >= p.num_slots) return;
  float kv[kNormKvPer];
#pragma unroll
  for (int k = 0; k < kNormKvPer; ++k) kv[k] = round_bf16(xkv[k] * inv_rms_kv * wkv[k]);
  if (tid < kRope / 2 && p.inv_freq) rope_pair(pe0, pe1, token_position(len, p.qlen, s), p.inv_freq, tid, p.rope_mscale);
  pe0 = round_bf16(pe0);
  pe1 = round_bf16(pe1);
  const int64_t row = (slot / p.page_size) * p.page_stride + (slot % p.page_size) * p.row_stride;
  if (p.cache_fp8) {
    uint8_t* dst = static_cast<uint8_t*>(p.cache) + row;
#pragma unroll
    for (int k = 0; k < kNormKvPer; ++k) dst[tid + k * kNormThreads] = float_to_fp8(kv[k] / p.k_scale);
    if (tid < kRope / 2) {
      dst[kLatent + 2 * tid] = float_to_fp8(pe0 / p.k_scale);
      dst[kLatent + 2 * tid + 1] = float_to_fp8(pe1 / p.k_scale);
    }
  } else {
    uint16_t* dst = static_cast<uint16_t*>(p.cache) + row;
#pragma unroll
    for (int k = 0; k < kNormKvPer; ++k) dst[tid + k * kNormThreads] = float_to_bf16(kv[k]);
    if (tid < kRope / 2) {
      dst[kLatent + 2 * tid] = float_to_bf16(pe0);
      dst[kLatent + 2 * tid + 1] = float_to_bf16(pe1);
    }
  }
}

constexpr int kQueryThreads = 128;
constexpr int kQuerySplit = 4;                              // threads a W_UK^T row: thread j takes blocks j, j + 4
constexpr int kQueryRows = kQueryThreads / kQuerySplit;     // latent rows l a CTA
constexpr int kMaxNope = 256;
constexpr int kMaxBlocks = kMaxNope / 32;                   // 32-element MXFP4 blocks a row
constexpr int kBlocksPerThread = kMaxBlocks / kQuerySplit;
constexpr int kNopePad = 36;  // floats a block takes in shared memory: the 4 threads of a row read 4 blocks, bank-disjoint

__device__ __forceinline__ void store_query(const QueryParams& p, int64_t offset, float v) {
  if (p.out_fp8) static_cast<uint8_t*>(p.out)[offset] = float_to_fp8(v / p.q_scale);
  else static_cast<uint16_t*>(p.out)[offset] = float_to_bf16(v);
}
// The same for two adjacent outputs (offset even), as one store where `paired` (launch_query's
// out_pairs), the dtype and scale passed in (registers in query_mma_kernel's loop: read from the
// parameters at each store they were a constant-bank load on its path).
__device__ __forceinline__ void store_query_pair(const QueryParams& p, bool fp8, float q_scale, bool paired,
                                                 int64_t offset, float v0, float v1) {
  if (fp8) {
    const uint8_t b0 = float_to_fp8(v0 / q_scale), b1 = float_to_fp8(v1 / q_scale);
    uint8_t* out = static_cast<uint8_t*>(p.out) + offset;
    if (paired) *reinterpret_cast<uint16_t*>(out) = uint16_t(b0 | b1 << 8);
    else out[0] = b0, out[1] = b1;
  } else {
    uint16_t* out = static_cast<uint16_t*>(p.out) + offset;
    if (paired) *reinterpret_cast<uint32_t*>(out) = ptx::pack_bf16x2(v0, v1);
    else out[0] = float_to_bf16(v0), out[1] = float_to_bf16(v1);
  }
}

// q_pe of tokens s0 .. s0 + tokens - 1, head n: rotated (RoPE models), rounded to bf16, then
// quantized like ql_nope: by the CTA of a head's first latent rows (query_kernel), or shared by
// the head's CTAs (query_mma_kernel: part of parts, this CTA taking the pairs i with
// i / blockDim.x = part mod parts).
__device__ __forceinline__ void store_q_pe(const QueryParams& p, int64_t s0, int tokens, int n, int part = 0,
                                           int parts = 1) {
  const int h = p.head_offset + n, head_dim = p.nope_dim + kRope;
  const int stride = parts * blockDim.x, pairs = tokens * (kRope / 2);
  // two of the thread's pairs at a time, both loaded before either is stored (the stores may alias
  // q for all the compiler knows, so it would not hoist the second load)
  for (int i = threadIdx.x + part * blockDim.x; i < pairs; i += 2 * stride) {
    float x[2][2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int k = i + u * stride, t = k / (kRope / 2), pair = k % (kRope / 2);
      if (k >= pairs) continue;
      const uint16_t* qpe = p.q + (s0 + t) * p.q_stride + int64_t(n) * head_dim + p.nope_dim;
      x[u][0] = bf16_to_float(qpe[2 * pair]), x[u][1] = bf16_to_float(qpe[2 * pair + 1]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int k = i + u * stride, t = k / (kRope / 2), pair = k % (kRope / 2);
      if (k >= pairs) continue;
      const int64_t s = s0 + t;
      float x0 = x[u][0], x1 = x[u][1];
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

// grid (N * L/32, ceil(S / kTokens)), kTokens in {1, 2, 4, 8}: the tokens sharing each decoded
// weight row. At small S this is bound by load latency and per-thread work, not bandwidth (W_UK is
// 1.6 bytes a weight, 0.4 MB for kimi-k3): the 4 threads of a row each decode one or two
// 32-element blocks (loaded, codes and scales, before anything else) and their sums meet through
// two shuffles; 192 CTAs for 12 heads.
template <int kTokens>
__global__ void __launch_bounds__(kQueryThreads) query_kernel(const __grid_constant__ QueryParams p) {
  __shared__ __align__(16) float q_nope[kTokens][kMaxBlocks * kNopePad];
  constexpr int kChunks = kLatent / kQueryRows;
  const int n = blockIdx.x / kChunks, l = (blockIdx.x % kChunks) * kQueryRows + threadIdx.x / kQuerySplit;
  const int j = threadIdx.x % kQuerySplit;
  const int64_t s0 = int64_t(blockIdx.y) * kTokens;
  const int tokens = int(min(int64_t(kTokens), int64_t(p.tokens) - s0));
  const int head_dim = p.nope_dim + kRope;
  const int blocks = p.nope_dim / 32;

  // 1. This thread's code groups and scales of W_UK^T row (n, l), then the tokens' q_nope.
  const uint8_t* codes = p.w_codes + (int64_t(n) * kLatent + l) * (p.nope_dim / 2);
  const uint8_t* scales = p.w_scales + (int64_t(n) * kLatent + l) * blocks;
  uint4 packed[kBlocksPerThread];
  uint32_t scale_bits[kBlocksPerThread];
#pragma unroll
  for (int b = 0; b < kBlocksPerThread; ++b) {
    const int blk = j + kQuerySplit * b;
    if (blk < blocks) {
      packed[b] = *reinterpret_cast<const uint4*>(codes + blk * 16);
      scale_bits[b] = scales[blk];
    }
  }
  allow_dependents();
  wait_for_prior_grids();  // q is q_b's output
  for (int i = threadIdx.x; i < kTokens * p.nope_dim; i += blockDim.x) {
    const int t = i / p.nope_dim, d = i % p.nope_dim;
    q_nope[t][(d / 32) * kNopePad + d % 32] =
        t < tokens ? bf16_to_float(p.q[(s0 + t) * p.q_stride + int64_t(n) * head_dim + d]) : 0.0f;
  }
  __syncthreads();

  // 2. acc[t] = sum over this thread's blocks of scale * (codes . q_nope[t]).
  float acc[kTokens] = {};
#pragma unroll
  for (int b = 0; b < kBlocksPerThread; ++b) {
    const int blk = j + kQuerySplit * b;
    if (blk >= blocks) break;
    const uint32_t words[4] = {packed[b].x, packed[b].y, packed[b].z, packed[b].w};
    float part[kTokens] = {};
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
      float wv[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) wv[e] = e2m1_to_float(words[wi] >> (4 * e));
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        const float4 a = *reinterpret_cast<const float4*>(&q_nope[t][blk * kNopePad + wi * 8]);
        const float4 c = *reinterpret_cast<const float4*>(&q_nope[t][blk * kNopePad + wi * 8 + 4]);
        part[t] += wv[0] * a.x;
        part[t] += wv[1] * a.y;
        part[t] += wv[2] * a.z;
        part[t] += wv[3] * a.w;
        part[t] += wv[4] * c.x;
        part[t] += wv[5] * c.y;
        part[t] += wv[6] * c.z;
        part[t] += wv[7] * c.w;
      }
    }
    const float scale = e8m0_to_float(scale_bits[b]);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) acc[t] += scale * part[t];
  }
  // 3. The row's 4 threads (adjacent lanes) add their blocks' sums.
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 1);
    acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 2);
  }
  const int h = p.head_offset + n;
  if (j == 0) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t)  // constant indices keep acc in registers
      if (t < tokens) store_query(p, (s0 + t) * p.out_s_stride + int64_t(h) * p.out_h_stride + l, acc[t]);
  }

  if (blockIdx.x % kChunks == 0) store_q_pe(p, s0, tokens, n);
}

// --- 16+ tokens: W_UK on the tensor cores (mxfp4_mma.cuh) ----------------------------------------
// grid (N * L/128, ceil(S / (16 kMT))), 8 warps: a CTA multiplies 16 kMT tokens' q_nope of one head
// (bf16, exact in the MMA) by 128 W_UK^T rows (latent l), warp w rows 16 w .. 16 w + 15 as two n8
// tiles; the rows' codes and scales in shared memory, decoded a code word a lane once for the kMT
// m16 tiles of tokens (query_kernel decodes each row for at most 8 tokens on the CUDA cores: 124 us
// at 64 tokens x 128 heads, session 26; with one m16 tile a CTA the decode was most of the
// instructions, 35 us there, session 27's ncu).
constexpr int kMmaQTokens = 16;  // an m16 tile
constexpr int kMmaQThreads = 256;
constexpr int kMmaQTiles = 2;
constexpr int kMmaQRows = kMmaQThreads / 32 * kMmaQTiles * 8;  // 128 latent rows a CTA
// q_nope rows as bf16 pairs, P/2 + 16 words apart (16 mod 32): the two rows of an 8-lane phase of a
// fragment load fall in opposite bank halves. A W_UK^T row's code words P/8 + 4 apart (20 for
// P = 128): the 8 rows of a fragment load start in different bank quads.
constexpr int kMmaQWords = kMaxNope / 8 + 4;
constexpr size_t kMmaQStatic = kMmaQRows * kMmaQWords * 4 + kMmaQRows * kMaxBlocks;  // codes, scales
// The dynamic shared memory of query_mma_kernel<mt>: its tokens' q_nope rows, P/2 + 16 words each.
size_t query_mma_smem(int mt, int nope_dim) { return size_t(16 * mt) * (nope_dim / 2 + 16) * 4; }

template <int kMT>
__global__ void __launch_bounds__(kMmaQThreads) query_mma_kernel(const __grid_constant__ QueryParams p) {
  constexpr int kTokens = kMT * kMmaQTokens;
  extern __shared__ __align__(16) uint32_t q_nope[];  // kTokens rows of `pairs` words (query_mma_smem)
  __shared__ __align__(16) uint32_t codes[kMmaQRows * kMmaQWords];  // (kMmaQStatic: these two)
  __shared__ __align__(16) uint8_t scales[kMmaQRows * kMaxBlocks];
  constexpr int kChunks = kLatent / kMmaQRows;
  const int n = blockIdx.x / kChunks, l0 = (blockIdx.x % kChunks) * kMmaQRows;
  const int64_t s0 = int64_t(blockIdx.y) * kTokens;
  const int tokens = int(min(int64_t(kTokens), int64_t(p.tokens) - s0));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int head_dim = p.nope_dim + kRope, blocks = p.nope_dim / mxfp4::kBlock;
  const int row_words = p.nope_dim / 8, pitch = row_words + 4, pairs = p.nope_dim / 2 + 16;

  // 1. The CTA's W_UK^T rows and their scales (constant: before waiting for q_b), then the tokens'
  //    q_nope in 16-byte pieces (launch_query checks the alignment).
  for (int i = tid; i < kMmaQRows * (row_words / 4); i += kMmaQThreads) {
    const int r = i / (row_words / 4), k = i % (row_words / 4);
    ptx::cp_async_16(ptx::smem_addr(&codes[r * pitch + 4 * k]),
                     p.w_codes + (int64_t(n) * kLatent + l0 + r) * (p.nope_dim / 2) + 16 * k, true);
  }
  for (int i = tid; i < kMmaQRows * blocks / 16; i += kMmaQThreads)  // the rows' scales: contiguous
    ptx::cp_async_16(ptx::smem_addr(&scales[16 * i]), p.w_scales + (int64_t(n) * kLatent + l0) * blocks + 16 * i, true);
  ptx::cp_async_commit();
  allow_dependents();
  wait_for_prior_grids();  // q is q_b's output
  for (int i = tid; i < kTokens * (p.nope_dim / 8); i += kMmaQThreads) {
    const int t = i / (p.nope_dim / 8), k = i % (p.nope_dim / 8);
    const uint4 v = t < tokens ? *reinterpret_cast<const uint4*>(p.q + (s0 + t) * p.q_stride + int64_t(n) * head_dim + 8 * k)
                               : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(&q_nope[t * pairs + 4 * k]) = v;
  }
  ptx::cp_async_wait_all();
  __syncthreads();

  // 2. ql_nope^T tiles [16 tokens x 8 rows] over the nope dims, a 32-value block at a time: lane
  //    (g, c)'s A values 8c .. 8c + 7 of the block are four bf16 pairs of one 16-byte load a row.
  float acc[kMT][kMmaQTiles][4] = {};
  for (int blk = 0; blk < blocks; ++blk) {
    uint32_t b[kMmaQTiles][2][2];
#pragma unroll
    for (int j = 0; j < kMmaQTiles; ++j) {
      const int r = 16 * warp + 8 * j + g;
      mxfp4::b_fragments(codes[r * pitch + 4 * blk + c], scales[r * blocks + blk], b[j]);
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const uint32_t* q = &q_nope[(16 * mt + g) * pairs + 16 * blk + 4 * c];
      const uint4 x0 = *reinterpret_cast<const uint4*>(q), x1 = *reinterpret_cast<const uint4*>(q + 8 * pairs);
      const uint32_t a[2][4] = {{x0.x, x1.x, x0.y, x1.y}, {x0.z, x1.z, x0.w, x1.w}};
#pragma unroll
      for (int j = 0; j < kMmaQTiles; ++j)
#pragma unroll
        for (int s = 0; s < 2; ++s)
          ptx::mma_bf16(acc[mt][j], a[s][0], a[s][1], a[s][2], a[s][3], b[j][s][0], b[j][s][1]);
    }
  }

  // 3. Lane (g, c): tokens 16 mt + g, + 8 x latent rows 2c, 2c + 1 of each tile, quantized as
  //    query_kernel, the two rows a store (store_query_pair; per element, each store behind a
  //    constant-bank load, they were most of the kernel's stalls at D, ncu in session 27).
  const int h = p.head_offset + n;
  const bool fp8 = p.out_fp8, paired = p.out_pairs;
  const float q_scale = p.q_scale;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int j = 0; j < kMmaQTiles; ++j)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int t = 16 * mt + g + 8 * u, l = l0 + 16 * warp + 8 * j + 2 * c;
        if (t >= tokens) continue;
        store_query_pair(p, fp8, q_scale, paired, (s0 + t) * p.out_s_stride + int64_t(h) * p.out_h_stride + l,
                         acc[mt][j][2 * u], acc[mt][j][2 * u + 1]);
      }
  // q_pe: shared by the head's kLatent / kMmaQRows CTAs (one CTA took it all, a DRAM round trip
  // per pair and thread in turn: 8 at 64 tokens).
  store_q_pe(p, s0, tokens, n, l0 / kMmaQRows, kChunks);
}

}  // namespace

void launch_meta_check(const MetaCheckParams& p, cudaStream_t stream) {
  meta_check_kernel<<<1, kMetaThreads, 0, stream>>>(p);
  MLA_CUDA_CHECK_LAUNCH();
}

void launch_pre_norm(const PreNormParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  MLA_REQUIRE(!p.check_meta || p.tokens <= kFusedCheckTokens, "CUDA pre: the fused metadata check takes S <= ",
              kFusedCheckTokens, ", got ", p.tokens);
  const int gate_ctas = p.gate ? (p.gate_dim + kGatePer * kNormThreads - 1) / (kGatePer * kNormThreads) : 0;
  launch_dependent(pre_norm_kernel, dim3(unsigned(p.tokens), unsigned(1 + gate_ctas)), dim3(kNormThreads), 0, stream, p);
  MLA_CUDA_CHECK_LAUNCH();
}

void launch_query(const QueryParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  MLA_REQUIRE(p.nope_dim % 32 == 0 && p.nope_dim <= kMaxNope, "CUDA pre: qk_nope_dim must be a multiple of 32 <= ",
              kMaxNope, ", got ", p.nope_dim);
  // (query_mma_kernel's 16-byte loads: codes, scales and q_nope rows aligned)
  const bool aligned = reinterpret_cast<uintptr_t>(p.w_codes) % 16 == 0 && reinterpret_cast<uintptr_t>(p.w_scales) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_stride % 8 == 0 && (p.nope_dim + kRope) % 8 == 0;
  if (mma_products(p.tokens, p.heads) && aligned) {
    // Two adjacent latent rows as one store: the output and its strides 2-element aligned.
    QueryParams q = p;
    q.out_pairs = reinterpret_cast<uintptr_t>(p.out) % (p.out_fp8 ? 2 : 4) == 0 && p.out_s_stride % 2 == 0 &&
                  p.out_h_stride % 2 == 0;
    // Up to 4 m16 tiles of tokens a CTA (each decoded W_UK row used 4 x as often) while the grid
    // still gives every SM a CTA.
    const int chunks = p.heads * (kLatent / kMmaQRows);
    auto ctas = [&](int mt) { return int64_t(chunks) * ((p.tokens + 16 * mt - 1) / (16 * mt)); };
    // (and all its shared memory within the default 48 KB: no attribute to set)
    auto fits = [&](int mt) { return kMmaQStatic + query_mma_smem(mt, p.nope_dim) <= 48 * 1024; };
    const int mt = ctas(4) >= p.sms && fits(4) ? 4 : ctas(2) >= p.sms && fits(2) ? 2 : 1;
    auto go = [&](auto kernel) {
      const dim3 grid(unsigned(chunks), unsigned((p.tokens + kMmaQTokens * mt - 1) / (kMmaQTokens * mt)));
      launch_dependent(kernel, grid, dim3(kMmaQThreads), query_mma_smem(mt, p.nope_dim), stream, q);
    };
    if (mt == 4) go(query_mma_kernel<4>);
    else if (mt == 2) go(query_mma_kernel<2>);
    else go(query_mma_kernel<1>);
    MLA_CUDA_CHECK_LAUNCH();
    return;
  }
  const int tokens = p.tokens <= 1 ? 1 : p.tokens <= 2 ? 2 : p.tokens <= 4 ? 4 : 8;
  const dim3 grid(unsigned(p.heads * (kLatent / kQueryRows)), unsigned((p.tokens + tokens - 1) / tokens));
  switch (tokens) {
    case 1: launch_dependent(query_kernel<1>, grid, dim3(kQueryThreads), 0, stream, p); break;
    case 2: launch_dependent(query_kernel<2>, grid, dim3(kQueryThreads), 0, stream, p); break;
    case 4: launch_dependent(query_kernel<4>, grid, dim3(kQueryThreads), 0, stream, p); break;
    default: launch_dependent(query_kernel<8>, grid, dim3(kQueryThreads), 0, stream, p); break;
  }
  MLA_CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
