// linear on the GPU: out[T, N] = x[T, K] @ w[N, K]^T (+ bias[N]), x/out bf16 or f16.
//
// Here: the mma.sync tensor-core GEMM (gemm_kernel) and the scalar twin (linear_generic_kernel),
// their launches, the grouped products fused_moe.cu runs, and the ops linear, batched_linear,
// linear_act_and_mul and rms_norm_linear. Which kernel takes a product is plan_linear's choice,
// made on the host in linear_plan.cu, whose head lists the kernel families.
#include <algorithm>
#include <string>
#include <type_traits>

#include "core/op_table.h"
#include "cuda_ops.h"
#include "cuda_util.cuh"
#include "gemm_sm90.h"
#include "linear.cuh"
#include "mma.cuh"

namespace vllmx::cuda {

namespace {

using namespace detail;
using namespace lin;

constexpr const char* kOp = "linear";

// ------------------------------------------------------------------ GEMM (tensor cores)

template <typename T, int WK, class C>
__global__ void __launch_bounds__(C::kThreads) gemm_kernel(LinearArgs a) {
  pdl_begin();
  constexpr bool kBf = std::is_same_v<T, __nv_bfloat16>;
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, LDS = C::LDS, STAGES = C::STAGES;
  constexpr int CPR = BK / 8;  // chunks per tile row
  extern __shared__ uint4 gemm_smem[];
  T* As = reinterpret_cast<T*>(gemm_smem);  // [STAGES][BM][LDS]
  T* Bs = As + STAGES * BM * LDS;            // [STAGES][BN][LDS]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int KT = (a.K + BK - 1) / BK;
  const T* xp = static_cast<const T*>(a.x);
  const void* wq = row_weights(a, m0);  // (grouped: this tile's expert; tile_rows == BM)
  if (wq == nullptr) return;

  // The x row each of this thread's A chunks reads (the same at every k step), -1: zeros.
  int a_src[C::kAChunks];
#pragma unroll
  for (int i = 0; i < C::kAChunks; ++i) a_src[i] = x_row(a, m0 + (tid + i * C::kThreads) / CPR);
  auto load_a = [&](int kt, int st) {
#pragma unroll
    for (int i = 0; i < C::kAChunks; ++i) {
      const int idx = tid + i * C::kThreads, row = idx / CPR, cc = idx % CPR;
      const int gk = kt * BK + cc * 8;
      const bool ok = a_src[i] >= 0 && gk < a.K;
      cp_async16(As + (st * BM + row) * LDS + cc * 8,
                 ok ? xp + a_src[i] * a.x_stride + gk : xp, ok);
    }
  };
  // Same-dtype weights: cp.async like x.
  auto load_b_async = [&](int kt, int st) {
    const T* wp = static_cast<const T*>(wq);
#pragma unroll
    for (int i = 0; i < C::kBChunks; ++i) {
      const int idx = tid + i * C::kThreads, row = idx / CPR, cc = idx % CPR;
      const int gn = n0 + row, gk = kt * BK + cc * 8;
      const bool ok = gn < a.N && gk < a.K;
      cp_async16(Bs + (st * BN + row) * LDS + cc * 8, ok ? wp + gn * a.w_stride + gk : wp, ok);
    }
  };
  // Other weights: global -> registers (raw), later dequantized -> shared memory.
  uint4 raw[C::kBChunks];
  auto load_b_raw = [&](int kt) {
#pragma unroll
    for (int i = 0; i < C::kBChunks; ++i) {
      const int idx = tid + i * C::kThreads, row = idx / CPR, cc = idx % CPR;
      const int gn = n0 + row, gk = kt * BK + cc * 8;
      raw[i] = gn < a.N && gk < a.K ? load_chunk<WK>(wq, a.w_stride, gn, gk)
                                    : make_uint4(0, 0, 0, 0);
    }
  };
  auto store_b = [&](int kt, int st) {
#pragma unroll
    for (int i = 0; i < C::kBChunks; ++i) {
      const int idx = tid + i * C::kThreads, row = idx / CPR, cc = idx % CPR;
      const int gn = n0 + row, gk = kt * BK + cc * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (gn < a.N && gk < a.K) {
        float f[8];
        chunk_to_float<WK>(raw[i], gk, kBf, f);
        v = pack8(f, kBf);
      }
      *reinterpret_cast<uint4*>(Bs + (st * BN + row) * LDS + cc * 8) = v;
    }
  };

  float acc[C::MT][C::NT][4];
#pragma unroll
  for (int i = 0; i < C::MT; ++i)
#pragma unroll
    for (int j = 0; j < C::NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  // Prologue: tiles 0 .. STAGES-2.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) {
      load_a(s, s);
      if constexpr (WK == kWSame) {
        load_b_async(s, s);
      } else {
        load_b_raw(s);
        store_b(s, s);
      }
    }
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();
  __syncthreads();

  for (int kt = 0; kt < KT; ++kt) {
    const int nk = kt + STAGES - 1, nst = nk % STAGES, st = kt % STAGES;
    // Stage nst was last read in iteration kt - 1, behind the barrier that ended it.
    if (nk < KT) {
      load_a(nk, nst);
      if constexpr (WK == kWSame)
        load_b_async(nk, nst);
      else
        load_b_raw(nk);  // in flight during the mma below
    }
    cp_async_commit();

    const T* at = As + st * BM * LDS;
    const T* bt = Bs + st * BN * LDS;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[C::MT][4], bf[C::NT][2];
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
        ldmatrix_x4(af[mt],
                    at + (wm * C::WM + mt * 16 + lane % 16) * LDS + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < C::NT / 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, bt + (wn * C::WN + np * 16 + lane % 8 + (lane / 16) * 8) * LDS + kk * 16 +
                           ((lane / 8) % 2) * 8);
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NT; ++nt) mma16816<T>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
    if constexpr (WK != kWSame) {
      if (nk < KT) store_b(nk, nst);
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();
  }

  // Epilogue: fragments -> out (+ bias), two adjacent columns per store.
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * C::WM + mt * 16 + lane / 4 + h * 8;
        const int col = n0 + wn * C::WN + nt * 8 + (lane % 4) * 2;
        if (row < a.T && col < a.N)
          store_out(a, kBf, row, col, acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1], col + 1 < a.N);
      }
}

