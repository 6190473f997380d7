// FlashMLA's dense bf16 decode (deepseek-ai/FlashMLA's SM90 `splitkv_mla` kernel at b89eee2, its scheduler's
// policy and its split combine) timed on this GPU the way `mla_graph_bench` times ours: one request shape, a CUDA
// graph of the splitkv and combine kernels, the L2 flushed by reading a buffer of twice its size before each
// replay, the median of `--iters` replays; its output checked against a float reference computed on the GPU.
//
// Why: issue 5 compares our bf16 many-rows kernel with FlashMLA's figures from another run (D: 224 us,
// 82% of the bf16 matmul); this measures FlashMLA beside ours in the same device call, on the same GPU (session 51:
// three H100s; docs/attention-log.md's earlier queue, item 3 (m)).
//
// FlashMLA's sources are not part of this repository (its license is MIT, but the project keeps other
// libraries' code out): scripts/flashmla-bench builds it against FlashMLA's files (which, from where: that
// script) and CUTLASS's headers. The splitkv kernel is b89eee2's (69f3193's, with sliding windows, spills 616
// bytes under nvcc 13.0 and CUTLASS 4.2: not FlashMLA at its best); the combine is 69f3193's (the same partial
// layout: [split, head, 512] floats and log2 LSEs); the scheduler's metadata is made here, on the host, by
// FlashMLA's policy (get_mla_metadata.cu: every request's 64-key blocks plus 5 of fixed overhead, dealt to
// sm_count / ceil(heads / 64) parts in order, a request split where a part's share ends inside it).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/bench_kernels.cuh"
#include "flashmla_launch.h"

#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

using mla::cuda::bench_kernels::clock_probe_kernel;
using mla::cuda::bench_kernels::read_all;

namespace {

constexpr int kDk = 576, kDv = 512;

// Deterministic pseudo-random bf16 in [-1, 1) (a hash of the index and a seed).
__global__ void fill_kernel(__nv_bfloat16* x, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) * 0x85EBCA77u ^ seed;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    x[i] = __float2bfloat16(scale * (float(h >> 8) * (1.0f / 8388608.0f) - 1.0f));
  }
}

// Float reference of one query row over its request's keys: o [kDv] and the natural-log lse. Row r of request b is
// query token r / heads (of qlen), head r % heads (FlashMLA's [b, qlen x heads] rows); token s sees the first
// ctx - (qlen - 1 - s) keys (causal). One CTA a row; the scores in shared memory (ctx <= 32768).
__global__ void reference_kernel(const __nv_bfloat16* q, const __nv_bfloat16* kv, const int* block_table,
                                 int table_stride, int heads, int qlen, int ctx_all, int page, float scale,
                                 const int* rows, float* o_ref, float* lse_ref) {
  extern __shared__ float scores[];
  __shared__ float red[32];
  const int rows_req = qlen * heads, row = rows[blockIdx.x], b = row / rows_req;
  const int ctx = ctx_all - (qlen - 1 - (row % rows_req) / heads);
  const __nv_bfloat16* qr = q + int64_t(row) * kDk;
  auto key_row = [&](int k) {
    return kv + (int64_t(block_table[int64_t(b) * table_stride + k / page]) * page + k % page) * kDk;
  };
  float mx = -INFINITY;
  for (int k = threadIdx.x; k < ctx; k += blockDim.x) {
    const __nv_bfloat16* kr = key_row(k);
    float s = 0.0f;
    for (int d = 0; d < kDk; ++d) s += __bfloat162float(qr[d]) * __bfloat162float(kr[d]);
    s *= scale;
    scores[k] = s;
    mx = fmaxf(mx, s);
  }
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < int(blockDim.x / 32); ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float sum = 0.0f;
  for (int k = threadIdx.x; k < ctx; k += blockDim.x) {
    const float e = expf(scores[k] - mx);
    scores[k] = e;
    sum += e;
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) sum += red[w];
  for (int d = threadIdx.x; d < kDv; d += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < ctx; ++k) acc += scores[k] * __bfloat162float(key_row(k)[d]);
    o_ref[int64_t(blockIdx.x) * kDv + d] = acc / sum;
  }
  if (threadIdx.x == 0) lse_ref[blockIdx.x] = mx + logf(sum);
}

