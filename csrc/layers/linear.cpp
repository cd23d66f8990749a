// linear: out[T, N] = x[T, K] @ w[N, K]^T (+ bias[N]).
//
// Dense weights (f32/f16/bf16) are upcast exactly to f32 and multiplied with f32 FMAs. Block
// weights pair with an 8-bit activation type: x rows are quantized once into a thread-local
// scratch, then each output is an integer-dot vec_dot (quant_dot.cpp). Packed block weights
// (repack.h, made once at load time) go through panel kernels that compute 16 outputs at once
// (repack_gemm.cpp); their rows past the last whole panel take the vec_dot path.
//
// Batch invariance: every out[t, n] is produced by one call of one kernel whose arithmetic
// depends only on x[t, :], w[n, :] and K (never on T, on t, on the tile it falls in or on the
// thread), so a row's result is bit-identical whatever batch it is computed in.
// Work is tiled (a tile of weight rows is reused across a block of activation rows while it is
// hot in cache) and spread over OpenMP threads along both N and T.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 flags the deliberately undefined upper halves in _mm512_cast* / reduce intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/half.h"
#include <omp.h>

#include "core/op_table.h"
#include "layers/cpu_kernels.h"
#include "quant/quant.h"
#include "repack/repack.h"

#if VLLMX_X86
#include <immintrin.h>
#endif

namespace vllmx {

namespace {

// ------------------------------------------------------------------ dense kernels
// DenseFn computes NR consecutive outputs for mr (1..kMaxMR) activation rows xs floats apart:
// out[m * kMaxNR + r] = dot(x + m * xs, w + r * wstride) over K elements.
using DenseFn = void (*)(const float* x, int64_t xs, int mr, const void* w, int64_t wstride,
                         int64_t K, float* out);
constexpr int kMaxNR = 4;
constexpr int kMaxMR = 3;

enum WKind { kF32 = 0, kF16 = 1, kBF16 = 2 };

template <int WT>
inline float load_w_scalar(const void* w, int64_t i) {
  if constexpr (WT == kF32) return static_cast<const float*>(w)[i];
  if constexpr (WT == kF16) return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
}

template <int WT>
inline const void* row_ptr(const void* w, int64_t r, int64_t stride) {
  if constexpr (WT == kF32) return static_cast<const float*>(w) + r * stride;
  return static_cast<const uint16_t*>(w) + r * stride;
}

// Scalar: the reference, and the fast path where there is no SIMD.
template <int WT, int NR>
void dense_scalar(const float* x, int64_t xs, int mr, const void* w, int64_t ws, int64_t K,
                  float* out) {
  for (int m = 0; m < mr; ++m)
    for (int r = 0; r < NR; ++r) {
      const void* wr = row_ptr<WT>(w, r, ws);
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * xs + k] * load_w_scalar<WT>(wr, k);
      out[m * kMaxNR + r] = acc;
    }
}

#if VLLMX_X86
template <int WT>
VLLMX_TARGET_AVX512 inline __m512 load_w512(const void* w, int64_t k) {
  if constexpr (WT == kF32) return _mm512_loadu_ps(static_cast<const float*>(w) + k);
  const __m256i h = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + k));
  if constexpr (WT == kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <int WT>
VLLMX_TARGET_AVX512 inline __m512 load_w512_mask(const void* w, int64_t k, __mmask16 m) {
  if constexpr (WT == kF32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + k);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(w) + k);
  if constexpr (WT == kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Per output: two 16-lane accumulators over alternate 16-element chunks (a 16-chunk left over
// into the first, a masked tail into the second), then one fixed reduction. The sequence is the
// same for every r, m, NR and MR; MR activation rows share each weight load (GEMM register
// blocking), NR weight rows each activation load.
template <int WT, int MR, int NR>
VLLMX_TARGET_AVX512 void dense_512(const float* x, int64_t xs, const void* w, int64_t ws,
                                   int64_t K, float* out) {
  const void* wr[NR];
  for (int r = 0; r < NR; ++r) wr[r] = row_ptr<WT>(w, r, ws);
  __m512 a0[MR][NR], a1[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) a0[m][r] = a1[m][r] = _mm512_setzero_ps();
  // acc[m][r] += x[m][k..k+16) * w[r][k..k+16)
  auto step = [&](__m512(&acc)[MR][NR], int64_t k) VLLMX_TARGET_AVX512 {
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load_w512<WT>(wr[r], k);
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * xs + k);
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  };
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    step(a0, k);
    step(a1, k + 16);
  }
  if (k + 16 <= K) {
    step(a0, k);
    k += 16;
  }
  if (k < K) {
    const __mmask16 mk = static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load_w512_mask<WT>(wr[r], k, mk);
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mk, x + m * xs + k);
      for (int r = 0; r < NR; ++r) a1[m][r] = _mm512_fmadd_ps(xv, wv[r], a1[m][r]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r)
      out[m * kMaxNR + r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[m][r], a1[m][r]));
}