// ------------------------------------------------------------------ generic (scalar twin)

// One element of an f32 / f16 / bf16 array as f32.
__device__ __forceinline__ float load_dense(const void* p, int64_t i, DType dt) {
  if (dt == DType::F32) return static_cast<const float*>(p)[i];
  return bits_to_float(static_cast<const uint16_t*>(p)[i], dt == DType::BF16);
}

// w[n, k] as f32: a dense weight, or Q8_0 / Q4_0 / Q4_1 / Q4_K / Q5_K / Q6_K / IQ4_NL / IQ4_XS
// blocks.
__device__ float load_w_elem(const void* w, int64_t w_stride, DType dt, int n, int k) {
  if (dt == DType::F32 || dt == DType::F16 || dt == DType::BF16)
    return load_dense(w, n * w_stride + k, dt);
  float f[8];
  const int k8 = k / 8 * 8;
  visit_quant_kind(quant_kind(dt), [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    chunk_to_float<WK>(load_chunk<WK>(w, w_stride, n, k8), k8, false, f);
  });
  float v = f[0];
#pragma unroll
  for (int j = 1; j < 8; ++j)
    if (k - k8 == j) v = f[j];
  return v;
}

__global__ void linear_generic_kernel(LinearArgs a, DType x_code, DType w_code) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(a.T) * a.N) return;
  const int t = static_cast<int>(i / a.N), n = static_cast<int>(i % a.N);
  const void* w = row_weights(a, t);
  if (w == nullptr) return;
  const int src = x_row(a, t);  // -1: a padding row of zeros
  float acc = 0.f;
  for (int k = 0; src >= 0 && k < a.K; ++k)
    acc = fmaf(load_dense(a.x, src * a.x_stride + k, x_code),
               load_w_elem(w, a.w_stride, w_code, n, k), acc);
  if (a.bias != nullptr) acc += load_dense(a.bias, n, x_code);
  if (x_code == DType::F32)
    static_cast<float*>(a.out)[t * a.out_stride + n] = acc;
  else
    static_cast<uint16_t*>(a.out)[t * a.out_stride + n] = float_to_bits(acc, x_code == DType::BF16);
}

// ------------------------------------------------------------------ host: launch

template <typename T, int WK, class C>
void launch_gemm(const LinearArgs& a, cudaStream_t s) {
  static const bool smem_ok = (allow_smem(gemm_kernel<T, WK, C>, C::kSmemBytes), true);
  (void)smem_ok;
  const dim3 grid((a.N + C::BN - 1) / C::BN, (a.T + C::BM - 1) / C::BM);
  launch(gemm_kernel<T, WK, C>, grid, C::kThreads, C::kSmemBytes, s, a);
}

