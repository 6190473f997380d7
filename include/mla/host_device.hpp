#pragma once
// MLA_HD marks small inline functions that both the host compiler and nvcc's device side use
// (ownership math, the softmax merge): __host__ __device__ under nvcc, plain inline elsewhere, so
// public headers stay free of CUDA types and includes.
#ifndef MLA_HD
#if defined(__CUDACC__)
#define MLA_HD __host__ __device__ __forceinline__
#else
#define MLA_HD inline
#endif
#endif