// FlashMLA's scheduling policy (get_mla_metadata.cu at 69f3193, without windows) on the host: the parts' work in
// DecodingSchedMeta form and every request's split-index prefix (prefix[b + 1] - prefix[b]: its splits).
std::vector<FlashmlaSchedMeta> schedule(const std::vector<int>& lens, int parts, int block, int overhead,
                                        std::vector<int>& prefix) {
  const int n = int(lens.size());
  std::vector<int> blocks(n);
  int64_t total = 0;
  for (int i = 0; i < n; ++i) blocks[i] = (lens[i] + block - 1) / block, total += blocks[i] + overhead;
  const int payload = std::max(int((total + parts - 1) / parts) + overhead, 2 * overhead);
  prefix.assign(n + 1, 0);
  std::vector<FlashmlaSchedMeta> meta(parts);
  int idx = 0, blk = 0, split = 0, cum = 0;
  for (auto& m : meta) {
    m = {idx, 0, blk, 0, split, 0, 0, 0};
    int remain = payload;
    while (idx < n) {
      const int left = blocks[idx] - blk;
      if (remain >= left + overhead) {  // the rest of this request fits
        cum += split + 1;
        prefix[idx + 1] = cum;
        remain -= left + overhead;
        ++idx, blk = 0, split = 0;
      } else {
        if (remain - overhead > 0) blk += remain - overhead, ++split;  // split it here (else the next part's)
        break;
      }
    }
    m.end_req = blk > 0 ? idx : idx - 1;
    m.end_block = blk > 0 ? blk : (idx > 0 ? blocks[idx - 1] : 0);
  }
  for (auto& m : meta) {
    if (m.begin_req >= n) continue;
    m.first_split = prefix[m.begin_req + 1] - prefix[m.begin_req] > 1;
    m.last_split = m.end_req < n && prefix[m.end_req + 1] - prefix[m.end_req] > 1;
  }
  return meta;
}

struct Args {
  int batch = 64, heads = 128, ctx = 8192, qlen = 1, iters = 50, check_rows = 256;
  std::string json, probe;  // probe: a build whose results are wrong by design (its check reported, not failed)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--batch") a.batch = std::atoi(v.c_str());
    else if (k == "--heads") a.heads = std::atoi(v.c_str());
    else if (k == "--context") a.ctx = std::atoi(v.c_str());
    else if (k == "--qlen") a.qlen = std::atoi(v.c_str());
    else if (k == "--iters") a.iters = std::atoi(v.c_str());
    else if (k == "--check-rows") a.check_rows = std::atoi(v.c_str());
    else if (k == "--json") a.json = v;
    else if (k == "--probe") a.probe = v;
    else {
      std::fprintf(stderr, "unknown argument %s (--batch --heads --context --qlen --iters --check-rows --json --probe)\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.batch < 1 || a.heads < 1 || a.heads > 128 || a.ctx < 1 || a.ctx > 32768 || a.qlen < 1 || a.qlen > 8 ||
      a.ctx < a.qlen || a.iters < 1) {
    std::fprintf(stderr, "need --batch >= 1, --heads 1..128, --context 1..32768, --qlen 1..8 (<= context), --iters >= 1\n");
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const int page = kFlashmlaPage;  // FlashMLA's dense decode: pages of 64 keys only
  const int pages_per_req = (a.ctx + page - 1) / page;
  const int num_blocks = a.batch * pages_per_req;
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  int dev = 0, sms = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));

  // Inputs: q [b, qlen, heads, 576] (as [b, qlen x heads, 1, 576]: one kv head), the cache [blocks, 64, 1, 576], every
  // request's pages a random permutation of the cache's (as mla_graph_bench's default page order).
  __nv_bfloat16 *q, *kv, *out;
  float *lse, *lse_accum, *o_accum;
  int *seqlens, *table, *splits;
  const int rows_req = a.qlen * a.heads;  // query rows a request (FlashMLA's q_seq_per_hk with one kv head)
  const int64_t q_elems = int64_t(a.batch) * rows_req * kDk, kv_elems = int64_t(num_blocks) * page * kDk;
  CK(cudaMalloc(&q, q_elems * 2));
  CK(cudaMalloc(&kv, kv_elems * 2));
  CK(cudaMalloc(&out, int64_t(a.batch) * rows_req * kDv * 2));
  CK(cudaMalloc(&lse, int64_t(a.batch) * rows_req * 4));
  fill_kernel<<<1024, 256, 0, stream>>>(q, q_elems, 0x1234u, 1.0f);
  fill_kernel<<<4096, 256, 0, stream>>>(kv, kv_elems, 0x5678u, 1.0f);
  CK(cudaGetLastError());
  std::vector<int> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(42);
  std::shuffle(perm.begin(), perm.end(), rng);
  CK(cudaMalloc(&table, int64_t(num_blocks) * 4));
  CK(cudaMemcpy(table, perm.data(), int64_t(num_blocks) * 4, cudaMemcpyHostToDevice));
  std::vector<int> lens(a.batch, a.ctx);
  CK(cudaMalloc(&seqlens, a.batch * 4));
  CK(cudaMemcpy(seqlens, lens.data(), a.batch * 4, cudaMemcpyHostToDevice));