template <typename T, int WK>
void launch_tc(const LinearPlan& p, const LinearArgs& a, cudaStream_t s) {
  if (p.path == Path::kGemv) {
    // GEMV converts w to f32 by its own dtype: a same-dtype weight is read as that dtype.
    constexpr bool kBf = std::is_same_v<T, __nv_bfloat16>;
    constexpr int GK = WK == kWSame ? (kBf ? kWBF16 : kWF16) : WK;
    launch_gemv(a, kBf, GK, p.max_t, p.act == static_cast<int>(Act::kSilu), s);
  } else if (p.path == Path::kGemmLarge) {
    launch_gemm<T, WK, GemmLarge>(a, s);
  } else {
    launch_gemm<T, WK, GemmSmall>(a, s);
  }
}

template <typename T>
void dispatch_wk(const LinearPlan& p, const LinearArgs& a, cudaStream_t s) {
  constexpr int kOther = std::is_same_v<T, __nv_bfloat16> ? kWF16 : kWBF16;
  switch (p.wk) {
    case kWSame: launch_tc<T, kWSame>(p, a, s); break;
    case kWF16:
    case kWBF16: launch_tc<T, kOther>(p, a, s); break;  // the other 16-bit dtype
    default:
      visit_quant_kind(p.wk, [&](auto wk) { launch_tc<T, decltype(wk)::value>(p, a, s); });
  }
}

std::string i2s(int64_t v) { return std::to_string(v); }

// Checks a product x[T, K] @ w[N, K]^T (+ bias) into out [T, out_n] and fills its LinearArgs.
// fp8_w: w may be fp8 codes (rms_norm_linear's fp8 path, which checks the rest).
LinearArgs linear_args(const char* op, const Tensor& out, const Tensor& x, const Tensor& w,
                       const Tensor& bias, int64_t out_n, bool fp8_w = false) {
  VLLMX_CHECK(out.defined() && x.defined() && w.defined(), op, "missing tensor");
  check_ndim(x, 2, op, "x");
  check_ndim(out, 2, op, "out");
  check_ndim(w, 2, op, "w");
  check_rows(out, op, "out");
  check_rows(x, op, "x");
  check_rows(w, op, "w");
  const DType xt = x.dtype, wt = w.dtype;
  VLLMX_CHECK(xt == DType::BF16 || xt == DType::F16 || xt == DType::F32, op,
        "x must be bf16, f16 or f32, got " + x.str());
  VLLMX_CHECK(out.dtype == xt, op, "out " + out.str() + " must have x's dtype (x " + x.str() + ")");
  VLLMX_CHECK(wt == DType::F32 || wt == DType::F16 || wt == DType::BF16 || quant_kind(wt) >= 0 ||
                  (fp8_w && wt == DType::F8_E4M3),
        op, std::string("unsupported weight dtype ") + dtype_name(wt) + " (id " +
                 i2s(static_cast<int>(wt)) + ") for w " + w.str());
  const int64_t T = x.shape[0], K = x.shape[1], N = w.shape[0];
  VLLMX_CHECK(w.shape[1] == K, op, "x " + x.str() + " and w " + w.str() + " disagree on K");
  VLLMX_CHECK(out.shape[0] == T && out.shape[1] == out_n, op,
        "out " + out.str() + " must be [" + i2s(T) + ", " + i2s(out_n) + "] for x " + x.str() +
            " and w " + w.str());
  const int64_t bs = type_traits(wt).block_size;
  VLLMX_CHECK(K % bs == 0, op,
        "K = " + i2s(K) + " of x " + x.str() + " is not a multiple of the " + dtype_name(wt) +
            " block size " + i2s(bs));
  if (bias.defined()) {
    check_rows(bias, op, "bias");
    VLLMX_CHECK(bias.dtype == xt && bias.ndim == 1 && bias.shape[0] == N, op,
          "bias " + bias.str() + " must be " + dtype_name(xt) + "[" + i2s(N) + "] for w " +
              w.str());
  }
  VLLMX_CHECK(T < (int64_t{1} << 31) && N < (int64_t{1} << 31) && K < (int64_t{1} << 31), op,
        "too large: x " + x.str() + ", w " + w.str());
  LinearArgs a;
  a.x = x.data;
  a.w = w.data;
  a.bias = bias.defined() ? bias.data : nullptr;
  a.out = out.data;
  a.T = static_cast<int>(T);
  a.N = static_cast<int>(out_n);
  a.K = static_cast<int>(K);
  a.x_stride = x.stride[0];
  a.out_stride = out.stride[0];
  a.w_stride = w.stride[0];
  a.pair_store = out.stride[0] % 2 == 0 && aligned(out.data, 4);
  return a;
}

