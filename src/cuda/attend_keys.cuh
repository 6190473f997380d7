#pragma once
// What both attend kernels share (attend.cu: mma.sync, any dtype; attend_wgmma.cu: Hopper wgmma,
// fp8): which keys a CTA reads and where their rows are. A CTA serves one (request, split) and a
// tile of query rows; it streams the split's local keys in tiles of kTileKeys, and for each tile
// one thread per key turns the page table into a row address and a global position (page_of
// issues the kv_indices load, publish uses it, so that the load of a later tile's page ids hides
// behind this tile's math).
#include <climits>
#include <cstdint>

#include "cuda/fast_div.hpp"
#include "cuda/skew_plan.hpp"
#include "cuda/device_math.cuh"
#include "cuda/stages.hpp"

namespace mla::cuda {

inline constexpr int kTileKeys = 64;
inline constexpr int kTileKeysLog2 = 6;

// Element offset of the query's row m (query m / G, head m % G) of request b, dim d.
__device__ __forceinline__ int64_t query_offset(const AttendParams& p, int b, int m, int d) {
  return (int64_t(b) * p.qlen + m / p.heads) * p.q_s_stride + int64_t(m % p.heads) * p.q_h_stride + d;
}
// The same for row m = (query t, head h) given as such (the 16-row kernel: t by fast_div). (Not the
// above's body: delegating to it changed the other kernels' SASS.)
__device__ __forceinline__ int64_t query_offset(const AttendParams& p, int b, int t, int h, int d) {
  return (int64_t(b) * p.qlen + t) * p.q_s_stride + int64_t(h) * p.q_h_stride + d;
}

// The tiles of rows_per_cta query rows a (request, split) (host side; CtaWork::tiles_of on the device).
inline int attend_row_tiles(const AttendParams& p, int rows_per_cta) {
  return (p.heads * p.qlen + rows_per_cta - 1) / rows_per_cta;
}

// The grid of an attend launch: one CTA per (request, split, tile of rows_per_cta query rows), the
// row tiles of one (request, split) adjacent (CtaWork decodes it).
inline dim3 attend_grid(const AttendParams& p, int rows_per_cta) {
  return dim3(unsigned(p.batch) * unsigned(p.splits) * unsigned(attend_row_tiles(p, rows_per_cta)));
}

// The same with the flat plan (AttendParams.flat_ctas key-CTAs x the row tiles) where it is on.
inline dim3 attend_launch_grid(const AttendParams& p, int rows_per_cta) {
  return p.flat_ctas > 0 ? dim3(unsigned(p.flat_ctas) * unsigned(attend_row_tiles(p, rows_per_cta)))
                         : attend_grid(p, rows_per_cta);
}

// What a CTA serves: request b, split `split` and query rows m_base .. m_base + rows_per_cta - 1
// (rows m = i*G + h: query i, head h). The row tiles of one (request, split) are adjacent in the
// grid, so the CTAs that read the same keys run together and all but the first find them in L2.
// (FastDivs: the divisions by the host's multiply-shifts, AttendParams' *_magic: the 16-row
// kernel's default TMA instance, s23a.)
struct FastDivs {};
// FastDivs with the fixed splits skewed toward the CTAs placed first (skew_plan.hpp, s33a).
struct SkewedFastDivs {};
struct CtaWork {
  int rows_total, m_tile, b, split, m_base;
  bool reporter;  // one thread of the request reports request-level errors, once
  int work;        // blockIdx.x / m_tiles (FastDivs only)
  int last_query;  // last_row(rows_per_cta) / heads (FastDivs only)

  __device__ CtaWork(const AttendParams& p, int rows_per_cta, int tid) {
    const int m_tiles = tiles_of(p, rows_per_cta);
    const int work = blockIdx.x / m_tiles;
    place(rows_per_cta, tid, blockIdx.x % m_tiles, work / p.splits, work % p.splits);
  }
  __device__ CtaWork(const AttendParams& p, int rows_per_cta, int tid, FastDivs) {
    const int m_tiles = tiles_of(p, rows_per_cta);
    work = fast_div(int(blockIdx.x), p.m_tiles_magic);
    const int request = fast_div(work, p.splits_magic);
    place(rows_per_cta, tid, int(blockIdx.x) - work * m_tiles, request, work - request * p.splits);
    last_query = fast_div(last_row(rows_per_cta), p.heads_magic);
  }
  __device__ CtaWork(const AttendParams& p, int rows_per_cta, int tid, SkewedFastDivs) {
    const int m_tiles = tiles_of(p, rows_per_cta);
    const skew::Cta s = skew::cta_of_fast(int(blockIdx.x), int(gridDim.x), m_tiles, p.m_tiles_magic);
    work = s.work;
    const int request = fast_div(work, p.splits_magic);
    place(rows_per_cta, tid, s.m_tile, request, work - request * p.splits);
    last_query = fast_div(last_row(rows_per_cta), p.heads_magic);
  }
  __device__ int last_row(int rows_per_cta) const { return min(rows_total, m_base + rows_per_cta) - 1; }

