# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""Thin bindings over the native core. Arguments are numpy arrays; bf16 tensors travel as
uint16 arrays and quantized tensors as uint8 arrays of whole blocks, with their dtype id
(GGML's numbering) given explicitly. The GIL is released around every native call."""
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t

import numpy as np

cnp.import_array()

_NP_DTYPES = {
    np.dtype(np.float32): DType.F32,
    np.dtype(np.float16): DType.F16,
    np.dtype(np.int32): DType.I32,
    np.dtype(np.int64): DType.I64,
    np.dtype(np.uint8): DType.U8,
    np.dtype(np.uint64): DType.U64,
}


cdef Tensor as_tensor(object a, int dtype=-1) except *:
    """A view of a C-contiguous numpy array; `dtype` overrides the numpy dtype (bf16, blocks).
    A quantized tensor is a uint8 array [rows, row_bytes]; its shape is reported in elements."""
    cdef Tensor t
    cdef cnp.ndarray arr
    cdef int i
    cdef int64_t bs, ts
    if a is None:
        t.data = NULL
        t.ndim = 0
        return t
    if isinstance(a, DeviceArrayBase):
        raise TypeError("a GPU DeviceArray was passed to a CPU op (use vllmx.ops.cuda_*)")
    arr = <cnp.ndarray?>a
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"expected a C-contiguous array, got strides {a.strides}")
    if arr.ndim > 4:
        raise ValueError(f"at most 4 dims, got shape {a.shape}")
    if dtype < 0:
        try:
            t.dtype = _NP_DTYPES[arr.dtype]
        except KeyError:
            raise ValueError(f"unsupported numpy dtype {arr.dtype}") from None
    else:
        t.dtype = <DType>dtype
    t.data = cnp.PyArray_DATA(arr)
    t.ndim = arr.ndim
    for i in range(arr.ndim):
        t.shape[i] = arr.shape[i]
    bs = type_traits(t.dtype).block_size
    ts = type_traits(t.dtype).type_size
    if type_traits(t.dtype).quantized:
        if arr.dtype != np.uint8:
            raise ValueError(f"{type_traits(t.dtype).name.decode()} data must be uint8 blocks")
        if arr.shape[arr.ndim - 1] % ts != 0:
            raise ValueError(
                f"{type_traits(t.dtype).name.decode()}: row of {arr.shape[arr.ndim - 1]} bytes "
                f"is not a whole number of {ts}-byte blocks")
        t.shape[arr.ndim - 1] = arr.shape[arr.ndim - 1] // ts * bs
    elif dtype >= 0 and arr.itemsize != ts:
        raise ValueError(f"{type_traits(t.dtype).name.decode()} needs {ts}-byte items, "
                         f"got {arr.dtype}")
    # Row-major strides in elements (bytes per row for block types, in stride[0..ndim-2]).
    if arr.ndim > 0:
        t.stride[arr.ndim - 1] = 1
        for i in range(arr.ndim - 2, -1, -1):
            t.stride[i] = arr.strides[i] if type_traits(t.dtype).quantized else arr.strides[i] // arr.itemsize
    return t


include "step_tape.pxi"


def type_info(int dtype):
    """(name, block_size, type_size, quantized, supported) of a dtype id."""
    cdef TypeTraits tt = type_traits(<DType>dtype)
    return tt.name.decode(), tt.block_size, tt.type_size, tt.quantized, tt.supported


def cpu_info():
    cdef CpuFeatures f = cpu_features()
    return {"avx2": f.avx2, "avx512": f.avx512, "avx512_vnni": f.avx512_vnni,
            "avx512_bf16": f.avx512_bf16, "avx_vnni": f.avx_vnni}


def set_num_threads(int n):
    """Threads for the native ops (n <= 0: all cores)."""
    c_set_num_threads(n)


def get_num_threads():
    return c_get_num_threads()


def op_embedding(out, ids, table, int table_dtype=-1, bint reference=False):
    cdef Tensor o = as_tensor(out), i = as_tensor(ids), w = as_tensor(table, table_dtype)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("embedding", (ids, table), (out,))
        tape.c.embedding(o, i, w, reference)
    with nogil:
        embedding(o, i, w, reference)


def op_dequantize(out, src, int src_dtype, bint reference=False):
    _not_recordable("dequantize")
    cdef Tensor o = as_tensor(out), s = as_tensor(src, src_dtype)
    with nogil:
        dequantize(o, s, reference)


