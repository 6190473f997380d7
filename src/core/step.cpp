#include "mla/step.hpp"

#include "mla/error.hpp"

namespace mla {

PageTable page_table_from_block_table(std::span<const int32_t> block_table, int batch, int max_pages,
                                      std::span<const int32_t> local_seq_lens, int page_size) {
  constexpr const char* kWhere = "page_table_from_block_table";
  MLA_REQUIRE(batch >= 0, kWhere, ": batch: expected >= 0, got ", batch);
  MLA_REQUIRE(max_pages >= 0, kWhere, ": max_pages: expected >= 0, got ", max_pages);
  MLA_REQUIRE(page_size >= 1, kWhere, ": page_size: expected >= 1, got ", page_size);
  MLA_REQUIRE(block_table.size() >= size_t(batch) * size_t(max_pages), kWhere,
              ": block_table: expected at least batch * max_pages = ", size_t(batch) * size_t(max_pages),
              " entries, got ", block_table.size());
  MLA_REQUIRE(local_seq_lens.size() == size_t(batch), kWhere, ": local_seq_lens: expected ", batch,
              " entries (batch), got ", local_seq_lens.size());

  PageTable t;
  t.kv_indptr.reserve(size_t(batch) + 1);
  t.kv_indptr.push_back(0);
  for (int b = 0; b < batch; ++b) {
    const int64_t len = local_seq_lens[size_t(b)];
    MLA_REQUIRE(len >= 0, kWhere, ": local_seq_lens[", b, "]: expected >= 0, got ", len);
    const int64_t pages = (len + page_size - 1) / page_size;
    MLA_REQUIRE(pages <= max_pages, kWhere, ": local_seq_lens[", b, "] = ", len, " needs ", pages,
                " pages of ", page_size, ": expected at most max_pages = ", max_pages);
    for (int64_t k = 0; k < pages; ++k) {
      const int32_t page = block_table[size_t(b) * size_t(max_pages) + size_t(k)];
      MLA_REQUIRE(page >= 0, kWhere, ": block_table[", b, ", ", k, "]: expected a page index >= 0, got ",
                  page);
      t.kv_indices.push_back(page);
    }
    MLA_REQUIRE(t.kv_indices.size() <= size_t(INT32_MAX), kWhere,
                ": kv_indices: more than 2^31 - 1 entries do not fit kv_indptr's i32");
    t.kv_indptr.push_back(int32_t(t.kv_indices.size()));
  }
  return t;
}

}  // namespace mla