 private:
  __device__ int tiles_of(const AttendParams& p, int rows_per_cta) {
    rows_total = p.heads * p.qlen;
    return (rows_total + rows_per_cta - 1) / rows_per_cta;
  }
  __device__ void place(int rows_per_cta, int tid, int m_tile_, int b_, int split_) {
    m_tile = m_tile_, b = b_, split = split_;
    m_base = m_tile * rows_per_cta;
    reporter = tid == 0 && split == 0 && m_tile == 0;
  }
};

// A key of a tile as page_of found it: local index, page id as loaded, global position.
struct KeyRow {
  int32_t j = -1;     // local key index, -1: none
  int32_t page = -1;  // page id as loaded
  int32_t pos = INT_MAX;
};

// The local keys of request b's split `split` (SPEC.md: chunk c covers [c*ceil(n/splits),
// min(n, (c+1)*ceil(n/splits)))), seen by query rows m_base .. last_row of the CTA. `reporter`
// (one thread of the request) reports a bad length or a short page table. chunk_align > 1 rounds
// the chunk up to a multiple of it (the TMA kernel's page-aligned tiles; the merged result does
// not depend on the chunking, only the partials do).
struct KeyStream {
  int32_t seq_len;
  bool len_ok;
  int64_t k_begin, k_end;
  int32_t page_begin;
  int64_t pages_avail;
  int32_t tile_limit;    // the CTA's last visible global position (causal), -1: none
  int page_shift;        // log2(page_size) for power-of-two pages (1, 16, 64, ...), else -1
  bool plain_positions;  // W = 1: a key's local index is its position
  int elem_bytes;        // 1 (fp8 cache) or 2 (bf16)

  __device__ KeyStream(const AttendParams& p, int b, int split, int last_row, bool reporter, int chunk_align = 1) {
    split_range<false>(p, b, split, last_row, reporter, chunk_align);
  }
  // The same given the CTA's last query (last_row / heads: CtaWork's with FastDivs).
  __device__ KeyStream(const AttendParams& p, int b, int split, bool reporter, int chunk_align, int last_query,
                       FastDivs) {
    split_range<true>(p, b, split, last_query, reporter, chunk_align);
  }
  // The same with the pair's keys skewed toward its even split (skew_plan.hpp).
  __device__ KeyStream(const AttendParams& p, int b, int split, bool reporter, int chunk_align, int last_query,
                       SkewedFastDivs) {
    split_range<true, true>(p, b, split, last_query, reporter, chunk_align);
  }
  // Local keys [begin, end) of request b (the flat plan's segments; end is clipped to the length).
  __device__ KeyStream(const AttendParams& p, int b, int64_t begin, int64_t end, int last_row, bool reporter) {
    range<false>(p, b, begin, end, last_row, reporter);
  }
  __device__ KeyStream(const AttendParams& p, int b, int64_t begin, int64_t end, bool reporter, int last_query,
                       FastDivs) {
    range<true>(p, b, begin, end, last_query, reporter);
  }