template <int WT, int NR>
void dense_512_rows(const float* x, int64_t xs, int mr, const void* w, int64_t ws, int64_t K,
                    float* out) {
  static_assert(kMaxMR == 3, "dense_512_rows handles up to 3 rows");
  switch (mr) {
    case 1: dense_512<WT, 1, NR>(x, xs, w, ws, K, out); break;
    case 2: dense_512<WT, 2, NR>(x, xs, w, ws, K, out); break;
    default: dense_512<WT, 3, NR>(x, xs, w, ws, K, out); break;
  }
}

template <int WT>
VLLMX_TARGET_AVX2 inline __m256 load_w256(const void* w, int64_t k) {
  if constexpr (WT == kF32) return _mm256_loadu_ps(static_cast<const float*>(w) + k);
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + k));
  if constexpr (WT == kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

VLLMX_TARGET_AVX2 inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// MR activation rows x NR weight rows: each weight vector loaded once for the MR rows, one
// accumulator per pair (12 + 3 x + 1 w registers at 3 x 4). A row's sums are the same whatever
// MR its call has: lanes over k in steps of 8, the scalar tail, then a fixed-tree horizontal sum.
template <int WT, int MR, int NR>
VLLMX_TARGET_AVX2 void dense_avx2_rows(const float* x, int64_t xs, const void* w, int64_t ws,
                                       int64_t K, float* out) {
  const void* wr[NR];
  for (int r = 0; r < NR; ++r) wr[r] = row_ptr<WT>(w, r, ws);
  __m256 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = _mm256_loadu_ps(x + m * xs + k);
    for (int r = 0; r < NR; ++r) {
      const __m256 wv = load_w256<WT>(wr[r], k);
      for (int m = 0; m < MR; ++m) acc[m][r] = _mm256_fmadd_ps(xv[m], wv, acc[m][r]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) {
      float tail = 0.0f;
      for (int64_t j = k; j < K; ++j)
        tail = std::fma(x[m * xs + j], load_w_scalar<WT>(wr[r], j), tail);
      out[m * kMaxNR + r] = hsum256(acc[m][r]) + tail;
    }
}

template <int WT, int NR>
void dense_avx2(const float* x, int64_t xs, int mr, const void* w, int64_t ws, int64_t K,
                float* out) {
  static_assert(kMaxMR == 3, "dense_avx2 handles up to 3 rows");
  switch (mr) {
    case 1: dense_avx2_rows<WT, 1, NR>(x, xs, w, ws, K, out); break;
    case 2: dense_avx2_rows<WT, 2, NR>(x, xs, w, ws, K, out); break;
    default: dense_avx2_rows<WT, 3, NR>(x, xs, w, ws, K, out); break;
  }
}
#endif

struct DenseTable {
  DenseFn fn[3][kMaxNR + 1] = {};
};

template <int WT>
void fill_scalar(DenseTable& t) {
  t.fn[WT][1] = dense_scalar<WT, 1>;
  t.fn[WT][2] = dense_scalar<WT, 2>;
  t.fn[WT][3] = dense_scalar<WT, 3>;
  t.fn[WT][4] = dense_scalar<WT, 4>;
}

const DenseTable& dense_fast() {
  static const DenseTable t = [] {
    DenseTable d;
    fill_scalar<kF32>(d);
    fill_scalar<kF16>(d);
    fill_scalar<kBF16>(d);
#if VLLMX_X86
    if (simd_level() >= 2) {
#define SET(WT) d.fn[WT][1] = dense_512_rows<WT, 1>; d.fn[WT][2] = dense_512_rows<WT, 2>; \
                d.fn[WT][3] = dense_512_rows<WT, 3>; d.fn[WT][4] = dense_512_rows<WT, 4>;
      SET(kF32) SET(kF16) SET(kBF16)
#undef SET
    } else if (simd_level() >= 1) {
#define SET(WT) d.fn[WT][1] = dense_avx2<WT, 1>; d.fn[WT][2] = dense_avx2<WT, 2>; \
                d.fn[WT][3] = dense_avx2<WT, 3>; d.fn[WT][4] = dense_avx2<WT, 4>;
      SET(kF32) SET(kF16) SET(kBF16)
#undef SET
    }
#endif
    return d;
  }();
  return t;
}

const DenseTable& dense_ref() {
  static const DenseTable t = [] {
    DenseTable d;
    fill_scalar<kF32>(d);
    fill_scalar<kF16>(d);
    fill_scalar<kBF16>(d);
    return d;
  }();
  return t;
}

// ------------------------------------------------------------------ dense panels (*_X16)
// One or two 16-row panels of a dense weight (F32_X16, F16_X16, BF16_X16; repack.h) against mr
// (1..kPanelMR) activation rows: out[m * os + i] = sum over k of x[m][k] * panel[k][i], the
// weight upcast exactly to f32, even k into one FMA chain and odd k into another, added at the
// end, then the bias. The chains are the same for any mr or pairing of panels, so a row's bits
// do not depend on the batch; the scalar twin computes the same chains.
constexpr int kPanelMR = 6;
constexpr int64_t kPanelPrefetch = 4096;
using PanelFn = void (*)(const float* x, int64_t xs, int mr, const void* p0, const void* p1,
                         int64_t K, float* out, int64_t os, const float* bias);

template <int WT, int NP>
void dense_panels_scalar(const float* x, int64_t xs, int mr, const void* p0, const void* p1,
                         int64_t K, float* out, int64_t os, const float* bias) {
  for (int m = 0; m < mr; ++m)
    for (int i = 0; i < 16 * NP; ++i) {
      const void* p = i < 16 ? p0 : p1;
      float even = 0.0f, odd = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        float& acc = k % 2 ? odd : even;
        acc = std::fma(x[m * xs + k], load_w_scalar<WT>(p, k * kPackRows + i % 16), acc);
      }
      const float v = even + odd;
      out[m * os + i] = bias ? v + bias[i] : v;
    }
}

#if VLLMX_X86
// The 16 rows' k-th elements of a panel as f32.
template <int WT>
VLLMX_TARGET_AVX512 __m512 panel_load(const void* p, int64_t k) {
  if constexpr (WT == kF32) return _mm512_loadu_ps(static_cast<const float*>(p) + k * kPackRows);
  const __m256i h = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + k * kPackRows));
  if constexpr (WT == kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int WT, int MR, int NP, bool STREAM>
VLLMX_TARGET_AVX512 void dense_panels_512_rows(const float* x, int64_t xs, const void* p0,
                                               const void* p1, int64_t K, float* out,
                                               int64_t os, const float* bias) {
  const void* pp[2] = {p0, p1};
  __m512 even[MR][NP], odd[MR][NP];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NP; ++j) even[m][j] = odd[m][j] = _mm512_setzero_ps();
  // STREAM (a step of at most kPanelMR rows reads each panel once): fetch kPanelPrefetch bytes
  // ahead of the two k each iteration consumes (a line of f16 / bf16, two of f32, per panel).
  // Prefill reads a panel once per kPanelMR rows, from cache after the first: there the
  // prefetches cost ~15% (MiniLM's f32 embedding batches).
  constexpr int64_t kStep = 2 * kPackRows * (WT == kF32 ? 4 : 2);
  int64_t k = 0;
  for (; k + 2 <= K; k += 2) {
    if constexpr (STREAM)
      for (int j = 0; j < NP; ++j)
        for (int64_t l = 0; l < kStep; l += 64)
          _mm_prefetch(static_cast<const char*>(pp[j]) + k / 2 * kStep + kPanelPrefetch + l,
                       _MM_HINT_T0);
    __m512 we[NP], wo[NP];
    for (int j = 0; j < NP; ++j) {
      we[j] = panel_load<WT>(pp[j], k);
      wo[j] = panel_load<WT>(pp[j], k + 1);
    }
    for (int m = 0; m < MR; ++m) {
      const __m512 xe = _mm512_set1_ps(x[m * xs + k]), xo = _mm512_set1_ps(x[m * xs + k + 1]);
      for (int j = 0; j < NP; ++j) {
        even[m][j] = _mm512_fmadd_ps(xe, we[j], even[m][j]);
        odd[m][j] = _mm512_fmadd_ps(xo, wo[j], odd[m][j]);
      }
    }
  }
  if (k < K)
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NP; ++j)
        even[m][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * xs + k]), panel_load<WT>(pp[j], k),
                                     even[m][j]);
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NP; ++j) {
      __m512 v = _mm512_add_ps(even[m][j], odd[m][j]);
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + 16 * j));
      _mm512_storeu_ps(out + m * os + 16 * j, v);
    }
}