def op_quantize(out, int out_dtype, src, bint reference=False):
    _not_recordable("quantize")
    cdef Tensor o = as_tensor(out, out_dtype), s = as_tensor(src)
    with nogil:
        quantize(o, s, reference)


def op_linear(out, x, w, int w_dtype=-1, bias=None, bint reference=False):
    cdef Tensor o = as_tensor(out), xt = as_tensor(x), wt = as_tensor(w, w_dtype)
    cdef Tensor b = as_tensor(bias)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("linear", (x, w, bias), (out,))
        tape.c.linear(o, xt, wt, b, reference)
    with nogil:
        linear(o, xt, wt, b, reference)


def op_rms_norm(out, x, w, float eps, bint reference=False):
    cdef Tensor o = as_tensor(out), xt = as_tensor(x), wt = as_tensor(w)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("rms_norm", (x, w), (out,))
        tape.c.rms_norm(o, xt, wt, eps, reference)
    with nogil:
        rms_norm(o, xt, wt, eps, reference)


def op_fused_add_rms_norm(x, residual, w, float eps, bint reference=False):
    cdef Tensor xt = as_tensor(x), r = as_tensor(residual), wt = as_tensor(w)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("fused_add_rms_norm", (x, residual, w), (x, residual))
        tape.c.fused_add_rms_norm(xt, r, wt, eps, reference)
    with nogil:
        fused_add_rms_norm(xt, r, wt, eps, reference)


def op_rotary(positions, q, k, cos_sin_cache, int64_t head_size, bint is_neox,
              bint reference=False):
    cdef Tensor p = as_tensor(positions), qt = as_tensor(q), kt = as_tensor(k)
    cdef Tensor c = as_tensor(cos_sin_cache)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("rotary", (positions, q, k, cos_sin_cache), (q, k))
        tape.c.rotary(p, qt, kt, c, head_size, is_neox, reference)
    with nogil:
        rotary(p, qt, kt, c, head_size, is_neox, reference)


def op_silu_and_mul(out, x, bint reference=False):
    cdef Tensor o = as_tensor(out), xt = as_tensor(x)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("silu_and_mul", (x,), (out,))
        tape.c.silu_and_mul(o, xt, reference)
    with nogil:
        silu_and_mul(o, xt, reference)


def op_write_kv_cache(key, value, key_cache, value_cache, slot_mapping, int cache_dtype=-1,
                      bint reference=False):
    cdef Tensor k = as_tensor(key), v = as_tensor(value)
    cdef Tensor kc = as_tensor(key_cache, cache_dtype), vc = as_tensor(value_cache, cache_dtype)
    cdef Tensor s = as_tensor(slot_mapping)
    cdef StepTape tape = _tape()
    if tape is not None:
        # The caches count as read too: a step writes a few slots and attention reads the rest.
        tape.note("write_kv_cache", (key, value, key_cache, value_cache, slot_mapping),
                  (key_cache, value_cache))
        tape.c.write_kv_cache(k, v, kc, vc, s, reference)
    with nogil:
        write_kv_cache(k, v, kc, vc, s, reference)


def op_paged_attention(out, q, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                       float scale, int64_t sliding_window=0, float logits_soft_cap=0.0,
                       int cache_dtype=-1, bint reference=False):
    cdef Tensor o = as_tensor(out), qt = as_tensor(q)
    cdef Tensor kc = as_tensor(key_cache, cache_dtype), vc = as_tensor(value_cache, cache_dtype)
    cdef Tensor bt = as_tensor(block_table), qsl = as_tensor(query_start_loc)
    cdef Tensor sl = as_tensor(seq_lens)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("paged_attention", (q, key_cache, value_cache, block_table, query_start_loc,
                                      seq_lens), (out,))
        tape.c.paged_attention(o, qt, kc, vc, bt, qsl, sl, scale, sliding_window,
                               logits_soft_cap, reference)
    with nogil:
        paged_attention(o, qt, kc, vc, bt, qsl, sl, scale, sliding_window, logits_soft_cap,
                        reference)


def op_sample(out_ids, out_logprobs, logits, temperature, top_k, top_p, min_p, rng_state,
              bint reference=False):
    _not_recordable("sample")
    cdef Tensor o = as_tensor(out_ids), lp = as_tensor(out_logprobs), l = as_tensor(logits)
    cdef Tensor t = as_tensor(temperature), tk = as_tensor(top_k), tp = as_tensor(top_p)
    cdef Tensor mp = as_tensor(min_p), r = as_tensor(rng_state)
    with nogil:
        sample(o, lp, l, t, tk, tp, mp, r, reference)


