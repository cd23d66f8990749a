# The sm_90a kernels, included by CMakeLists.txt once CUDA is on: the GEMM (cuda/gemm_sm90.cu,
# gemm_swap_sm90.cu, CUTLASS 3) and prefill attention on wgmma (cuda/attention_prefill_sm90.cu,
# attention_prefill_ws_sm90.cu; CuTe's wgmma wrappers).
#
# Built only when CMAKE_CUDA_ARCHITECTURES holds 90a (the default list does), and then for
# sm_90a alone: its wgmma/TMA kernels exist on no other target, and each CUTLASS instantiation
# is slow to compile, so the 80 and 90-virtual passes never see the file. CUTLASS is headers
# only and a build-time dependency: the nvidia-cutlass wheel (a build requirement in
# pyproject.toml) carries them under cutlass_library/source/include, found here by asking the
# Python interpreter; -DVLLMX_CUTLASS_DIR=<dir> points at any other copy (a CUTLASS checkout or
# its include/ folder).

set(VLLMX_CUTLASS_DIR "" CACHE PATH
    "CUTLASS headers (a dir holding cutlass/ and cute/, or a checkout); empty: the nvidia-cutlass wheel's")

set(_vllmx_sm90 OFF)
foreach(_arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
  if(_arch MATCHES "^90a")
    set(_vllmx_sm90 ON)
  endif()
endforeach()
if(NOT _vllmx_sm90)
  message(STATUS "vllmx: no 90a in CMAKE_CUDA_ARCHITECTURES: no CUTLASS sm_90a GEMM "
                 "(linear on Hopper uses the mma.sync kernels)")
  return()
endif()

if(VLLMX_CUTLASS_DIR)
  set(_cutlass_from "-DVLLMX_CUTLASS_DIR")
  set(_cutlass_include "${VLLMX_CUTLASS_DIR}")
  if(EXISTS "${VLLMX_CUTLASS_DIR}/include/cutlass/cutlass.h")
    set(_cutlass_include "${VLLMX_CUTLASS_DIR}/include")
  endif()
else()
  # find_spec locates the package without importing it (its __init__ pulls in cuda-python).
  set(_cutlass_from "the nvidia-cutlass wheel of ${Python_EXECUTABLE}")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source', 'include') if s else '')"
    OUTPUT_VARIABLE _cutlass_include
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(NOT _cutlass_include OR NOT EXISTS "${_cutlass_include}/cutlass/cutlass.h"
   OR NOT EXISTS "${_cutlass_include}/cute/tensor.hpp")
  message(FATAL_ERROR
    "vllmx: the CUDA build needs CUTLASS headers for its sm_90a GEMM and found none "
    "(looked in '${_cutlass_include}', from ${_cutlass_from}). Either\n"
    "  pip install nvidia-cutlass==4.2.0.0   (with ${Python_EXECUTABLE}), or\n"
    "  -DVLLMX_CUTLASS_DIR=<CUTLASS include dir>, or\n"
    "  build without sm_90a: -DCMAKE_CUDA_ARCHITECTURES=\"80-real;90-real\", or without CUDA: "
    "VLLMX_CUDA=OFF.")
endif()
message(STATUS "vllmx: CUTLASS sm_90a GEMM with headers from ${_cutlass_include}")

add_library(vllmx_cuda_sm90 OBJECT cuda/gemm_sm90.cu cuda/gemm_swap_sm90.cu
                                   cuda/gemm_prefill_sm90.cu cuda/gemm_decode_sm90.cu
                                   cuda/gemm_swap_narrow_sm90.cu cuda/gemm_grouped_sm90.cu
                                   cuda/gemm_fp8_sm90.cu cuda/gemm_grouped_fp8_sm90.cu
                                   cuda/attention_prefill_sm90.cu
                                   cuda/attention_prefill_ws_sm90.cu cuda/gemm_skinny_bulk_sm90.cu
                                   cuda/tma_sm90.cu)
set_target_properties(vllmx_cuda_sm90 PROPERTIES CUDA_ARCHITECTURES 90a-real
                                                 POSITION_INDEPENDENT_CODE ON
                                                 CUDA_RUNTIME_LIBRARY Static)
target_include_directories(vllmx_cuda_sm90 PRIVATE csrc cuda)
target_include_directories(vllmx_cuda_sm90 SYSTEM PRIVATE "${_cutlass_include}")
# NDEBUG in every build type: an assert's call in device code makes ptxas serialize the wgmma
# pipeline (warning C7510), which would leave a Debug build's GEMM several times slower.
target_compile_definitions(vllmx_cuda_sm90 PRIVATE VLLMX_WITH_CUDA NDEBUG)
target_compile_options(vllmx_cuda_sm90 PRIVATE -O3 -lineinfo --expt-relaxed-constexpr
                                               -Xcompiler=-fno-math-errno)
target_compile_definitions(vllmx_cuda PRIVATE VLLMX_WITH_SM90_GEMM VLLMX_WITH_SM90_ATTENTION)
target_link_libraries(_C PRIVATE vllmx_cuda_sm90)