template <int WT, int NP, bool STREAM>
void dense_panels_512(const float* x, int64_t xs, int mr, const void* p0, const void* p1,
                      int64_t K, float* out, int64_t os, const float* bias) {
  static_assert(kPanelMR == 6, "dense_panels_512 handles up to 6 rows");
  switch (mr) {
    case 1: return dense_panels_512_rows<WT, 1, NP, STREAM>(x, xs, p0, p1, K, out, os, bias);
    case 2: return dense_panels_512_rows<WT, 2, NP, STREAM>(x, xs, p0, p1, K, out, os, bias);
    case 3: return dense_panels_512_rows<WT, 3, NP, STREAM>(x, xs, p0, p1, K, out, os, bias);
    case 4: return dense_panels_512_rows<WT, 4, NP, STREAM>(x, xs, p0, p1, K, out, os, bias);
    case 5: return dense_panels_512_rows<WT, 5, NP, STREAM>(x, xs, p0, p1, K, out, os, bias);
    default: return dense_panels_512_rows<WT, 6, NP, STREAM>(x, xs, p0, p1, K, out, os, bias);
  }
}
#endif

// The panel kernels of weight kind WT by panel count (1, 2): the SIMD ones (streaming the panels
// for a call of at most kPanelMR rows, or not), or the scalar twins.
template <int WT>
const PanelFn* panel_fns(bool reference, bool stream) {
  static const PanelFn ref[2] = {dense_panels_scalar<WT, 1>, dense_panels_scalar<WT, 2>};
#if VLLMX_X86
  static const PanelFn fast[2] = {dense_panels_512<WT, 1, false>, dense_panels_512<WT, 2, false>};
  static const PanelFn fast_stream[2] = {dense_panels_512<WT, 1, true>,
                                         dense_panels_512<WT, 2, true>};
  if (!reference && dense_panel_is_fast()) return stream ? fast_stream : fast;
#endif
  return ref;
}