void run_linear(const LinearPlan& p, const LinearArgs& a, DType xt, DType wt) {
  cudaStream_t s = stream();
  if (p.path == Path::kSm90) {
#ifdef VLLMX_WITH_SM90_GEMM  // (plan_sm90 takes this path only where the GEMM was built)
    const Sm90GemmArgs g{a.x,        a.w,          a.bias,       a.out,
                         a.T,        a.N,          a.K,          a.x_stride,
                         a.w_stride, a.out_stride, xt == DType::BF16, num_sms(),
                         lin::tuned_schedule(p.sm90_schedule)};
    sm90_gemm(g, p.sm90_tile, s);
#endif
  } else if (p.path == Path::kSkinny) {
    if (is_quant(p.wk))
      launch_gemm_skinny_quant(a, xt == DType::BF16, p.wk, s);
    else
      launch_gemm_skinny(a, xt == DType::BF16, s);
  } else if (p.path == Path::kGeneric) {
    const int64_t n = static_cast<int64_t>(a.T) * a.N;
    const int threads = 128;
    launch(linear_generic_kernel, static_cast<unsigned>((n + threads - 1) / threads), threads, 0,
           s, a, xt, wt);
  } else if (xt == DType::BF16) {
    dispatch_wk<__nv_bfloat16>(p, a, s);
  } else {
    dispatch_wk<__half>(p, a, s);
  }
  check_launch(kOp);
}

}  // namespace

namespace lin {

// Few rows an expert (decode, small batches): 32-row tiles waste less of each weight tile; from
// ~96 rows an expert on, 128-row tiles read each weight tile for four times the rows.
bool grouped_rows_many(int64_t rows, int64_t experts) { return rows >= 96 * experts; }

int grouped_tile_rows(bool tensor_cores, int64_t rows, int64_t experts) {
  if (!tensor_cores) return GemmSmall::BM;  // the generic kernel: any height
  return grouped_rows_many(rows, experts) ? GemmLarge::BM : GemmSmall::BM;
}

void launch_grouped_linear(const LinearArgs& a, DType xt, cudaStream_t s) {
  LinearPlan p;
  p.path = Path::kGeneric;
  if (xt != DType::F32 && a.K % 8 == 0 && a.x_stride % 8 == 0 && a.w_stride % 8 == 0 &&
      aligned(a.x, 16) && aligned(a.w, 16) && a.w_expert_stride % 16 == 0)
    p.path = a.tile_rows == GemmLarge::BM ? Path::kGemmLarge : Path::kGemmSmall;
  run_linear(p, a, xt, xt);
}

}  // namespace lin

void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const LinearArgs a = linear_args(kOp, out, x, w, bias, w.defined() ? w.shape[0] : 0);
  if (a.T == 0 || a.N == 0) return;
  run_linear(plan_linear(out, x, w, a.T, a.N, a.K), a, x.dtype, w.dtype);
}

// MLA's per-head projections (the contract in csrc/ops.def): a few rows in one launch
// (gemm_batched.cu); else group by group through linear, each group's rows a strided view of x
// and out, so each gets linear's plan and bits.
void batched_linear(const Tensor& out, const Tensor& x, const Tensor& w) {
  if (batched_gemm_fits(out, x, w)) {
    batched_gemm(out, x, w);
    return;
  }
  for (int64_t g = 0; g < x.shape[1]; ++g)
    linear(group_view(out, g), group_view(x, g), stacked_view(w, g), Tensor{});
}

namespace {
// out = act(gate) * up from gated [T, 2 I] (gate columns, then up), act an Act.
void act_and_mul(const Tensor& out, const Tensor& gated, int act) {
  if (act == static_cast<int>(Act::kSilu))
    silu_and_mul(out, gated);
  else
    gelu_and_mul(out, gated, act == static_cast<int>(Act::kGeluTanh));
}
}  // namespace

