#pragma once
// The CUDA backend's kernels, one params struct each (its ABI: pointers with their shapes, strides
// in elements), and one launcher per kernel family. Mirrors src/cpu/stages.hpp: pre.cu, attend.cu,
// post.cu. Host code includes this header; it has no device code.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>

namespace mla::detail {
class BackendImpl;
}

namespace mla::cuda {

// The value the environment variable `name` selects among `choices` (its text, the value); else
// `fallback` (unset or another text). The measurement switches read it once each (a static).
int env_choice(const char* name, std::initializer_list<std::pair<std::string_view, int>> choices, int fallback);

// The model dimensions the kernels fix (SPEC.md): cache and query rows of L + R = 576.
inline constexpr int kLatent = 512;  // L
inline constexpr int kRope = 64;     // R
inline constexpr int kRow = 576;     // L + R

// Bits of the backend's device error word, set by the kernel that finds bad device-resident
// metadata. The word is sticky until the host takes it (cuda/device_errors.hpp).
enum DeviceError : uint32_t {
  kBadSlot = 1u << 0,        // slot_mapping[s] outside [-1, num_pages * page_size)
  kDuplicateSlot = 1u << 1,  // two tokens of the step write the same slot
  kBadSeqLen = 1u << 2,      // seq_lens[b] < 0, 0 < seq_lens[b] < qlen, or slot >= 0 for an empty request
  kBadPage = 1u << 3,        // kv_indices entry outside [0, num_pages)
  kShortPageTable = 1u << 4, // kv_indptr gives a request fewer pages than its local length needs
};

// --- pre ------------------------------------------------------------------------------------------

// Validates the step's device metadata before pre writes the cache (one CTA).
struct MetaCheckParams {
  const int32_t* seq_lens;      // [B]
  const int64_t* slot_mapping;  // [S]
  int batch, qlen;
  int64_t num_slots;  // num_pages * page_size
  uint32_t* error;
};
void launch_meta_check(const MetaCheckParams& p, cudaStream_t stream);

// y [S, n] = x [S, k] @ w [n, k]^T, bf16, fp32 accumulation, for S <= kSkinnyMaxTokens: the
// weight-streaming form of pre's projections at decode batch sizes (cuBLASLt above).
inline constexpr int kSkinnyMaxTokens = 4;
struct SkinnyGemmParams {
  const uint16_t* x;  // [s, k] bf16, row stride ldx (a multiple of 8, 16-byte aligned rows)
  int64_t ldx;
  const uint16_t* w;  // [n, k] bf16 contiguous
  uint16_t* y;        // [s, n] bf16, row stride ldy
  int64_t ldy;
  int s, n, k;
};
bool skinny_gemm_applies(int s, int k, int64_t ldx);
void launch_skinny_gemm(const SkinnyGemmParams& p, cudaStream_t stream);

// Per token: RMSNorm of q_c and kv_c, RoPE of k_pe, the cache row [kv_c | k_pe], sigmoid gate.
// For S <= kFusedCheckTokens (check_meta) it also does meta_check's work, with the same error bits
// and the same rule (no cache row of a rejected step is written), and meta_check is not launched.
inline constexpr int kFusedCheckTokens = 64;
inline bool pre_norm_checks_meta(int64_t tokens) { return tokens <= kFusedCheckTokens; }
struct PreNormParams {
  const uint16_t* y;  // [S, qkv_rows] bf16, row stride y_stride: [q_c | kv_c | k_pe | gate_logits]
  int64_t y_stride;
  const float* q_a_norm;   // [Rq]
  const float* kv_a_norm;  // [L]
  uint16_t* q_c;           // [S, Rq] bf16 out, row stride q_c_stride
  int64_t q_c_stride;
  uint16_t* gate;          // [S, gate_dim] bf16 out, row stride gate_stride (null without a gate)
  int64_t gate_stride;
  int gate_dim;
  void* cache;             // [num_pages, page_size, 576] fp8 or bf16
  bool cache_fp8;
  int64_t page_stride, row_stride;
  int page_size;
  int64_t num_slots;
  const int64_t* slot_mapping;  // [S]
  const int32_t* seq_lens;      // [B]
  int batch, qlen, tokens, rq;
  bool check_meta;              // the step's metadata check here (S <= kFusedCheckTokens)
  float rms_eps;
  float k_scale;  // fp8 cache: stored = x / k_scale (a division, as on the CPU)
  const double* inv_freq;  // [R/2], null for NoPE
  double rope_mscale;
  uint32_t* error;         // the cache is not written when any error bit is set (or check_meta finds one)
};
void launch_pre_norm(const PreNormParams& p, cudaStream_t stream);

// ql_nope = q_nope @ W_UK (MXFP4, dequantized in registers), RoPE of q_pe, quantization of the
// query [ql_nope | q_pe] into the (possibly strided, head-padded) query view.
struct QueryParams {
  const uint16_t* q;  // [S, N*(P+R)] bf16 (q_b's output), row stride q_stride
  int64_t q_stride;
  const uint8_t* w_codes;   // [N, L, P/2] MXFP4 codes of W_UK^T
  const uint8_t* w_scales;  // [N, L, P/32] E8M0
  void* out;                // [S, Hq, 576] fp8 or bf16, strides out_s_stride, out_h_stride, 1
  bool out_fp8;
  int64_t out_s_stride, out_h_stride;
  int head_offset;  // this rank's first head in the gathered query (dcp.rank * N)
  float q_scale;  // fp8 query: stored = x / q_scale
  const int32_t* seq_lens;  // [B]
  int qlen, tokens, heads, nope_dim;  // nope_dim = P (a multiple of 32)
  const double* inv_freq;   // [R/2], null for NoPE
  double rope_mscale;
  int sms = 0;  // the device's SMs (query_mma_kernel's tokens a CTA: as many as still fill them)
  bool out_pairs = false;  // query_mma_kernel: out and its strides allow 2-element stores (launch_query)
};
void launch_query(const QueryParams& p, cudaStream_t stream);

// --- attend ---------------------------------------------------------------------------------------

struct AttendParams {
  const void* q;  // [S, Hq, 576] fp8 or bf16, strides q_s_stride, q_h_stride, 1
  bool q_fp8;
  int64_t q_s_stride, q_h_stride;
  const void* cache;  // [num_pages, page_size, 576] fp8 or bf16, strides page_stride, row_stride, 1
  bool cache_fp8;
  int64_t page_stride, row_stride;
  int page_size;
  int64_t num_pages;
  const int32_t* seq_lens;    // [B] global lengths
  const int32_t* kv_indptr;   // [B+1]
  const int32_t* kv_indices;  // [kv_indptr[B]]
  void* o;  // [splits, S, G, 512] f32 or bf16 (splits == 1: [S, G, 512]), strides below, 1
  bool o_bf16;
  // P kept to ~2^-20 for p.v (two mma a fragment), as an f32 o held to SPEC.md's 1e-4 needs;
  // false: P rounded once to 16 bits (o ~3e-4), enough for a bf16 o and for the step's bf16 out.
  bool exact_p;
  // o and lse are the step's own split partials (its workspace), which only feed post's bf16 out.
  // The wgmma kernel takes only these: its fp8 MMA sums q.k with ~1e-4 relative error (docs/
  // attention.md), so an LSE handed to a caller could miss SPEC's 1e-3 where scores are large.
  bool step_partials = false;
  int64_t o_split_stride, o_s_stride, o_h_stride;
  float* lse;  // [splits, S, G] (splits == 1: [S, G])
  int64_t lse_split_stride, lse_s_stride, lse_h_stride;
  int batch, qlen, heads, splits;  // heads = G
  float score_scale;  // sm_scale * (q fp8 ? q_scale : 1) * (cache fp8 ? k_scale : 1)
  float v_scale;      // cache fp8 ? k_scale : 1
  int dcp_size, dcp_rank, dcp_interleave;
  uint32_t* error;
  bool l1_copies = false;  // wgmma kernel: key-tile copies through L1 (cp.async.ca), set by launch_attend
  // The flat plan (flat_plan.hpp), for the step's partials where the wgmma kernel takes TMA tiles
  // at W = 1: flat_ctas key-CTAs share all requests' tiles evenly; partial i is o[i] = [qlen, G, 512]
  // (o_split_stride = qlen * o_s_stride), and request b's partials are part_first[b] ..
  // + part_count[b] - 1 (written by the kernel for post). 0: splits as above.
  int flat_ctas = 0;
  int32_t* part_first = nullptr;
  int32_t* part_count = nullptr;
  uint64_t* timeline = nullptr;  // MLA_ATTEND_TIMELINE (attend_wgmma.cu): per-CTA phase stamps
  // The many-rows kernel (attend_rows.cu) where the wgmma kernel takes TMA tiles: the planner's
  // choice (attend_rows_wanted), which its split counts assume.
  bool many_rows = false;
  // ceil(2^32 / heads), so that m / heads = (m * heads_magic) >> 32 for the query rows m (< 2^16,
  // fast_div.hpp): set by launch_attend_wgmma for the 16-row kernel, which divides by it.
  uint64_t heads_magic = 0;
  // The 16-row kernel's FastDivs instance (s23a): multiply-shifts for blockIdx.x / m_tiles, work /
  // splits and the flat plan's T / CTAs, set by launch_attend_wgmma where they are exact.
  uint64_t m_tiles_magic = 0, splits_magic = 0, flat_ctas_magic = 0;
  // The GPU's SM count where the batch takes skewed splits (attend_skew_wanted; s33a, skew_plan.hpp;
  // else 0): the 16-row kernel's FastDivs instance skews fixed splits where attend_wgmma_skews holds.
  int skew_sms = 0;
};
inline constexpr int kMaxQueryHeads = 8190;  // G: G * 8 + 16 <= 2^16 (launch_attend_wgmma's heads_magic)
inline constexpr int kMinFlatTiles = 2;     // the flat plan: no segment plan finer than two key tiles
inline constexpr int kMaxFlatBatch = 1024;  // the flat plan's tile prefix sums sit in shared memory
// The kernel families launch_attend picks from (the routes below say when). The GPU tests check that
// a step ran the family its shape should take (last_attend_run: a fallback to another kernel, exact
// too, would pass their comparison unnoticed); Layer::last_attend_kernel names it.
enum class AttendKernel {
  kMma,          // attend.cu: mma.sync, any case
  kWgmma,        // attend_wgmma.cu: 16-row CTAs, fp8 query and cache
  kWgmmaQSplit,  // attend_wgmma_q_split.cu: 16-row CTAs, a bf16 query split over an fp8 cache
  kWgmmaBf16,    // attend_wgmma_bf16.cu: 16-row CTAs, bf16 query and cache
  kRows,         // attend_rows.cu: many rows, fp8 query and cache
  kRowsQSplit,   // attend_rows_q_split.cu: many rows, a bf16 query split over an fp8 cache
  kRowsBf16,     // attend_rows_bf16.cu: many rows, bf16 query and cache
  kCount
};
const char* attend_kernel_name(AttendKernel k);
// Launches the attend kernel the routes below pick; returns its family (kCount: an empty batch).
AttendKernel launch_attend(const AttendParams& p, cudaStream_t stream);
// What a CUDA layer's last attend launched: the family and its plan (fixed splits, or the flat
// plan's key-CTAs). Throws mla::Error for a layer on another backend.
struct AttendRun {
  AttendKernel family = AttendKernel::kCount;  // (kCount: none yet)
  int splits = 0;                              // fixed splits a request (flat_ctas == 0)
  int flat_ctas = 0;                           // the flat plan's key-CTAs
};
AttendRun last_attend_run(const detail::BackendImpl& backend);
// MLA_ATTEND_KERNEL, read once: 0 (=mma) the mma.sync kernel (attend.cu) takes every case, for
// comparison; 1 (unset) the default below; 2 (=wgmma) the wgmma kernels also take attend() into a
// caller's bf16 o, so the GPU tests check their o and lse directly.
int attend_kernel_mode();
// o rows written as pairs of dims (8-byte f32 / 4-byte bf16 stores): base and strides even.
bool attend_o_pairs_aligned(const AttendParams& p);
// The Hopper wgmma kernel (attend_wgmma.cu), which launch_attend picks where it applies: the step's
// own partials (step_partials) with an fp8 cache and an fp8 query (or a bf16 one: the split below),
// or a bf16 query and cache (below), o rows pair-aligned.
bool attend_wgmma_applies(const AttendParams& p);
// By default since session 34 (MLA_ATTEND_Q_SPLIT=0: off; H200: B64 89 us against mma.sync's
// 143-148, uneven 171 against 459): a bf16 query over an fp8 cache takes the 16-row wgmma kernel
// too, each query row split exactly into two e4m3 rows (core/query_split.hpp), over TMA boxes (pages
// of 8+ rows, a power of two) or bulk row copies (other pages: 16-byte aligned rows, the step's
// partials), planned for 16-row CTAs (attend_plan_shape), at every height under MLA_ROWS_Q_SPLIT=0,
// else where the many-rows kernel's split (below) does not take it; else (and with the switch off) the mma.sync kernel (attend_wgmma_q_split: that case).
bool attend_q_split_enabled();
bool attend_wgmma_q_split(const AttendParams& p);
// By default since session 37 (s35; MLA_ROWS_Q_SPLIT=0: off; H100, session 37: D 386 us against the
// 16-row split's 585, F 197 against 300, G 195 against 299, 96 heads 386 against 589): where the
// planner asks for many rows (attend_rows_wanted), a bf16 query over an fp8 cache takes the many-rows
// kernel's split instead (attend_rows_q_split.cu: the same exact split, q.k's k32 steps over the hi
// rows, then the lo rows) in CTAs of kAttendRowsQSplitCta rows, planned as such
// (CudaBackend::attend_shape), over TMA boxes of any power-of-two page; other pages keep the 16-row
// split and its plan (attend_plan_shape's rows_boxes). attend_rows_q_split: this step takes it.
bool attend_rows_q_split_enabled();
bool attend_rows_q_split(const AttendParams& p);
inline constexpr int kAttendRowsQSplitCta = 32;
// By default since session 34 (MLA_ATTEND_BF16_16ROW=0: off; H200: B64 162 us against mma.sync's
// 232): a bf16 query and cache where the planner does not ask for many rows (12-16 heads, qlen 1)
// take the 16-row wgmma kernel's bf16 instance over TMA boxes (kBf16: HGMMA, V read MN-major from
// the slabs) instead of the mma.sync kernel.
bool attend_bf16_16row_enabled();
bool attend_wgmma_bf16_cache(const AttendParams& p);
// The 16-row kernel's default TMA instance (FastDivs) at fixed splits skews each pair of a request's
// splits toward the CTA placed first on its SM (skew_plan.hpp, s33a) where skew::applies (even
// splits, one to two CTAs an SM): by default for batches of two or more (one 128K request was
// 1-2% slower with it: its 8-tile splits gain no tile, the order changes), MLA_ATTEND_SKEW=1 also at
// B = 1, =0 never. attend_skew_wanted(batch): for this batch; attend_skew_enabled: for some.
bool attend_skew_enabled();
bool attend_skew_wanted(int batch);
// The launch of `ctas` CTAs takes the skewed instance (p.skew_sms set, fixed splits, skew::applies).
bool attend_wgmma_skews(const AttendParams& p, int64_t ctas);
// Launches of the skewed instance in this process so far (the GPU tests check that they ran it;
// attend_wgmma_fixed.cu's skewed instance counts its own).
int64_t attend_skew_launches();
void count_attend_skew_launch();
// s73a (the default since session 71; MLA_ATTEND_FIXED_ONLY=0 turns it off) sends the 16-row kernel's launches of fixed
// splits (FastDivs over TMA boxes, plain or skewed, and the bulk row copies' 3-step instance) to instances
// without the flat plan's code (attend_wgmma_fixed.cu; its launchers in tma.hpp).
bool attend_fixed_only_enabled();
int64_t attend_fixed_launches();  // (their launches in this process so far, for the GPU tests)
// Where it applies, the wgmma kernel loads whole pages by TMA when the cache allows (pages of 8 or
// more rows, a power of two, rows of a page contiguous) and the partials may be chunked by whole
// tiles (the step's own, or one split); else by bulk row copies (below) or cp.async.
bool attend_wgmma_uses_tma(const AttendParams& p);
// Where TMA does not box the pages of an fp8 cache (pages of 1-4 rows or not a power of two, pages
// not contiguous), the 16-row kernel loads a tile as one bulk copy a key row (attend_wgmma.cu v24:
// rows and pages 16-byte aligned, the same whole-tile chunks); else by cp.async.
bool attend_wgmma_row_copies(const AttendParams& p);
AttendKernel launch_attend_wgmma(const AttendParams& p, cudaStream_t stream);  // (the family it launched)
// The many-rows kernel (attend_rows.cu: 64, 48 or 32 query rows a CTA, two warpgroups, one CTA an SM), which
// the wgmma launch takes for TMA tiles where the planner asked for it (AttendParams.many_rows):
// attend_rows_wanted(B, heads x qlen, SMs) (MLA_ATTEND_ROWS_MIN overrides the row threshold for
// every batch; 100000 turns it off). The planner counts kAttendRowsPerCta-row CTAs; the launch
// takes 32- or 48-row ones where a request needs as many of them (attend_rows_cta_rows(heads x qlen)).
// 17: more query rows than one 16-row CTA holds; from there the 16-row kernel reads every tile once
// per 16 rows (H200, s15b: 24 rows 121.6 vs 154.0 µs, 32 rows 123.0 vs 153.6, 36 rows 141.9 vs 220.4
// at B64 x 8192; 12 and 16 rows stay 16-row: 87.4 vs 120.0).
inline constexpr int kAttendRowsMinDefault = 17;
inline constexpr int kAttendRowsPerCta = 64;
// Requests of up to kAttendRowsSmallBatchMax rows take it from a batch of kAttendRowsSmallBatch;
// taller ones where the batch fills a quarter wave of its 64-row CTAs.
inline constexpr int kAttendRowsSmallBatchMax = 48;
inline constexpr int kAttendRowsSmallBatch = 2;
int attend_rows_min();
bool attend_rows_wanted(int batch, int rows, int sms);
// The CTAs of one (request, split) and the CTA slots of one wave for the attend kernel a step of
// `rows` query rows a request (heads x qlen) takes, as the split planner counts them
// (CudaBackend::plan_splits, flat_ctas; attend_route.cu says which kernel and why). Host arithmetic
// under the switches above (tests/gpu/test_rows_rule.cpp runs it without a GPU).
struct AttendShape {
  int m_tiles, slots;  // CTAs of one (request, split); CTA slots of one wave
  bool many_rows;      // the many-rows kernel (AttendParams.many_rows)
};
// rows_boxes: TMA boxes the cache's pages for the many-rows kernel (attend_rows_q_split_boxes); where it
// does not, a bf16 query over an fp8 cache keeps the 16-row plan (the rows split needs boxes; the
// 16-row split copies such pages by rows).
AttendShape attend_plan_shape(int batch, int rows, bool q_bf16, bool cache_fp8, int sms, bool rows_boxes = true);
// Whether TMA boxes these pages for the many-rows kernel's split of a bf16 query (attend_wgmma_uses_tma
// of a step's such launch over them), from the cache alone: what the planner knows before the launch.
bool attend_rows_q_split_boxes(const void* cache, bool cache_fp8, int64_t page_stride, int64_t row_stride,
                             int page_size, int64_t num_pages);
int attend_rows_cta_rows(int rows);
// Whether an even batch's fixed splits (fixed_ctas CTAs) fill their waves of `slots` well enough to
// keep them: of the slots of ceil(fixed_ctas / slots) waves, 85% for the many-rows kernel (MLA_ROWS_FILL=full:
// 100%, a measurement, attend_route.cu; one CTA an SM, compute-bound: a CTA's time goes with its tiles), 2/3 for the
// 16-row kernel (two an SM, memory-bound: a lone CTA on an SM streams faster, so a partly filled wave loses less).
// The 16-row kernel at 12-16 heads (264 slots): B = 64 and 128 fill 97%; B = 150 57% (150 CTAs, one split
// each), B = 100 76% (2 splits), B = 200 76%, B = 300 57% (two waves, the second 36 CTAs). The
// many-rows kernel (132 slots): D, E, F, G and 96 heads 97%; B = 67 x 128 heads 51%, B = 100 76%
// (200 64-row CTAs). Such batches take the flat plan by default (MLA_ATTEND_FLAT=fill, s36a), whose
// key-CTAs then make whole waves (attend_flat_key_ctas). H100, session 37 (fixed against flat, us):
// 12 heads x 4096 B = 150 147 / 139, B = 300 322 / 272, B = 100 92 / 97 and B = 200 175 / 179 (76%:
// slower, hence 2/3); 128 heads x 8192 B = 67 461 / 301, B = 100 467 / 406. min_fill_per_mille > 0:
// that share for the 16-row kernel instead of 2/3 (attend_fill_per_mille, the default where boxed).
bool attend_fixed_fills_its_waves(int64_t fixed_ctas, int slots, bool many_rows, int min_fill_per_mille = 0);
// s38a (the default since session 39; MLA_ATTEND_FILL_BW=0: the 2/3 rule everywhere): the 16-row
// kernel's share from the device's memory bandwidth, where it boxes the pages (not page 1's row
// copies). A lone 16-row CTA streams ~16 GB/s (B = 150 x 4096 with one fixed split a request: 354 MB in 147 us on an H100, 144 on an H200, so the CTA's rate, not the memory, bounds it),
// so c fixed CTAs run at ~min(BW, c x 16 GB/s) and the flat plan at ~BW less its segment switches: the
// flat plan pays where c < BW / (16 GB/s x 1.25). BW: 0.87 of the peak (the copy rate measured on
// both: 2.9-3.0 of 3.35 TB/s, 4.23 of 4.92); 2 CTAs an SM (the fp8 and bf16-query instances: the
// backend asks only where the plan has 2 sms slots). Clamped to [2/3, 85%]: H100 SXM (3.35 TB/s, 132
// SMs) 55% -> 0, the exact 2/3 rule; H200 (4.92) 810 per mille. The margin, 1.25, from the H200
// (session 39, fixed / flat, us, 12 heads, page 64): B = 56 x 4096 (224 CTAs, 85%) 44.4 / 47.7, B = 70
// (210, 80%) 57.5 / 56.1, B = 100 (200, 76%) 80.4 / 72.8, B = 200 146 / 129, x 8192 B = 100 144 / 127
// and B = 200 281 / 237; the model's 1.15 would have sent B = 56 flat. At short contexts the flat
// plan's segment switches weigh more than the model counts.
int attend_fill_per_mille(double peak_gbps, int sms);
bool attend_fill_from_bandwidth();
// A device's peak memory bandwidth, GB/s: its memory clock x bus width, double data rate (H100 SXM
// 2619 MHz x 5120 bits = 3352, H200 3201 MHz x 6144 bits = 4917).
double device_peak_gbps(int device);
// The flat plan's key-CTAs for `batch` requests of m_tiles row tiles on `slots` CTA slots: every slot
// of one wave, or as many as the requests (the default: at least one a request); whole_waves
// (the default, MLA_ATTEND_FLAT=fill): the fewest whole waves that give each request one (B = 100 x 128 heads:
// 132 key-CTAs, 264 CTAs in two full waves, where 100 give 200); at most kMaxPostPartials - 1.
int attend_flat_key_ctas(int batch, int m_tiles, int slots, bool whole_waves);
// At page 1, 64- and 48-row CTAs with an even number of row tiles a request run the row tiles of
// the same keys as 2-CTA clusters, each CTA's producer issuing one tile of every pair into both
// (TMA multicast: half the boxes an SM), where all the launch's pairs fit at once:
// attend_rows_max_pairs(rows_per_cta) clusters of two (0 for 32-row CTAs, which take none).
// MLA_ROWS_MULTICAST=0 turns it off (attend_rows.cu: measured).
int attend_rows_max_pairs(int rows_per_cta);
// An fp8 cache's pages of fewer rows than this are boxed by TMA for the many-rows kernel only (one
// box a key row at page 1, its producer issuing; session 24), not for the 16-row kernel (bulk row
// copies there: five boxes a row cost more than its copy, v20).
inline constexpr int kFp8SmallPage = 8;
// Where the fp8 many-rows kernel cannot take TMA tiles (pages not a power of two rows), it
// gathers its tiles a row at a time by cp.async: rows 16-byte aligned, and the chunks rounded to
// whole tiles as with TMA (the step's partials, or one split); else the 16-row kernel takes them.
bool attend_rows_gathers(const AttendParams& p);
void prepare_attend_rows_kernel();
// The bf16 many-rows kernel (attend_rows_bf16.cu): where the planner asked for many rows, with a
// bf16 query and cache, TMA tiles, a one-rounded P (the step's partials, or a caller's bf16 o under
// MLA_ATTEND_KERNEL=wgmma). Elsewhere a bf16 operand takes the mma.sync kernel.
bool attend_rows_bf16_applies(const AttendParams& p);
void prepare_attend_rows_bf16_kernel();
void prepare_attend_wgmma_kernels();
// Raises the dynamic shared-memory limit of the attend kernels; once per process and device,
// outside any graph capture.
void prepare_attend_kernels();

// --- post -----------------------------------------------------------------------------------------

// Partials (splits x DCP ranks) post's merge weights hold in shared memory: the split planner's bound.
constexpr int kMaxPostPartials = 512;

// Merge of split partials (softmax_state.hpp), out = (o @ W_UV^T) * gate, bf16.
struct PostParams {
  const void* o;  // [splits, S, G, 512] f32 or bf16, strides below, 1
  bool o_bf16;
  int splits;
  int64_t o_split_stride, o_s_stride, o_h_stride;
  const float* lse;  // [splits, S, G]
  int64_t lse_split_stride, lse_s_stride, lse_h_stride;
  const uint8_t* w_codes;   // [N, V, L/2] MXFP4 codes of W_UV
  const uint8_t* w_scales;  // [N, V, L/32]
  const uint16_t* gate;     // [S, N*V] bf16, row stride gate_stride; null without a gate
  int64_t gate_stride;
  uint16_t* out;            // [S, N*V] bf16, row stride out_stride
  int64_t out_stride;
  int tokens, heads, head_offset, v_dim;  // heads = N, head_offset = dcp.rank * N
  // The flat plan's partials (AttendParams.flat_ctas): token s of request b = s / qlen merges
  // partials part_first[b] .. + part_count[b] - 1 at token row s % qlen; null: `splits` partials.
  const int32_t* part_first = nullptr;
  const int32_t* part_count = nullptr;
  int qlen = 1;
  int sms = 0;  // the device's SMs (post_mma_kernel's CTA height: 32 rows where 128 would not fill them)
};
void launch_post(const PostParams& p, cudaStream_t stream);
// Whether post's CUDA-core kernel (below 16 tokens: mma_products) runs a head's v_blocks CTAs as
// clusters of kPostCluster that share the merge of a token's partials out (post.cu's post_kernel):
// by default (session 38; MLA_POST_CLUSTER=0: never) where every token has `splits` >=
// kPostClusterMinPartials partials (0: the flat plan's per-request counts, unknown on the host),
// under MLA_POST_CLUSTER=force wherever v_blocks allows (as device-check runs the tests).
inline constexpr int kPostCluster = 4;
inline constexpr int kPostClusterMinPartials = 32;
bool post_clusters(int splits, int v_blocks);
// Sets post_mma_kernel's shared-memory limit on the current device (the backend's constructor).
void prepare_post_kernels();

// pre's W_UK and post's W_UV products run on the tensor cores (mxfp4_mma.cuh) from 16 tokens and
// 384 (token, head) rows on; below, the CUDA-core kernels built for latency at decode's few
// tokens. H200, session 26 (graph step, each twice): 16 tokens x 12 heads 83.2-83.6 vs 81.9-82.1 us
// and 2 x qlen 8 80.4 vs 77.8-77.9 on the tensor cores, but 32 x 12 95.4-95.8 vs 113.1, 16 x 64
// heads 121.0-121.3 vs 166.4-167.0, 64 x 12 133.6-134.2 vs 164.6-165.5, 64 x 128 417 vs 820.
// MLA_MMA_PRODUCTS_MIN=N: from N tokens on, whatever the heads (1: every step, as device-check
// runs the GPU tests once; 1000000: never).
inline constexpr int kMmaProductsMinTokens = 16;
inline constexpr int kMmaProductsMinRows = 384;
bool mma_products(int64_t tokens, int heads);

}  // namespace mla::cuda