// ------------------------------------------------------------------ tiling

// Grows, never shrinks: no per-call allocation once warm. Two slots (block and packed
// activations); 64-byte aligned.
uint8_t* scratch(int slot, size_t bytes) {
  static thread_local std::vector<uint8_t> buf[2];
  if (buf[slot].size() < bytes + 64) buf[slot].resize(bytes + bytes / 4 + 64);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf[slot].data());
  return buf[slot].data() + ((64 - p % 64) % 64);
}

constexpr int64_t kTileT = 32;                  // activation rows per tile
constexpr int64_t kTileWBytes = 128 * 1024;     // weight bytes per tile (stays in L2)

// Runs body(t0, t1, n0, n1) over tiles of [0, T) x [0, N), in parallel. pass_rows: how many
// activation rows body's kernel takes in one pass over a weight row.
template <class Body>
void for_tiles(int64_t T, int64_t N, int64_t w_row_bytes, int64_t granule, int64_t pass_rows,
               bool parallel, const Body& body) {
  int64_t tn = std::max<int64_t>(granule, kTileWBytes / std::max<int64_t>(w_row_bytes, 1));
  tn = (tn + granule - 1) / granule * granule;
  const int64_t tt = T == 1 ? 1 : kTileT;
  const int64_t n_tiles_t = (T + tt - 1) / tt;
  // Cheap calls stay on the calling thread; others get at least one tile per thread (decode
  // GEMVs are often smaller than one L2 tile, and must still use every core).
  const bool big = parallel && T * N * w_row_bytes > (1 << 16);
  const int64_t threads = big ? omp_get_max_threads() : 1;
  if (big && T <= pass_rows) {
    // Decode (and a verify step's few rows): a weight row is read once, so cache tiles buy
    // nothing; split N evenly instead (L2-sized tiles left 5 tiles of a 1536-row GEMM to 2
    // threads, one idle for a fifth of it).
    const int64_t per_thread = (N + threads - 1) / threads;
    tn = std::max<int64_t>(granule, (per_thread + granule - 1) / granule * granule);
  } else if (big && (N + tn - 1) / tn * n_tiles_t < threads) {
    const int64_t want_n = (threads + n_tiles_t - 1) / n_tiles_t;
    tn = std::max<int64_t>(granule, ((N + want_n - 1) / want_n + granule - 1) / granule * granule);
  }
  if (big) {
    // Tiles of equal size (to a granule), in whole rounds for the threads: a short last column
    // of tiles, or a round that leaves a thread without a tile, idles the others' share (5
    // tiles of a 1536-row GEMM on 2 threads: one thread idle for a fifth of it).
    int64_t n_tiles = (N + tn - 1) / tn;
    const int64_t max_tiles = (N + granule - 1) / granule;
    while (n_tiles * n_tiles_t % threads != 0 && n_tiles < max_tiles) ++n_tiles;
    tn = std::max<int64_t>(granule, ((N + n_tiles - 1) / n_tiles + granule - 1) / granule * granule);
  }
  const int64_t n_tiles_n = (N + tn - 1) / tn;
  const int64_t total = n_tiles_n * n_tiles_t;
  const bool par = big && total > 1;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < total; ++i) {
    const int64_t bn = i / n_tiles_t, bt = i % n_tiles_t;
    const int64_t n0 = bn * tn, t0 = bt * tt;
    body(t0, std::min(T, t0 + tt), n0, std::min(N, n0 + tn));
  }
}

}  // namespace