void linear_act_and_mul(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& tmp,
                        int act) {
  const char* op = "linear_act_and_mul";
  VLLMX_CHECK(act >= 0 && act <= 2, op, "act must be 0 (silu), 1 (gelu) or 2 (gelu_tanh)");
  VLLMX_CHECK(w.defined() && w.ndim == 2 && w.shape[0] % 2 == 0, op,
        "w " + w.str() + " must be [2 * I, K]: gate rows, then up rows");
  const int64_t I = w.shape[0] / 2;
  LinearArgs a = linear_args(op, out, x, w, Tensor{}, I);
  VLLMX_CHECK(tmp.defined() && tmp.dtype == x.dtype && tmp.ndim == 2 && tmp.shape[0] == a.T &&
            tmp.shape[1] == 2 * I,
        op, "tmp " + tmp.str() + " must be [T, 2 * I] of x's dtype (x " + x.str() + ")");
  check_rows(tmp, op, "tmp");
  if (a.T == 0 || I == 0) return;
  LinearPlan p = plan_linear(tmp, x, w, a.T, 2 * I, a.K);
  if (p.path == Path::kGemv && act == static_cast<int>(Act::kSilu)) {
    p.act = act;  // one kernel: the gated GEMV
    run_linear(p, a, x.dtype, w.dtype);
    return;
  }
  linear(tmp, x, w, Tensor{});
  act_and_mul(out, tmp, act);
}

// rms_norm_linear fuses the norm into the GEMV up to this many weight elements (32 MB bf16).
constexpr int64_t kNormFuseMaxElems = int64_t{16} << 20;

namespace {
// An fp8 w (its scales w_s): the normed rows quantized as fp8_linear quantizes its x, by the
// norm's own kernel where it takes them (add_rms_norm_quant_fp8: vLLM fuses the two as well),
// else add_rms_norm into tmp_norm and per_token_group_quant_fp8 from there; then the product
// (and the activation from tmp_act).
void rms_norm_fp8_linear(const Tensor& out, const Tensor& res_out, const Tensor& x,
                         const Tensor& residual, const Tensor& norm_w, float eps, const Tensor& w,
                         const Tensor& w_s, const Tensor& bias, const Tensor& tmp_norm,
                         const Tensor& tmp_act, int act, const char* op) {
  const int64_t T = x.shape[0], K = x.shape[1], N = w.shape[0];
  VLLMX_CHECK(x.dtype != DType::F32 && K % kFp8Group == 0, op,
              "an fp8 w " + w.str() + " takes bf16 / f16 x of whole 128-wide groups, got " +
                  x.str());
  VLLMX_CHECK(w_s.defined() && w_s.dtype == DType::F32 && w_s.ndim == 2 &&
                  w_s.shape[0] == K / kFp8Group && w_s.shape[1] == N,
              op, "an fp8 w " + w.str() + " needs its f32 scales w_s [K / 128, N], got " +
                      w_s.str());
  VLLMX_CHECK(w_s.stride[1] == 1 && w_s.stride[0] == N, op,
              "w_s " + w_s.str() + " must be dense [K / 128, N]");
  for (const Tensor* t : {&w, &w_s, &out, &tmp_norm, &tmp_act})
    check_on_device(*t, op, "tensors");
  // The quantization may run twice (fp8_linear_quantized): it must not read what it wrote.
  VLLMX_CHECK(!res_out.defined() || (res_out.data != x.data && res_out.data != residual.data),
              op, "res_out must not alias x or the residual");
  if (N == 0) {  // no product: the residual stream still moves on
    add_rms_norm(tmp_norm, res_out, x, residual, norm_w, eps);
    return;
  }
  const Tensor& product = act < 0 ? out : tmp_act;
  bool normed = false;  // tmp_norm holds the normed rows
  fp8_linear_quantized(
      product, T, K, w, w_s, bias,
      [&](uint8_t* q, float* s, int64_t s_stride) {
        if (!normed &&
            add_rms_norm_quant_fp8(q, K, s, s_stride, res_out, x, residual, norm_w, eps))
          return;
        if (!normed) add_rms_norm(tmp_norm, res_out, x, residual, norm_w, eps);
        normed = true;
        per_token_group_quant_fp8_rows(q, K, s, s_stride, tmp_norm, op);
      },
      op);
  if (act >= 0) act_and_mul(out, tmp_act, act);
}
}  // namespace

