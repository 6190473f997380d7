# The CUDA backend: sm_90a only (wgmma, setmaxnreg need the arch-specific target). The -gencode
# form is used because `-arch=sm_90a` also runs a plain sm_90 pass that rejects those instructions.
# CMake 3.25 predates nvcc 13 and does not know it takes C++20: tell it.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA_STANDARD 20)
file(GLOB_RECURSE MLA_CUDA_SOURCES CONFIGURE_DEPENDS src/cuda/*.cu src/cuda/*.cpp)
target_sources(mla PRIVATE ${MLA_CUDA_SOURCES})
set_target_properties(mla PROPERTIES CUDA_ARCHITECTURES OFF CUDA_SEPARABLE_COMPILATION OFF)
target_compile_options(mla PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:
  -gencode=arch=compute_90a,code=sm_90a -lineinfo --expt-relaxed-constexpr
  -Xptxas=-v,--warn-on-spills,--warn-on-local-memory-usage -Xcompiler=-Wall>)
find_library(MLA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
target_link_libraries(mla PUBLIC CUDA::cudart PRIVATE CUDA::cublasLt CUDA::cublas)
if(MLA_NCCL_LIBRARY)
  target_link_libraries(mla PRIVATE ${MLA_NCCL_LIBRARY})
  target_compile_definitions(mla PRIVATE MLA_WITH_NCCL=1)
endif()

# mla_graph_bench (bench/graph_step.cpp): step and attend timed as CUDA-graph replays.
add_executable(mla_graph_bench ${PROJECT_SOURCE_DIR}/bench/graph_step.cpp)
target_include_directories(mla_graph_bench PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(mla_graph_bench PRIVATE mla)
target_compile_options(mla_graph_bench PRIVATE ${MLA_WARNINGS})
set_target_properties(mla_graph_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