void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
            bool reference) {
  const char* op = "linear";
  VLLMX_CHECK(out.defined() && x.defined() && w.defined(), op, "missing tensor");
  check_dtype(x, DType::F32, op, "x");
  check_ndim(x, 2, op, "x");
  check_dtype(out, DType::F32, op, "out");
  check_ndim(out, 2, op, "out");
  check_ndim(w, 2, op, "w");
  const DType wt = w.dtype;
  const bool dense = wt == DType::F32 || wt == DType::F16 || wt == DType::BF16;
  const bool panels = wt == DType::F32_X16 || wt == DType::F16_X16 || wt == DType::BF16_X16;
  const bool packed = is_packed(wt) && !panels;
  const QuantTraits* qt = dense || panels ? nullptr : quant_traits(packed ? packed_base(wt) : wt);
  if (!dense && !panels && (qt == nullptr || qt->vec_dot == nullptr))
    fail(op, std::string("unsupported weight dtype ") + dtype_name(wt) + " (id " +
                 std::to_string(static_cast<int>(wt)) + ")");
  const int64_t T = x.shape[0], K = x.shape[1], N = w.shape[0];
  if (w.shape[1] != K)
    fail(op, "x " + x.str() + " and w " + w.str() + " disagree on K");
  if (out.shape[0] != T || out.shape[1] != N)
    fail(op, "out " + out.str() + " must be [" + std::to_string(T) + ", " + std::to_string(N) +
                 "] for x " + x.str() + " and w " + w.str());
  const int64_t bs = type_traits(wt).block_size;
  if (K % bs != 0)
    fail(op, "K = " + std::to_string(K) + " of x " + x.str() + " is not a multiple of the " +
                 dtype_name(wt) + " block size " + std::to_string(bs));
  if (bias.defined()) {
    check_dtype(bias, DType::F32, op, "bias");
    if (bias.ndim != 1 || bias.shape[0] != N)
      fail(op, "bias " + bias.str() + " must be F32[" + std::to_string(N) + "] for w " + w.str());
  }
  if (T == 0 || N == 0) return;

  const float* xp = x.ptr<float>();
  const int64_t xs = x.stride[0];
  float* op_ = out.ptr<float>();
  const int64_t os = out.stride[0];
  const float* bp = bias.defined() ? bias.ptr<float>() : nullptr;

  if (K == 0) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) op_[t * os + n] = bp ? 0.0f + bp[n] : 0.0f;
    return;
  }

  if (dense || panels) {
    const DType base = panels ? packed_base(wt) : wt;
    const int wk = base == DType::F32 ? kF32 : base == DType::F16 ? kF16 : kBF16;
    const DenseTable& tab = reference ? dense_ref() : dense_fast();
    const int64_t ws = w.stride[0];  // elements
    const int64_t esz = type_traits(wt).type_size;
    const uint8_t* wp = static_cast<const uint8_t*>(w.data);
    auto rows_body = [&](int64_t t0, int64_t t1, int64_t n0, int64_t n1) {
      float tmp[kMaxMR * kMaxNR];
      for (int64_t t = t0; t < t1; t += kMaxMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMaxMR, t1 - t));
        for (int64_t n = n0; n < n1; n += kMaxNR) {
          const int nr = static_cast<int>(std::min<int64_t>(kMaxNR, n1 - n));
          tab.fn[wk][nr](xp + t * xs, xs, mr, wp + n * ws * esz, ws, K, tmp);
          for (int m = 0; m < mr; ++m) {
            float* orow = op_ + (t + m) * os;
            for (int r = 0; r < nr; ++r)
              orow[n + r] = bp ? tmp[m * kMaxNR + r] + bp[n + r] : tmp[m * kMaxNR + r];
          }
        }
      }
    };
    if (dense) {
      for_tiles(T, N, K * esz, kMaxNR, kMaxMR, !reference, rows_body);
      return;
    }
    // Panels: whole panels of 16 rows; the rows past the last one are plain rows (repack.h).
    const bool stream = T <= kPanelMR;
    const PanelFn* fns = wk == kF32   ? panel_fns<kF32>(reference, stream)
                         : wk == kF16 ? panel_fns<kF16>(reference, stream)
                                      : panel_fns<kBF16>(reference, stream);
    const int64_t panel_end = N / kPackRows * kPackRows;
    auto panel_body = [&](int64_t t0, int64_t t1, int64_t n0, int64_t n1) {
      for (int64_t t = t0; t < t1; t += kPanelMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kPanelMR, t1 - t));
        for (int64_t n = n0; n < std::min(n1, panel_end); n += 2 * kPackRows) {
          const bool two = n + kPackRows < std::min(n1, panel_end);
          fns[two](xp + t * xs, xs, mr, wp + n * ws * esz, wp + (n + kPackRows) * ws * esz, K,
                   op_ + t * os + n, os, bp ? bp + n : nullptr);
        }
      }
      if (n1 > panel_end) rows_body(t0, t1, std::max(n0, panel_end), n1);
    };
    for_tiles(T, N, K * esz, kPackRows, kPanelMR, !reference, panel_body);
    return;
  }

  // Block weights: quantize the activation rows, then integer dots.
  const DType xt = qt->vec_dot_type;
  const QuantTraits* xq = quant_traits(xt);
  const int64_t xrow = row_bytes(xt, K);
  uint8_t* xqp = scratch(0, static_cast<size_t>(T * xrow));
  // Packed weights read the activations in their own layout too (repack.h).
  const int64_t pxrow = packed ? packed_x_row_bytes(packed_base(wt), K) : 0;
  uint8_t* pxp = packed ? scratch(1, static_cast<size_t>(T * pxrow)) : nullptr;
  FromFloatFn quant = reference ? xq->from_float_ref : xq->from_float;
  VecDotFn dot = reference ? qt->vec_dot_ref : qt->vec_dot;
  auto quant_row = [&](int64_t t) {
    quant(xp + t * xs, xqp + t * xrow, K);
    if (packed) prepare_packed_x(packed_base(wt), xqp + t * xrow, K, pxp + t * pxrow);
  };
  if (reference || T * K < (1 << 15)) {
    for (int64_t t = 0; t < T; ++t) quant_row(t);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t) quant_row(t);
  }
  const int64_t ws = w.stride[0];  // bytes per weight row
  const uint8_t* wp = static_cast<const uint8_t*>(w.data);
  VecDotRowsFn dot_rows = reference ? nullptr : qt->vec_dot_rows;
  auto rows_body = [&](int64_t t0, int64_t t1, int64_t n0, int64_t n1) {
    if (dot_rows != nullptr) {
      // Each weight row is unpacked once per group of kDotRows activation rows.
      for (int64_t t = t0; t < t1; t += kDotRows) {
        const int nr = static_cast<int>(std::min<int64_t>(kDotRows, t1 - t));
        const uint8_t* xr = xqp + t * xrow;
        float* orow = op_ + t * os;
        for (int64_t n = n0; n < n1; ++n) dot_rows(K, wp + n * ws, xr, xrow, nr, orow + n, os);
        if (bp)
          for (int r = 0; r < nr; ++r)
            for (int64_t n = n0; n < n1; ++n) orow[r * os + n] += bp[n];
      }
      return;
    }
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* xr = xqp + t * xrow;
      float* orow = op_ + t * os;
      for (int64_t n = n0; n < n1; ++n) {
        const float v = dot(K, wp + n * ws, xr);
        orow[n] = bp ? v + bp[n] : v;
      }
    }
  };
  if (!packed) {
    for_tiles(T, N, row_bytes(wt, K), 1, kDotRows, !reference, rows_body);
    return;
  }
  // Packed: whole panels of kPackRows rows, each reused by every activation row of the tile
  // while it sits in L1; the rows past the last panel keep the block layout (rows_body).
  const PackedGemmFn gemm = packed_gemm(packed_base(wt), reference);
  const int64_t panel_end = N / kPackRows * kPackRows, nb = K / bs;
  auto packed_body = [&](int64_t t0, int64_t t1, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < std::min(n1, panel_end); n += kPackRows)
      for (int64_t t = t0; t < t1; t += kPackedRows) {
        const int nr = static_cast<int>(std::min<int64_t>(kPackedRows, t1 - t));
        gemm(wp + n * ws, nb, pxp + t * pxrow, pxrow, nr, op_ + t * os + n, os,
             bp ? bp + n : nullptr);
      }
    if (n1 > panel_end) rows_body(t0, t1, std::max(n0, panel_end), n1);
  };
  for_tiles(T, N, row_bytes(wt, K), kPackRows, kPackedRows, !reference, packed_body);
}

// Group by group through linear: each group's rows are a strided 2-D view of x and out.
void batched_linear(const Tensor& out, const Tensor& x, const Tensor& w, bool reference) {
  for (int64_t g = 0; g < x.shape[1]; ++g)
    linear(group_view(out, g), group_view(x, g), stacked_view(w, g), Tensor{}, reference);
}

bool dense_panel_is_fast() {
#if VLLMX_X86
  return simd_level() >= 2;
#else
  return false;
#endif
}

VLLMX_KERNEL(linear, kCPU, linear);
VLLMX_KERNEL(batched_linear, kCPU, batched_linear);

}  // namespace vllmx