void rms_norm_linear(const Tensor& out, const Tensor& res_out, const Tensor& x,
                     const Tensor& residual, const Tensor& norm_w, float eps, const Tensor& w,
                     const Tensor& bias, const Tensor& tmp_norm, const Tensor& tmp_act, int act,
                     const Tensor& w_s) {
  const char* op = "rms_norm_linear";
  VLLMX_CHECK(act >= -1 && act <= 2, op, "act must be -1 (none), 0 (silu), 1 or 2 (gelu)");
  VLLMX_CHECK(w.defined() && w.ndim == 2 && (act < 0 || w.shape[0] % 2 == 0), op,
        "w " + w.str() + (act < 0 ? " must be 2-D" : " must be [2 * I, K]: gate, then up rows"));
  VLLMX_CHECK(act < 0 || !bias.defined(), op, "a gated projection takes no bias");
  const int64_t n_out = act < 0 ? w.shape[0] : w.shape[0] / 2;
  const bool fp8 = w.dtype == DType::F8_E4M3;
  LinearArgs a = linear_args(op, out, x, w, bias, n_out, fp8);
  VLLMX_CHECK(norm_w.defined() && norm_w.dtype == DType::F32 && norm_w.ndim == 1 &&
            norm_w.shape[0] == a.K,
        op, "norm weight " + norm_w.str() + " must be f32 [" + i2s(a.K) + "]");
  check_on_device(norm_w, op, "norm weight");
  VLLMX_CHECK(residual.defined() == res_out.defined(), op, "residual and res_out go together");
  for (const Tensor* t : {&residual, &res_out, &tmp_norm}) {
    if (!t->defined()) continue;
    check_rows(*t, op, "residual / tmp");
    VLLMX_CHECK(t->dtype == x.dtype && t->ndim == 2 && t->shape[0] == a.T && t->shape[1] == a.K,
          op, t->str() + " must be [T, K] like x " + x.str());
  }
  VLLMX_CHECK(tmp_norm.defined(), op, "tmp_norm is required (the unfused path writes it)");
  VLLMX_CHECK(act < 0 || (tmp_act.defined() && tmp_act.dtype == x.dtype && tmp_act.ndim == 2 &&
                          tmp_act.shape[0] == a.T && tmp_act.shape[1] == w.shape[0]),
        op, "tmp_act " + tmp_act.str() + " must be [T, 2 * I] of x's dtype");
  if (a.T == 0) return;
  if (fp8) {
    rms_norm_fp8_linear(out, res_out, x, residual, norm_w, eps, w, w_s, bias, tmp_norm, tmp_act,
                        act, op);
    return;
  }
  LinearPlan p = plan_linear(out, x, w, a.T, w.shape[0], a.K);
  const bool gated_ok = act < 0 || act == static_cast<int>(Act::kSilu);
  // Every CTA of the fused GEMV re-reads x, the residual and the norm weight (~1.5 bytes from
  // L2 per weight byte at 4 rows a CTA): worth it where the product is short and launch-bound
  // (Qwen3-0.6B's 8-13 MB projections), not where it streams hundreds of MB (Llama-3-8B's
  // gate_up ran 25% slower fused on the H200).
  const bool small = static_cast<int64_t>(w.shape[0]) * a.K <= kNormFuseMaxElems;
  if (p.path == Path::kGemv && gated_ok && small && aligned(norm_w.data, 16) && a.K % 8 == 0 &&
      (!residual.defined() || (aligned(residual.data, 16) && residual.stride[0] % 8 == 0 &&
                               aligned(res_out.data, 16) && res_out.stride[0] % 8 == 0))) {
    // One kernel: the norm in the GEMV's prologue (and the activation in its epilogue).
    a.norm_w = norm_w.ptr<float>();
    a.eps = eps;
    if (residual.defined()) {
      a.res = residual.data;
      a.res_out = res_out.data;
      a.res_stride = residual.stride[0];
      a.res_out_stride = res_out.stride[0];
    }
    p.act = act;
    if (n_out > 0) run_linear(p, a, x.dtype, w.dtype);
    return;
  }
  add_rms_norm(tmp_norm, res_out, x, residual, norm_w, eps);
  if (act < 0)
    linear(out, tmp_norm, w, bias);
  else
    linear_act_and_mul(out, tmp_norm, w, tmp_act, act);
}

VLLMX_KERNEL(linear, kCUDA, linear);
VLLMX_KERNEL(batched_linear, kCUDA, batched_linear);
VLLMX_KERNEL(linear_act_and_mul, kCUDA, linear_act_and_mul);
VLLMX_KERNEL(rms_norm_linear, kCUDA, rms_norm_linear);

}  // namespace vllmx::cuda