  // The scheduler's metadata (flash_api.cpp's get_mla_metadata: one kv head, no window), made on the host.
  const int num_sm_parts = sms / ((rows_req + kFlashmlaBlockM - 1) / kFlashmlaBlockM);
  std::vector<int> prefix;
  const std::vector<FlashmlaSchedMeta> meta =
      schedule(lens, num_sm_parts, kFlashmlaPage, kFlashmlaFixedOverhead, prefix);
  FlashmlaSchedMeta* sched;
  CK(cudaMalloc(&sched, meta.size() * sizeof(FlashmlaSchedMeta)));
  CK(cudaMemcpy(sched, meta.data(), meta.size() * sizeof(FlashmlaSchedMeta), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&splits, int64_t(a.batch + 1) * 4));
  CK(cudaMemcpy(splits, prefix.data(), int64_t(a.batch + 1) * 4, cudaMemcpyHostToDevice));
  const int max_splits = [&] {
    int m = 0;
    for (int i = 0; i < a.batch; ++i) m = std::max(m, prefix[i + 1] - prefix[i]);
    return m;
  }();

  const int total_num_splits = a.batch + num_sm_parts;
  CK(cudaMalloc(&lse_accum, int64_t(total_num_splits) * rows_req * 4));
  CK(cudaMalloc(&o_accum, int64_t(total_num_splits) * rows_req * kDv * 4));
  const float scale = 1.0f / std::sqrt(float(kDk));
  FlashmlaDecodeArgs fa = {};
  fa.batch = a.batch;
  fa.heads = a.heads;
  fa.qlen = a.qlen;
  fa.num_blocks = num_blocks;
  fa.num_sm_parts = num_sm_parts;
  fa.total_num_splits = total_num_splits;
  fa.scale = scale;
  fa.q = q;
  fa.kv = kv;
  fa.o = out;
  fa.lse = lse;
  fa.block_table = table;
  fa.block_table_stride = pages_per_req;
  fa.seqlens = seqlens;
  fa.sched = sched;
  fa.num_splits = splits;
  fa.lse_accum = lse_accum;
  fa.o_accum = o_accum;
  fa.stream = stream;
  auto step = [&] {
    flashmla_b89_splitkv(fa);
    flashmla_combine(fa);
  };
  // Poison the outputs, run once, check against the reference on check_rows rows spread over the batch.
  CK(cudaMemsetAsync(out, 0xFF, int64_t(a.batch) * rows_req * kDv * 2, stream));
  CK(cudaMemsetAsync(lse, 0xFF, int64_t(a.batch) * rows_req * 4, stream));
  step();
  CK(cudaStreamSynchronize(stream));
  CK(cudaGetLastError());
  const int total_rows = a.batch * rows_req, n_check = std::min(a.check_rows, total_rows);
  std::vector<int> rows(n_check);
  for (int i = 0; i < n_check; ++i) rows[i] = int(int64_t(i) * total_rows / n_check + (i * 7919) % std::max(1, total_rows / n_check));
  int* d_rows;
  float *o_ref, *lse_ref;
  CK(cudaMalloc(&d_rows, n_check * 4));
  CK(cudaMalloc(&o_ref, int64_t(n_check) * kDv * 4));
  CK(cudaMalloc(&lse_ref, n_check * 4));
  CK(cudaMemcpy(d_rows, rows.data(), n_check * 4, cudaMemcpyHostToDevice));
  CK(cudaFuncSetAttribute(reference_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, a.ctx * 4));
  reference_kernel<<<n_check, 256, a.ctx * 4, stream>>>(q, kv, table, pages_per_req, a.heads, a.qlen, a.ctx, page,
                                                       scale, d_rows, o_ref, lse_ref);
  CK(cudaStreamSynchronize(stream));
  CK(cudaGetLastError());
  std::vector<__nv_bfloat16> o_got(int64_t(a.batch) * rows_req * kDv);
  std::vector<float> lse_got(int64_t(a.batch) * rows_req), o_want(int64_t(n_check) * kDv), lse_want(n_check);
  CK(cudaMemcpy(o_got.data(), out, o_got.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lse_got.data(), lse, lse_got.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(o_want.data(), o_ref, o_want.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lse_want.data(), lse_ref, lse_want.size() * 4, cudaMemcpyDeviceToHost));
  // The LSE against both bases (FlashMLA's final LSE is natural-log, its split partials' log2: a mix-up shows here).
  double o_err = 0, o_max = 0, lse_err_ln = 0, lse_err_log2 = 0;
  for (int i = 0; i < n_check; ++i) {
    const int r = rows[i];  // out [b, qlen x heads, 1, 512]: row-major over (b, row)
    for (int d = 0; d < kDv; ++d) {
      const double got = __bfloat162float(o_got[int64_t(r) * kDv + d]), want = o_want[int64_t(i) * kDv + d];
      o_err = std::max(o_err, std::isfinite(got) ? std::fabs(got - want) : INFINITY);
      o_max = std::max(o_max, std::fabs(want));
    }
    lse_err_ln = std::max(lse_err_ln, double(std::fabs(lse_got[r] - lse_want[i])));
    lse_err_log2 = std::max(lse_err_log2, double(std::fabs(lse_got[r] - lse_want[i] / std::log(2.0))));
  }
  const double o_rel = o_err / std::max(o_max, 1e-30);
  const bool ok = o_rel < 2e-2 && lse_err_ln < 1e-2;  // (bf16 o: ~3e-3 of max |o| in session 51)

  // Timing: a graph of the two kernels, replayed after each flush.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step();
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  void* flush;
  const int64_t flush_bytes = int64_t(std::max(l2, 1 << 20)) * 2;
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMemsetAsync(flush, 0, flush_bytes, stream));
  unsigned long long* clk;
  CK(cudaMalloc(&clk, 16));
  auto mhz = [&] {
    clock_probe_kernel<<<1, 1, 0, stream>>>(200000, clk);
    unsigned long long v[2] = {0, 0};
    CK(cudaMemcpyAsync(v, clk, sizeof v, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    return v[1] ? double(v[0]) * 1e3 / double(v[1]) : 0.0;
  };
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, stream));
  const double mhz_before = mhz();
  std::vector<cudaEvent_t> ev(2 * a.iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < a.iters; ++i) {
    read_all(flush, size_t(flush_bytes), stream);
    CK(cudaEventRecord(ev[2 * i], stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(ev[2 * i + 1], stream));
  }
  CK(cudaStreamSynchronize(stream));
  const double mhz_after = mhz();
  std::vector<double> us(a.iters);
  for (int i = 0; i < a.iters; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us[i] = ms * 1e3;
  }
  std::vector<double> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[a.iters / 2], mean = std::accumulate(us.begin(), us.end(), 0.0) / a.iters;
  const double flops = 2.0 * a.batch * rows_req * double(a.ctx) * (kDk + kDv);  // (the causal triangle counted whole)
  const double bytes = double(a.batch) * a.ctx * kDk * 2;
  std::printf("flashmla%s%s bf16 decode: batch %d heads %d qlen %d context %d page %d on %s (%d SMs, %d sm parts, up to %d "
              "splits a request)\n", a.probe.empty() ? "" : " probe ", a.probe.c_str(), a.batch, a.heads, a.qlen, a.ctx, page,
              prop.name, sms, num_sm_parts, max_splits);
  std::printf("  check: %d rows, o max abs err %.3g (%.3g of max |o| %.3g), lse err %.3g (ln) / %.3g (log2) -> %s\n",
              n_check, o_err, o_rel, o_max, lse_err_ln, lse_err_log2,
              ok ? "ok" : a.probe.empty() ? "MISMATCH" : "mismatch (a probe: wrong by design)");
  std::printf("  median %.1f us, mean %.1f us (%d replays), %.1f TFLOP/s, %.0f GB/s of cache, SM %.0f / %.0f MHz\n",
              median, mean, a.iters, flops / median * 1e-6, bytes / median * 1e-3, mhz_before, mhz_after);
  if (!a.json.empty()) {
    FILE* f = std::fopen(a.json.c_str(), "w");
    if (!f) {
      std::perror(a.json.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\"kernel\": \"flashmla_b89eee2_splitkv_mla_bf16+combine_69f3193\", \"probe\": \"%s\", \"device\": \"%s\", \"batch\": %d, \"heads\": %d, \"qlen\": %d, "
                 "\"context\": %d, \"page_size\": %d, \"num_sm_parts\": %d, \"max_splits\": %d, \"iters\": %d, \"median_us\": %.2f, "
                 "\"mean_us\": %.2f, \"tflops\": %.1f, \"sm_mhz_before\": %.0f, \"sm_mhz_after\": %.0f, "
                 "\"check_rows\": %d, \"o_max_abs_err\": %.4g, \"o_rel_err\": %.4g, \"lse_err_ln\": %.4g, "
                 "\"lse_err_log2\": %.4g, \"check_ok\": %s, \"l2_flush\": \"read a buffer of twice the L2 before each replay\", "
                 "\"us\": [",
                 a.probe.c_str(), prop.name, a.batch, a.heads, a.qlen, a.ctx, page, num_sm_parts, max_splits, a.iters, median, mean, flops / median * 1e-6,
                 mhz_before, mhz_after, n_check, o_err, o_rel, lse_err_ln, lse_err_log2, ok ? "true" : "false");
    for (int i = 0; i < a.iters; ++i) std::fprintf(f, "%s%.2f", i ? ", " : "", us[i]);
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return ok || !a.probe.empty() ? 0 : 3;
}
