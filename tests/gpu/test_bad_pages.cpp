// A page id past the cache inside one request's page list, on the attend paths whose tile issue
// checks it per box (the bf16 many-rows kernel at every page size it boxes: one-row and two-row
// boxes and pages of 8 keys by TmaTiles::issue, pages of 16 and 32 keys by each warp's lean box
// issue (the default since session 42; TmaTiles::issue under MLA_ROWS_BF16_LEAN=1), pages of 64+ keys
// by the lean one-box issue (TmaTiles::issue under MLA_ROWS_BF16_LEAN=0); ctest runs it under each), in
// even batches (fixed splits) and uneven ones (where the plan may share key-CTAs across requests): the
// step reports it (kBadPage), never reads the page (every output finite), and every other request's
// output is the CPU's on the good page list. (CudaBackend.BadDeviceMetadataIsReportedAndNotWritten
// puts a bad id on a random case's first page.) Without a GPU every test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/synthetic.hpp"
#include "cuda/device_errors.hpp"
#include "cuda/stages.hpp"
#include "gpu/gpu_test_util.hpp"
#include "mla/mla.hpp"
#include "support/testing.hpp"

namespace mla {
namespace {

TEST(BadPages, Bf16ManyRowsBadPageIdStaysInItsRequest) {
  MLA_SKIP_WITHOUT_GPU("the bad page id tests");
  const int heads = 16, qlen = 4, batch = 40, bad_request = 1;  // 64 query rows: the many-rows kernel
  uint64_t seed = 4100;
  for (const bool uneven : {false, true}) {
    for (const int page : {1, 2, 8, 16, 32, 64, 128}) {
      ++seed;
      SCOPED_TRACE("page " + std::to_string(page) + (uneven ? ", uneven" : ", even"));
      const LayerConfig cfg = testing::small_config("kimi-k3", GateLayout::merged, heads);
      synth::ScenarioSpec spec;
      spec.cfg = cfg;
      spec.qlen = qlen;
      spec.page_size = page;
      spec.kv_dtype = DType::bf16;
      spec.spare_pages = 3;
      spec.seed = seed;
      std::mt19937_64 rng(seed);
      // (the bad request's 600 keys span 5+ pages at every size; even: within the eighth of the
      // longest that keeps fixed splits, flat::lengths_even)
      for (int b = 0; b < batch; ++b)
        spec.seq_lens.push_back(b == bad_request ? 600
                                : uneven         ? std::uniform_int_distribution<int>(qlen, 600)(rng)
                                                 : std::uniform_int_distribution<int>(530, 600)(rng));
      const PreparedWeights w = prepare_weights(cfg, random_checkpoint_weights(cfg, seed));
      const synth::Scenario host = synth::make_scenario(spec, w.k_scale);
      const int64_t s = host.tokens(), nv = int64_t(cfg.heads()) * cfg.v_head_dim;
      auto options = [&](Backend backend) {
        return LayerOptions{.backend = backend, .q_dtype = DType::bf16, .max_tokens = int(s), .num_threads = 2};
      };
      Layer cpu(cfg, w, options(Backend::cpu)), gpu(cfg, w, options(Backend::cuda));
      synth::Scenario cpu_host = synth::make_scenario(spec, w.k_scale);
      Tensor cpu_out = Tensor::empty(DType::bf16, {s, nv});
      cpu.step(cpu_host.hidden, cpu_host.meta(), cpu_host.kv(), cpu_out);

      // The bad request's middle page id past the cache, on the device copy only.
      synth::Scenario dev = synth::to_device(host);
      const int32_t* indptr = host.kv_indptr.ptr<int32_t>();
      std::vector<int32_t> indices(host.kv_indices.ptr<int32_t>(),
                                   host.kv_indices.ptr<int32_t>() + host.kv_indices.view().numel());
      const int32_t first = indptr[bad_request], n = indptr[bad_request + 1] - first;
      ASSERT_GE(n, 3);
      indices[first + n / 2] = int32_t(host.cache.view().shape[0]) + 5;
      dev.kv_indices.copy_from(TensorView::contiguous(indices.data(), DType::i32, {int64_t(indices.size())}));
      Tensor gpu_out = Tensor::empty(DType::bf16, {s, nv}, Device::cuda);
      testing::poison(gpu_out);
      gpu.step(dev.hidden, dev.meta(), dev.kv(), gpu_out);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const uint32_t bits = cuda::take_device_errors(detail::backend_of(gpu));
      EXPECT_NE(bits & cuda::kBadPage, 0u) << cuda::describe_device_errors(bits);
      if (!testing::attend_rerouted()) {
        const cuda::AttendRun ran = cuda::last_attend_run(detail::backend_of(gpu));
        EXPECT_EQ(ran.family, cuda::AttendKernel::kRowsBf16) << gpu.last_attend_kernel();
      }

      // Every output finite; the other requests' tokens (token b qlen + i is request b's i-th) as
      // the CPU's within SPEC's 1e-2 relative L2.
      const std::vector<double> g = testing::to_doubles(gpu_out.to_host()), c = testing::to_doubles(cpu_out);
      ASSERT_EQ(g.size(), c.size());
      double err = 0, ref = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_TRUE(std::isfinite(g[i])) << "output " << i;
        if (int64_t(i) / nv / qlen == bad_request) continue;
        err += (g[i] - c[i]) * (g[i] - c[i]);
        ref += c[i] * c[i];
      }
      EXPECT_LE(std::sqrt(err / ref), 1e-2) << "the other requests' outputs against the CPU's";
    }
  }
}

}  // namespace
}  // namespace mla