 private:
  // Everything but the key range; returns the request's local length.
  // (kQuery: `last` is the CTA's last query, else its last row.)
  template <bool kQuery>
  __device__ int64_t init(const AttendParams& p, int b, int last, bool reporter) {
    seq_len = p.seq_lens[b];
    len_ok = seq_len == 0 || seq_len >= p.qlen;
    if (!len_ok && reporter) atomicOr(p.error, kBadSeqLen);
    page_begin = p.kv_indptr[b];
    pages_avail = int64_t(p.kv_indptr[b + 1]) - page_begin;
    tile_limit = len_ok ? seq_len - p.qlen + (kQuery ? last : last / p.heads) : -1;
    page_shift = __popc(p.page_size) == 1 ? __ffs(p.page_size) - 1 : -1;
    plain_positions = p.dcp_size == 1;
    elem_bytes = p.cache_fp8 ? 1 : 2;
    return len_ok && seq_len > 0 ? dcp_local_length(seq_len, p.dcp_size, p.dcp_rank, p.dcp_interleave) : 0;
  }
  template <bool kQuery, bool kSkew = false>
  __device__ void split_range(const AttendParams& p, int b, int split, int last, bool reporter, int chunk_align) {
    const int64_t n_local = init<kQuery>(p, b, last, reporter);
    if constexpr (kSkew) {
      const skew::Range r = skew::split_range(n_local, p.splits, split, chunk_align);
      k_begin = r.begin, k_end = r.end;
    } else {
      const int64_t chunk = ((n_local + p.splits - 1) / p.splits + chunk_align - 1) / chunk_align * chunk_align;
      k_begin = min(n_local, int64_t(split) * chunk);
      k_end = min(n_local, k_begin + chunk);
    }
    check_pages(p, n_local, reporter);
  }
  template <bool kQuery>
  __device__ void range(const AttendParams& p, int b, int64_t begin, int64_t end, int last, bool reporter) {
    const int64_t n_local = init<kQuery>(p, b, last, reporter);
    k_begin = min(n_local, begin);
    k_end = min(n_local, end);
    check_pages(p, n_local, reporter);
  }
  __device__ void check_pages(const AttendParams& p, int64_t n_local, bool reporter) const {
    if (reporter && (pages_avail < 0 || n_local > pages_avail * p.page_size)) atomicOr(p.error, kShortPageTable);
  }

 public:

  __device__ int n_tiles() const { return int((k_end - k_begin + kTileKeys - 1) / kTileKeys); }

  // Causal limit of query row m (query i sees global positions <= seq_len - Q + i); rows past the
  // request's (padding) see nothing.
  __device__ int32_t limit(const AttendParams& p, int m, int rows_total) const {
    return m < rows_total && len_ok ? seq_len - p.qlen + m / p.heads : -1;
  }
  // The same for a row of query t (t = m / heads as the caller has it: the 16-row kernel's fast_div).
  __device__ int32_t limit_of_query(const AttendParams& p, int m, int rows_total, int t) const {
    return m < rows_total && len_ok ? seq_len - p.qlen + t : -1;
  }

  // Local key j's global position (the causal rule's): j itself where W = 1, else its DCP rank's
  // interleaved position.
  __device__ int64_t position(const AttendParams& p, int64_t j) const {
    return plain_positions ? j : dcp_global_position(j, p.dcp_size, p.dcp_rank, p.dcp_interleave);
  }

  // Key `key` of tile `tile` (key < kTileKeys): issues its page id load.
  __device__ KeyRow page_of(const AttendParams& p, int tile, int key) const {
    KeyRow k;
    const int64_t j = k_begin + int64_t(tile) * kTileKeys + key;
    if (key < kTileKeys && j < k_end) {
      const int32_t pos = int32_t(position(p, j));
      if (pos <= tile_limit) {
        const int32_t page_index = page_shift >= 0 ? int32_t(j) >> page_shift : int32_t(j) / p.page_size;
        if (page_index < pages_avail) {
          k.j = int32_t(j);
          k.pos = pos;
          k.page = p.kv_indices[page_begin + page_index];
        }
      }
    }
    return k;
  }

  // The row address (null: masked, to be zero-filled, never read) and position (INT_MAX: masked)
  // of a key page_of found. A key past the chunk, past the causal limit or on a bad page is masked,
  // so NaN in unused pages never reaches a tensor-core product; a bad page id is reported.
  __device__ void publish(const AttendParams& p, const KeyRow& k, const uint8_t*& row, int32_t& pos) const {
    row = nullptr;
    pos = INT_MAX;
    if (k.j < 0) return;
    if (k.page >= 0 && k.page < p.num_pages) {
      const int64_t in_page = page_shift >= 0 ? k.j & (p.page_size - 1) : k.j % p.page_size;
      row = static_cast<const uint8_t*>(p.cache) + (int64_t(k.page) * p.page_stride + in_page * p.row_stride) * elem_bytes;
      pos = k.pos;
    } else {
      atomicOr(p.error, kBadPage);
    }
  }
};

}  // namespace mla::cuda
