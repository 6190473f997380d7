// DCP ownership math (mla/dcp.hpp) against brute force, and the CPU thread communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/dcp.hpp"
#include "mla/comm.hpp"
#include "mla/dcp.hpp"
#include "mla/error.hpp"

namespace mla {
namespace {

// Brute force: walk positions 0..len-1, deal them to ranks by the SPEC's rule, count.
struct Dealt {
  std::vector<std::vector<int64_t>> positions;  // [rank] -> positions in local order
};
Dealt deal(int w, int interleave, int64_t len) {
  Dealt d;
  d.positions.resize(w);
  for (int64_t p = 0; p < len; ++p) d.positions[(p / interleave) % w].push_back(p);
  return d;
}

TEST(DcpOwnership, MatchesBruteForce) {
  for (int w : {1, 2, 3, 4, 8}) {
    for (int il : {1, 2, 3, 16, 64}) {
      for (int64_t len = 0; len <= 3 * w * il + 5; ++len) {
        const Dealt dealt = deal(w, il, len);
        for (int r = 0; r < w; ++r) {
          const DcpInfo d{.size = w, .rank = r, .interleave = il};
          const auto& mine = dealt.positions[r];
          ASSERT_EQ(dcp::local_length(d, len), int64_t(mine.size())) << "W=" << w << " I=" << il << " len=" << len
                                                                     << " r=" << r;
          for (size_t j = 0; j < mine.size(); ++j) {
            ASSERT_EQ(dcp::global_position(d, int64_t(j)), mine[j]);
            ASSERT_EQ(dcp::owner(d, mine[j]), r);
            ASSERT_EQ(dcp::local_index(d, mine[j]), int64_t(j));
          }
        }
      }
      // local_length(p + 1) counts this rank's rows at positions <= p: the causal-mask bound.
      for (int r = 0; r < w; ++r) {
        const DcpInfo d{.size = w, .rank = r, .interleave = il};
        for (int64_t p = 0; p < 2 * w * il + 3; ++p) {
          int64_t count = 0;
          for (int64_t j = 0; dcp::global_position(d, j) <= p; ++j) ++count;
          ASSERT_EQ(dcp::local_length(d, p + 1), count);
        }
      }
    }
  }
}

TEST(DcpOwnership, LargePositionsDoNotOverflow) {
  const DcpInfo d{.size = 8, .rank = 5, .interleave = 64};
  const int64_t p = (int64_t(1) << 40) + 5 * 64 + 17;
  EXPECT_EQ(dcp::owner(d, p), 5);
  EXPECT_EQ(dcp::global_position(d, dcp::local_index(d, p)), p);
}

TEST(DcpSlotMapping, MatchesBruteForceWithShuffledPages) {
  std::mt19937 rng(7);
  for (int w : {1, 2, 4, 8}) {
    for (int il : {1, 16, 64}) {
      for (int ps : {1, 16, 64}) {
        for (int qlen : {1, 3, 8}) {
          const int batch = 5;
          std::vector<int32_t> seq_lens(batch);
          for (int b = 0; b < batch; ++b) {
            std::uniform_int_distribution<int> len(qlen, qlen + 3 * w * il);
            seq_lens[b] = (b == 2) ? 0 : len(rng);  // request 2 is padding
          }
          for (int r = 0; r < w; ++r) {
            const DcpInfo d{.size = w, .rank = r, .interleave = il};
            // Each request gets enough shuffled pages for its local rows, plus one spare.
            std::vector<int32_t> indptr{0}, indices;
            int32_t next = 0;
            for (int b = 0; b < batch; ++b) {
              const int64_t pages = (dcp::local_length(d, seq_lens[b]) + ps - 1) / ps + 1;
              for (int64_t k = 0; k < pages; ++k) indices.push_back(next++);
              indptr.push_back(int32_t(indices.size()));
            }
            std::shuffle(indices.begin(), indices.end(), rng);
            const auto slots = dcp::slot_mapping(d, seq_lens, qlen, indptr, indices, ps);
            for (int b = 0; b < batch; ++b) {
              const Dealt req = deal(w, il, seq_lens[b]);
              for (int i = 0; i < qlen; ++i) {
                const int64_t s = slots[b * qlen + i];
                if (seq_lens[b] == 0) {
                  ASSERT_EQ(s, -1);
                  continue;
                }
                const int64_t p = seq_lens[b] - qlen + i;
                const auto& mine = req.positions[r];
                const auto it = std::find(mine.begin(), mine.end(), p);
                if (it == mine.end()) {
                  ASSERT_EQ(s, -1) << "rank " << r << " does not own position " << p;
                } else {
                  const int64_t j = it - mine.begin();
                  ASSERT_EQ(s, int64_t(indices[indptr[b] + j / ps]) * ps + j % ps);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(DcpSlotMapping, RejectsShortPageTablesAndShortSeqLens) {
  const DcpInfo d{.size = 2, .rank = 1, .interleave = 4};
  const std::vector<int32_t> indptr{0, 1}, indices{0};
  // Rank 1 holds 4 + clamp(13 - 16 - 4, 0, 4) ... of 13 positions: 4 + 1 = 5 rows; one page of 4 is too few.
  EXPECT_THROW(dcp::slot_mapping(d, std::vector<int32_t>{13}, 1, indptr, indices, 4), Error);
  EXPECT_NO_THROW(dcp::slot_mapping(d, std::vector<int32_t>{12}, 1, indptr, indices, 4));
  EXPECT_THROW(dcp::slot_mapping(d, std::vector<int32_t>{2}, 4, indptr, indices, 4), Error);
}

TEST(DcpValidate, SizeMustDivideTpAndRankInRange) {
  LayerConfig cfg = LayerConfig::preset("kimi-k3");  // T = 8
  EXPECT_NO_THROW(dcp::validate(cfg, {.size = 8, .rank = 7, .interleave = 64}));
  EXPECT_THROW(dcp::validate(cfg, {.size = 3, .rank = 0, .interleave = 1}), Error);
  EXPECT_THROW(dcp::validate(cfg, {.size = 16, .rank = 0, .interleave = 1}), Error);
  EXPECT_THROW(dcp::validate(cfg, {.size = 4, .rank = 4, .interleave = 1}), Error);
  EXPECT_THROW(dcp::validate(cfg, {.size = 4, .rank = -1, .interleave = 1}), Error);
  EXPECT_THROW(dcp::validate(cfg, {.size = 2, .rank = 0, .interleave = 0}), Error);
}

// Runs fn(rank, comm) on W threads; returns each rank's exception message ("" when none).
template <class Fn>
std::vector<std::string> on_ranks(std::vector<std::unique_ptr<Communicator>>& comms, Fn fn) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        fn(int(r), *comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "?";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

TEST(ThreadComm, AllGatherRowsIntoStridedPaddedDestination) {
  for (int w : {1, 2, 3, 8}) {
    auto comms = make_thread_group(w);
    const int rows = 5, chunk = 12, pad = 7, send_stride = chunk + 3;
    const int recv_stride = w * chunk + pad;
    std::vector<std::vector<uint8_t>> recv(w, std::vector<uint8_t>(rows * recv_stride, 0xEE));
    const auto errors = on_ranks(comms, [&](int r, Communicator& c) {
      std::vector<uint8_t> send(rows * send_stride, 0xDD);
      for (int i = 0; i < rows; ++i)
        for (int k = 0; k < chunk; ++k) send[i * send_stride + k] = uint8_t(r * 50 + i * 7 + k);
      c.all_gather_rows({.send = send.data(), .send_stride = send_stride, .recv = recv[r].data(),
                         .recv_stride = recv_stride, .rows = rows, .chunk_bytes = chunk});
    });
    for (int r = 0; r < w; ++r) {
      ASSERT_EQ(errors[r], "");
      for (int i = 0; i < rows; ++i) {
        for (int q = 0; q < w; ++q)
          for (int k = 0; k < chunk; ++k)
            ASSERT_EQ(recv[r][i * recv_stride + q * chunk + k], uint8_t(q * 50 + i * 7 + k));
        for (int k = w * chunk; k < recv_stride; ++k) ASSERT_EQ(recv[r][i * recv_stride + k], 0xEE) << "pad written";
      }
    }
  }
}

TEST(ThreadComm, AllGatherRowsInPlace) {
  // pre gathers the query in place: rank r's heads already sit at column r*chunk of its buffer.
  const int w = 4, rows = 3, chunk = 8, stride = w * chunk;
  auto comms = make_thread_group(w);
  std::vector<std::vector<uint8_t>> buf(w, std::vector<uint8_t>(rows * stride, 0));
  on_ranks(comms, [&](int r, Communicator& c) {
    for (int i = 0; i < rows; ++i)
      for (int k = 0; k < chunk; ++k) buf[r][i * stride + r * chunk + k] = uint8_t(r * 40 + i * 9 + k);
    c.all_gather_rows({.send = buf[r].data() + r * chunk, .send_stride = stride, .recv = buf[r].data(),
                       .recv_stride = stride, .rows = rows, .chunk_bytes = chunk});
  });
  for (int r = 0; r < w; ++r)
    for (int i = 0; i < rows; ++i)
      for (int q = 0; q < w; ++q)
        for (int k = 0; k < chunk; ++k) ASSERT_EQ(buf[r][i * stride + q * chunk + k], uint8_t(q * 40 + i * 9 + k));
}

TEST(ThreadComm, AllToAllRowsDeliversEachPeersChunk) {
  for (int w : {1, 2, 4, 8}) {
    auto comms = make_thread_group(w);
    const int rows = 6, chunk = 16, send_stride = w * chunk + 4, recv_stride = chunk + 2;
    const int block_stride = rows * recv_stride + 8;
    std::vector<std::vector<uint8_t>> recv(w, std::vector<uint8_t>(w * block_stride, 0xEE));
    const auto errors = on_ranks(comms, [&](int r, Communicator& c) {
      std::vector<uint8_t> send(rows * send_stride);
      for (int i = 0; i < rows; ++i)
        for (int p = 0; p < w; ++p)
          for (int k = 0; k < chunk; ++k) send[i * send_stride + p * chunk + k] = uint8_t(r * 31 + p * 11 + i * 3 + k);
      c.all_to_all_rows({.send = send.data(), .send_stride = send_stride, .recv = recv[r].data(),
                         .recv_block_stride = block_stride, .recv_stride = recv_stride, .rows = rows,
                         .chunk_bytes = chunk});
    });
    for (int r = 0; r < w; ++r) {
      ASSERT_EQ(errors[r], "");
      for (int q = 0; q < w; ++q)
        for (int i = 0; i < rows; ++i) {
          for (int k = 0; k < chunk; ++k)
            ASSERT_EQ(recv[r][q * block_stride + i * recv_stride + k], uint8_t(q * 31 + r * 11 + i * 3 + k));
          for (int k = chunk; k < recv_stride; ++k) ASSERT_EQ(recv[r][q * block_stride + i * recv_stride + k], 0xEE);
        }
    }
  }
}

TEST(ThreadComm, MismatchedCallsThrowOnEveryRank) {
  auto comms = make_thread_group(3);
  const auto errors = on_ranks(comms, [&](int r, Communicator& c) {
    std::vector<uint8_t> send(64), recv(3 * 64);
    const int rows = r == 1 ? 2 : 4;  // rank 1 disagrees
    c.all_gather_rows({.send = send.data(), .send_stride = 8, .recv = recv.data(), .recv_stride = 24,
                       .rows = rows, .chunk_bytes = 8});
  });
  for (const auto& e : errors) EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
  // The group is still usable afterwards: every rank left the failed collective the same way.
  const auto again = on_ranks(comms, [&](int r, Communicator& c) {
    int32_t mine = r, all[3];
    c.all_gather_host(&mine, all, sizeof(mine));
    for (int q = 0; q < 3; ++q) MLA_REQUIRE(all[q] == q, "all_gather_host: wrong value");
  });
  for (const auto& e : again) EXPECT_EQ(e, "");
}

TEST(ThreadComm, AbortWakesWaitingRanks) {
  auto comms = make_thread_group(3);
  const auto errors = on_ranks(comms, [&](int r, Communicator& c) {
    if (r == 2) {
      abort_thread_group(c);  // rank 2 "fails" instead of joining the collective
      throw Error("rank 2 failed");
    }
    int32_t mine = r, all[3];
    c.all_gather_host(&mine, all, sizeof(mine));
  });
  EXPECT_NE(errors[0].find("aborted"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("aborted"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

TEST(DcpStepAgreement, DisagreementOrALocalErrorThrowsOnEveryRank) {
  const LayerConfig cfg = LayerConfig::preset("kimi-k3");
  auto run = [&](auto seq_lens_of, auto error_of) {
    auto comms = make_thread_group(4);
    std::vector<std::string> errors(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        std::vector<int32_t> lens = seq_lens_of(r);
        const int qlen = 2;
        std::vector<int64_t> slots(lens.size() * qlen, -1);
        LayerOptions opts{.dcp = {.size = 4, .rank = r, .interleave = 1}, .comm = comms[r].get()};
        StepMeta meta{.qlen = qlen,
                      .seq_lens = TensorView::contiguous(lens.data(), DType::i32, {int64_t(lens.size())}),
                      .slot_mapping = TensorView::contiguous(slots.data(), DType::i64, {int64_t(slots.size())})};
        try {
          detail::check_step_agreement(opts, meta, error_of(r));
        } catch (const Error& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    return errors;
  };
  const auto same = [](int) { return std::vector<int32_t>{5, 0, 9}; };
  const auto no_error = [](int) { return std::string(); };
  for (const auto& e : run(same, no_error)) EXPECT_EQ(e, "");
  // Rank 3 has other seq_lens (a local length instead of the global one, say).
  for (const auto& e : run([](int r) { return std::vector<int32_t>{5, 0, r == 3 ? 3 : 9}; }, no_error))
    EXPECT_NE(e.find("seq_lens"), std::string::npos) << e;
  // Rank 1 has another batch.
  for (const auto& e : run([](int r) { return std::vector<int32_t>(r == 1 ? 2 : 3, 7); }, no_error))
    EXPECT_NE(e.find("disagree"), std::string::npos) << e;
  // Rank 2's own validation failed: the others must not run the step either.
  const auto errors = run(same, [](int r) { return r == 2 ? std::string("pre: slot_mapping[1] = 99 is out of range") : ""; });
  for (int r = 0; r < 4; ++r) EXPECT_NE(errors[r].find("slot_mapping[1] = 99"), std::string::npos) << errors[r];
  EXPECT_NE(errors[0].find("rank 2"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// gather_query and exchange_partials (core/dcp.cpp) on views the backends may hand them: a
// head-padded query, merged or split partials, splits not evenly spaced (one collective per split).
TEST(DcpCollectives, QueryGatherAndPartialExchangeOnStridedViews) {
  LayerConfig cfg = LayerConfig::preset("kimi-k3");
  cfg.total_heads = 2 * cfg.tp_size;  // N = 2
  const int w = 4, n = 2, g = n * w, row = cfg.row_dim(), l = cfg.kv_lora_rank, s = 3, pad = 3;
  for (int variant = 0; variant < 3; ++variant) {  // 0 merged, 1 split contiguous, 2 split padded
    SCOPED_TRACE("variant " + std::to_string(variant));
    const int splits = variant == 0 ? 1 : 2;
    const int64_t split_gap = variant == 2 ? 5 : 0;  // extra tokens' worth of space between splits
    auto comms = make_thread_group(w);
    std::vector<std::string> errors(w);
    std::vector<std::thread> threads;
    for (int r = 0; r < w; ++r)
      threads.emplace_back([&, r] {
        errors[r] = [&]() -> std::string {
          try {
            const LayerOptions opts{.dcp = {.size = w, .rank = r, .interleave = 1}, .comm = comms[r].get()};
            // Query [S, G + pad, 576] u8 (fp8 codes): this rank's heads hold r*16 + h.
            std::vector<uint8_t> q(size_t(s) * (g + pad) * row, 0xEE);
            for (int t = 0; t < s; ++t)
              for (int h = r * n; h < (r + 1) * n; ++h)
                for (int c = 0; c < row; ++c) q[(size_t(t) * (g + pad) + h) * row + c] = uint8_t(t * 50 + h * 5 + c % 7);
            const TensorView qv = TensorView::strided(q.data(), DType::fp8_e4m3, {s, g, row}, {(g + pad) * row, row, 1});
            detail::gather_query(cfg, opts, qv, nullptr);
            for (int t = 0; t < s; ++t)
              for (int h = 0; h < g + pad; ++h)
                for (int c = 0; c < row; ++c) {
                  const uint8_t want = h < g ? uint8_t(t * 50 + h * 5 + c % 7) : 0xEE;
                  MLA_REQUIRE(q[(size_t(t) * (g + pad) + h) * row + c] == want, "query t ", t, " head ", h, " col ", c);
                }
            // Partials: o[c, t, h, :] = value(r, c, t, h), lse = the same value.
            auto value = [](int rank, int c, int t, int h) { return float(rank * 1000 + c * 100 + t * 10 + h); };
            const int64_t split_stride = (s + split_gap) * g * l;
            std::vector<float> o(size_t(splits) * split_stride, NAN), lse(size_t(splits) * (s + split_gap) * g, NAN);
            for (int c = 0; c < splits; ++c)
              for (int t = 0; t < s; ++t)
                for (int h = 0; h < g; ++h) {
                  for (int k = 0; k < l; ++k) o[c * split_stride + (t * g + h) * l + k] = value(r, c, t, h) + k;
                  lse[(c * (s + split_gap) + t) * g + h] = value(r, c, t, h);
                }
            AttendOutputs attn;
            if (splits == 1) {
              attn = {.o = TensorView::contiguous(o.data(), DType::f32, {s, g, l}),
                      .lse = TensorView::contiguous(lse.data(), DType::f32, {s, g})};
            } else {
              attn = {.o = TensorView::strided(o.data(), DType::f32, {splits, s, g, l}, {split_stride, g * l, l, 1}),
                      .lse = TensorView::strided(lse.data(), DType::f32, {splits, s, g}, {(s + split_gap) * g, g, 1})};
            }
            const auto o_shape = detail::exchanged_o_shape(cfg, opts, attn.o);
            const auto lse_shape = detail::exchanged_lse_shape(cfg, opts, attn.o);
            MLA_REQUIRE(o_shape == std::vector<int64_t>({w * splits, s, n, l}), "exchanged_o_shape");
            std::vector<float> mo(size_t(w) * splits * s * n * l), ml(size_t(w) * splits * s * n);
            detail::exchange_partials(cfg, opts, attn,
                                      {.o = TensorView::contiguous(mo.data(), DType::f32, o_shape),
                                       .lse = TensorView::contiguous(ml.data(), DType::f32, lse_shape)},
                                      nullptr);
            // Block q*splits + c holds rank q's split c of my heads r*N..(r+1)*N.
            for (int qr = 0; qr < w; ++qr)
              for (int c = 0; c < splits; ++c)
                for (int t = 0; t < s; ++t)
                  for (int h = 0; h < n; ++h) {
                    const int64_t i = ((int64_t(qr) * splits + c) * s + t) * n + h;
                    const float v = value(qr, c, t, r * n + h);
                    MLA_REQUIRE(ml[i] == v, "lse block ", qr, " split ", c, " t ", t, " h ", h, ": ", ml[i], " != ", v);
                    for (int k = 0; k < l; k += 97) MLA_REQUIRE(mo[i * l + k] == v + k, "o block ", qr, " k ", k);
                  }
            return "";
          } catch (const std::exception& e) {
            abort_thread_group(*comms[r]);
            return e.what();
          }
        }();
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < w; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
}

}  // namespace
}  // namespace mla