def op_apply_logits_processors(logits, allowed_indptr=None, allowed_ids=None,
                               bad_words_indptr=None, bad_word_token_indptr=None,
                               bad_word_tokens=None, output_tail_indptr=None, output_tail=None,
                               bias_indptr=None, bias_ids=None, bias_values=None,
                               penalty_indptr=None, penalty_ids=None, output_counts=None,
                               repetition_penalty=None, frequency_penalty=None,
                               presence_penalty=None, bint reference=False):
    """In place over logits (f32 [B, V]); each group (CSR lists) is optional. See csrc/ops.h."""
    _not_recordable("apply_logits_processors")
    cdef Tensor l = as_tensor(logits)
    cdef LogitsProcessorArgs a
    a.allowed_indptr = as_tensor(allowed_indptr)
    a.allowed_ids = as_tensor(allowed_ids)
    a.bad_words_indptr = as_tensor(bad_words_indptr)
    a.bad_word_token_indptr = as_tensor(bad_word_token_indptr)
    a.bad_word_tokens = as_tensor(bad_word_tokens)
    a.output_tail_indptr = as_tensor(output_tail_indptr)
    a.output_tail = as_tensor(output_tail)
    a.bias_indptr = as_tensor(bias_indptr)
    a.bias_ids = as_tensor(bias_ids)
    a.bias_values = as_tensor(bias_values)
    a.penalty_indptr = as_tensor(penalty_indptr)
    a.penalty_ids = as_tensor(penalty_ids)
    a.output_counts = as_tensor(output_counts)
    a.repetition_penalty = as_tensor(repetition_penalty)
    a.frequency_penalty = as_tensor(frequency_penalty)
    a.presence_penalty = as_tensor(presence_penalty)
    with nogil:
        apply_logits_processors(l, a, reference)


def op_compute_logprobs(out_token_logprob, out_rank, out_top_ids, out_top_logprobs, logits,
                        token_ids, num_logprobs, bint reference=False):
    _not_recordable("compute_logprobs")
    cdef Tensor olp = as_tensor(out_token_logprob), orank = as_tensor(out_rank)
    cdef Tensor oti = as_tensor(out_top_ids), otl = as_tensor(out_top_logprobs)
    cdef Tensor l = as_tensor(logits), t = as_tensor(token_ids), k = as_tensor(num_logprobs)
    with nogil:
        compute_logprobs(olp, orank, oti, otl, l, t, k, reference)


include "block_pool.pxi"
include "repack.pxi"


def op_gelu_and_mul(out, x, bint approximate_tanh, bint reference=False):
    cdef Tensor o = as_tensor(out), xt = as_tensor(x)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("gelu_and_mul", (x,), (out,))
        tape.c.gelu_and_mul(o, xt, approximate_tanh, reference)
    with nogil:
        gelu_and_mul(o, xt, approximate_tanh, reference)


def op_quantize_weight(out, int out_dtype, src):
    """f32 weights [rows, n] -> out (uint8 blocks [rows, row_bytes], float16 / uint16 for
    F16 / BF16) with llama.cpp's reference quantizers (csrc/quantize_k.cpp)."""
    _not_recordable("quantize_weight")
    cdef Tensor o = as_tensor(out, out_dtype), s = as_tensor(src)
    with nogil:
        quantize_weight(o, s)


def op_copy_columns(out, int64_t out_col, x, int64_t x_col, int64_t n):
    """out[:, out_col:out_col + n] = x[:, x_col:x_col + n] (2-D, one dense dtype)."""
    cdef Tensor o = as_tensor(out), xt = as_tensor(x)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("copy_columns", (x,), (out,))
        tape.c.copy_columns(o, out_col, xt, x_col, n)
    with nogil:
        copy_columns(o, out_col, xt, x_col, n)


def op_scale(out, x, float s):
    """out = x * s (f32; out may be x)."""
    cdef Tensor o = as_tensor(out), xt = as_tensor(x)
    cdef StepTape tape = _tape()
    if tape is not None:
        tape.note("scale", (x,), (out,))
        tape.c.scale(o, xt, s)
    with nogil:
        scale(o, xt, s)


include "cuda.pxi"
