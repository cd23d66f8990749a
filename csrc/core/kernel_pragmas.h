// Included first by the SIMD kernel files (quant*, repack_gemm*, activation): their f32
// arithmetic must round exactly like their scalar twins and like gguf.quants (the tests compare
// bits), so the compiler may not fuse a multiply and an add into an FMA the twin does not use.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 flags the deliberately undefined upper halves in _mm512_cast* / reduce intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
