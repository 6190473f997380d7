#pragma once
// The device buffer of a measurement's clock stamps (MLA_ATTEND_TIMELINE in attend_wgmma.cu, MLA_ROWS_BF16_TIMELINE in
// attend_rows_bf16.cu, MLA_ROWS_TIMELINE in attend_rows.cu): a kernel instance writes its stamps there and the host
// reads them back after an eager launch (StampBuffer::launch: one place for the three launches' common steps).
// Grown only outside a graph capture (a capture may neither synchronize nor allocate), so a shape's first launch must
// be eager; inside a capture the graph's kernel stamps into the same buffer and nothing is read back.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/check.hpp"

namespace mla::cuda {

class StampBuffer {
 public:
  // One stamped launch: `launch_kernel(stamps)` with the buffer for `words` stamps on `stream`, zeroed first outside a
  // capture (`what` names the switch in an error). Returns the stamps once the launch is done, or, inside a graph
  // capture, nothing (the graph stamps into the same buffer when replayed).
  template <class Launch>
  std::vector<uint64_t> launch(size_t words, cudaStream_t stream, const char* what, Launch&& launch_kernel) {
    bool capturing = false;
    uint64_t* stamps = prepare(words, stream, what, capturing);
    if (!capturing) MLA_CUDA_CHECK(cudaMemsetAsync(stamps, 0, words * sizeof(uint64_t), stream));
    launch_kernel(stamps);
    MLA_CUDA_CHECK_LAUNCH();
    return capturing ? std::vector<uint64_t>{} : fetch(words, stream);
  }

 private:
  // The buffer for `words` stamps on `stream` (grown if needed; `what` names the switch in the error), and whether the
  // stream is capturing a graph.
  uint64_t* prepare(size_t words, cudaStream_t stream, const char* what, bool& capturing) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MLA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    capturing = capture != cudaStreamCaptureStatusNone;
    if (words > capacity_ && !capturing) {
      MLA_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (data_) MLA_CUDA_CHECK(cudaFree(data_));
      MLA_CUDA_CHECK(cudaMalloc(&data_, words * sizeof(uint64_t)));
      capacity_ = words;
    }
    MLA_REQUIRE(words <= capacity_, what, ": the first launch of a shape must be outside a graph capture");
    return data_;
  }
  // The first `words` stamps, once the stream's work is done (an eager launch only).
  std::vector<uint64_t> fetch(size_t words, cudaStream_t stream) const {
    std::vector<uint64_t> host(words);
    MLA_CUDA_CHECK(cudaMemcpyAsync(host.data(), data_, words * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
    MLA_CUDA_CHECK(cudaStreamSynchronize(stream));
    return host;
  }

 private:
  uint64_t* data_ = nullptr;  // (kept for the process: a measurement's launches reuse it)
  size_t capacity_ = 0;
};

// A measurement's CSV file, opened for writing (`what` names the switch in the error).
inline std::FILE* open_stamp_csv(const char* path, const char* what) {
  std::FILE* f = std::fopen(path, "w");
  MLA_REQUIRE(f != nullptr, what, ": cannot write ", path);
  return f;
}

}  // namespace mla::cuda
