# Declarations of the native core (csrc/): dtypes, tensors, CPU features. The ops are reached
# through the op table (op_table.pxi); each raises ValueError (std::invalid_argument) naming the
# op and the shapes on bad arguments.
from libc.stdint cimport int32_t, int64_t
from libcpp cimport bool

cdef extern from "core/dtype.h" namespace "vllmx":
    cpdef enum class DType(int32_t):
        F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
        IQ4_NL, IQ4_XS, I8, I16, I32, I64, F64, BF16, F8_E4M3, F8_E4M3_B128, U8, U64
    cdef struct TypeTraits:
        const char* name
        int64_t block_size
        int64_t type_size
        bool quantized
        bool supported
    const TypeTraits& type_traits(DType t)

cdef extern from "core/tensor.h" namespace "vllmx":
    cdef struct Tensor:
        void* data
        DType dtype
        int ndim
        int64_t shape[4]
        int64_t stride[4]
        int32_t device  # 0: CPU, 1: CUDA (a device pointer)

cdef extern from "core/cpu_features.h" namespace "vllmx":
    cdef struct CpuFeatures:
        bool avx2
        bool avx512
        bool avx512_vnni
        bool avx512_bf16
        bool avx_vnni
    const CpuFeatures& cpu_features()
    void c_set_num_threads "vllmx::set_num_threads"(int)
    int c_get_num_threads "vllmx::get_num_threads"()
