#pragma once
// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent() may start
// while the kernel before it on the stream is still running, and overlaps its prologue (loads of
// weights, which no kernel writes) with that kernel's tail and the launch gap. The rule that makes
// this safe, for every kernel launched so: before wait_for_prior_grids() it reads only the layer's
// constant weights and writes nothing; after it, every earlier kernel of the stream has completed
// and its writes are visible (the kernel before it completed, and that one had waited in turn).
// allow_dependents() lets the next such kernel launch before this one ends. Launched plainly (or
// with MLA_PDL=0 in the environment), both are no-ops.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "cuda/check.hpp"

namespace mla::cuda {

__device__ __forceinline__ void wait_for_prior_grids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

inline bool pdl_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("MLA_PDL");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return enabled;
}

// cluster_y > 1: thread-block clusters of that many CTAs along y (grid.y a multiple of it).
template <class Params>
void launch_dependent(void (*kernel)(Params), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                      const Params& p, unsigned cluster_y = 1) {
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = 1, attrs[1].val.clusterDim.y = cluster_y, attrs[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = cluster_y > 1 ? 2 : 1;
  MLA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
}

}  // namespace mla::cuda
