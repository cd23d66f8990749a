"""vllmx's CUDA kernels vs PyTorch (cuBLAS / SDPA) on the same GPU in one run: bf16 linear at
Llama-3-8B shapes over batch sizes, and paged decode / prefill attention vs SDPA on contiguous
K/V. Prints time, TFLOP/s or GB/s, and the ratio (torch time / vllmx time: > 1 means faster).

    python bench/gpu_kernels_vs_torch.py        (on a GPU machine; torch is the peer only)
    python bench/gpu_kernels_vs_torch.py --only linear --tokens 32,64,128,256,512,1024,4096
    VLLMX_CUDA_SM90=0 python bench/gpu_kernels_vs_torch.py --only linear --json sm80.json

Linear products are timed as 20 of them in one CUDA graph on both sides (decode's conditions),
each call on the next of several copies of the weights (>= 256 MB in all), so that neither side
finds them in the 50 MB L2 as a model's layers never do; decode attention likewise, over
copies of the K/V cache (`--attention-cases batch:context:q_len,...`);
VLLMX_CUDA_SM90=0 times the sm_80 kernels (the skinny GEMM, mma.sync) on a Hopper GPU.

`--plans` times each linear case once per kernel the planner could pick (vllmx._C
cuda_linear_tuning forces it), to choose the planner's thresholds from one build:

    python bench/gpu_kernels_vs_torch.py --only linear --tokens 8,16,32,64,128,256,512 \
        --plans auto,skinny,skinny:w4,swap128x32,swap128x32:data_parallel,128x128:split_k:2

A plan is `auto` (the planner), `skinny[:wN]` (the skinny GEMM, split-K aiming at N CTAs per
SM), `gemv`, `gemm_small` or a CUTLASS tile (LINEAR_TUNING_PATHS), with optional scheduler
options: a decomposition and its splits, `sN` (tiles in runs of N) and a raster order
(`along_m`, `along_n`); a plan that cannot take a case is left out of it. Prefill sizes:

    python bench/gpu_kernels_vs_torch.py --only linear --tokens 2048,8192 \
        --plans auto,auto:s4,auto:s8,auto:s8:along_n

`--weight-type Q4_K` (any GGUF block type vllmx's CUDA linear takes) times vllmx on the blocks
against cuBLAS on their bf16 values: the GB/s column is then the blocks' bytes. `--weight-type
FP8` times fp8_linear (block-scaled e4m3 weights, x quantized per 128 values) the same way.

Each linear case also checks vllmx's output against torch's (max error / max |torch|), so a
fast wrong kernel shows up here too.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from vllmx import _C, ops
from vllmx.device import BF16, DeviceArray


def timeit(fn, sync, iters=20):
    for _ in range(3):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t) / iters


def graphed(fn, ours: bool, n=20):
    """fn captured n times in one CUDA graph (vllmx's or torch's), as decode steps run it:
    returns (replay, n). Times kernels without the host's launch cost, which for a 10 us GEMM
    would otherwise be part of what is measured on either side."""
    fn()  # warm: workspaces grow before capture
    if ours:
        _C.cuda_synchronize()
        g = _C.CudaGraph()
        g.capture_begin()
        for _ in range(n):
            fn()
        g.capture_end()
        return g.replay, n
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return g.replay, n


def graph_time(fn, ours: bool) -> float:
    replay, n = graphed(fn, ours)
    return timeit(replay, _C.cuda_synchronize if ours else torch.cuda.synchronize, iters=10) / n


def bits_bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


# Max error / max |torch| above this flags a wrong kernel: both outputs are rounded to bf16 (one
# ulp at the largest magnitude is 2^-7 of it) after different summation orders, so two ulps.
WRONG = 2 * 2.0**-7


def linear_error(out: DeviceArray, ref: torch.Tensor) -> float:
    """max |vllmx - torch| / max |torch| (both bf16 outputs of f32 accumulations)."""
    got = torch.from_numpy(out.numpy().view(np.int16)).to("cuda").view(torch.bfloat16).float()
    ref = ref.float()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# Llama-3-8B's projections: o_proj, qkv, gate_up (fused, as vllmx and vLLM run it), down,
# lm_head.
SHAPES = "4096x4096,6144x4096,28672x4096,4096x14336,128256x4096"

# Weight copies per shape fill at least this many bytes: a decode step streams each layer's
# weights once, so a product must not find its weights in the 50 MB L2 from the previous call.
ROTATE_BYTES = 256 << 20


def rotations(nbytes: int) -> int:
    """Copies of an nbytes operand that fill ROTATE_BYTES."""
    return max(1, -(-ROTATE_BYTES // nbytes))


def parse_plan(spec: str) -> dict:
    """`auto`, `skinny[:wN]` or a CUTLASS tile, then options: a decomposition, its splits (a
    number), `sN` (swizzle) and a raster order (`auto:s8:along_m` keeps the planner's kernel
    with its tiles in runs of 8 along M) -> cuda_linear_tuning's kwargs."""
    name, *rest = spec.split(":")
    if name == "skinny":
        return {"path": name, "skinny_waves": int(rest[0].lstrip("w")) if rest else 0}
    kw = {} if name == "auto" else {"path": name}
    for opt in rest:
        if opt in _C.LINEAR_TUNING_DECOMPOSITIONS:
            kw["decomposition"] = opt
        elif opt in _C.LINEAR_TUNING_RASTERS:
            kw["raster"] = opt
        elif opt.startswith("s"):
            kw["swizzle"] = int(opt[1:])
        else:
            kw["splits"] = int(opt)
    return kw


def block_weight(rng, n: int, k: int, wtype: str) -> tuple[np.ndarray, int, np.ndarray]:
    """(stored weight, vllmx dtype, its f32 values) of an [n, k] weight of GGUF type wtype: a
    normal draw quantized by llama.cpp's reference quantizer, or for the i-quants (which no
    quantizer here writes) random codes under a small scale."""
    import gguf

    qt = gguf.GGMLQuantizationType[wtype]
    if wtype in ops.QUANTIZE_TYPES:
        w32 = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        blocks = ops.quantize_weight(w32, ops.QUANTIZE_TYPES[wtype])
    else:
        values, nbytes = gguf.GGML_QUANT_SIZES[qt]
        blocks = rng.integers(0, 256, (n, k // values, nbytes), dtype=np.uint8)
        d = (rng.uniform(0.5, 1.0, (n, k // values)) * 2e-4).astype(np.float16)
        blocks[..., 0:2] = d[..., None].view(np.uint8)
        blocks = blocks.reshape(n, -1)
    return blocks, int(qt), gguf.quants.dequantize(blocks, qt).astype(np.float32)


def fp8_weight(rng, n: int, k: int) -> tuple[DeviceArray, np.ndarray, int]:
    """An fp8 block-scaled weight on the device (codes with .scales, as an fp8 checkpoint
    uploads), its f32 values and its bytes: random codes (the exponent's top bit cleared: no
    NaN, magnitudes up to 1.875) under per-row, per-128 scales around 1e-2."""
    from vllmx.device import F8_E4M3

    codes = (rng.integers(0, 256, (n, k), dtype=np.uint8) & 0xBF).astype(np.uint8)
    s = rng.uniform(0.5e-2, 1.5e-2, (k // 128, n)).astype(np.float32)
    w = DeviceArray.from_numpy(codes, F8_E4M3)
    w.scales = DeviceArray.from_numpy(s)
    return w, e4m3_values(codes, s), codes.nbytes + s.nbytes


def e4m3_values(codes: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Codes [R, K] with their per-128 scales [K / 128, R] as f32 values: the F8_E4M3_B128
    weight they make, dequantized as every block type is."""
    return ops.fp8_block_weight(codes, np.ascontiguousarray(s.T)).to_float32().reshape(
        codes.shape)


def bench_linear(results, tokens, shapes, plans=("auto",), wtype="BF16"):
    """wtype: BF16, a GGUF block type run by vllmx against cuBLAS on its bf16 values, or FP8
    (fp8_linear on block-scaled e4m3 codes, against cuBLAS on their bf16 values)."""
    rng = np.random.default_rng(0)
    for n, k in shapes:
        if wtype == "FP8":
            w, w32, nbytes = fp8_weight(rng, n, k)
            ws = [w] + [fp8_weight(rng, n, k)[0] for _ in range(rotations(nbytes) - 1)]
        else:
            if wtype == "BF16":
                w32 = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
                stored, wdt = bits_bf16(w32), BF16
            else:
                stored, wdt, w32 = block_weight(rng, n, k, wtype)
            nbytes = stored.nbytes
            ws = [DeviceArray.from_numpy(stored, wdt) for _ in range(rotations(nbytes))]
        copies = len(ws)
        wts = [torch.from_numpy(w32).to("cuda", torch.bfloat16)
               for _ in range(rotations(n * k * 2))]
        w, wt = ws[0], wts[0]
        for t in tokens:
            x32 = rng.standard_normal((t, k)).astype(np.float32)
            x = DeviceArray.from_numpy(bits_bf16(x32), BF16)
            out = DeviceArray.empty((t, n), BF16)
            xt = torch.from_numpy(x32).to("cuda", torch.bfloat16)
            if wtype == "FP8":  # fp8_linear quantizes x: the reference takes the same values
                x32 = e4m3_values(*ops.per_token_group_quant_fp8(bits_bf16(x32), BF16))
            turn = iter(range(1 << 30))  # each captured call takes the next weight copy
            theirs = graph_time(
                lambda: torch.nn.functional.linear(xt, wts[next(turn) % len(wts)]), False)
            ref = torch.nn.functional.linear(
                torch.from_numpy(x32).to("cuda", torch.bfloat16), wt)
            def call(wi):
                if wtype == "FP8":
                    _C.ops.fp8_linear(out, x, wi, wi.scales, None)
                else:
                    _C.ops.linear(out, x, wi, None)
            for plan in plans:
                try:
                    _C.cuda_linear_tuning(**parse_plan(plan))
                    ours = graph_time(lambda: call(ws[next(turn) % copies]), True)
                    call(w)
                except ValueError:  # this kernel cannot take this product
                    continue
                finally:
                    _C.cuda_linear_tuning()
                err = linear_error(out, ref)
                flops = 2 * t * n * k
                r = {"op": f"linear_{wtype.lower()}", "N": n, "K": k, "T": t, "plan": plan,
                     "sm90": _C.cuda_sm90_kernels(),
                     "timing": f"cuda graph of 20, {copies} weight copies in turn",
                     "vllmx_ms": ours * 1e3, "torch_ms": theirs * 1e3,
                     "vllmx_tflops": flops / ours / 1e12, "torch_tflops": flops / theirs / 1e12,
                     "vllmx_weight_GBps": nbytes / ours / 1e9, "ratio": theirs / ours,
                     "max_rel_err_vs_torch": err}
                results.append(r)
                print(f"linear N={n:6d} K={k:5d} T={t:4d} {plan:>24}: vllmx {ours*1e6:7.1f} us "
                      f"({r['vllmx_tflops']:6.1f} TFLOP/s, {r['vllmx_weight_GBps']:6.0f} GB/s w)  "
                      f"torch {theirs*1e6:7.1f} us  ratio {r['ratio']:.2f}  err {err:.1e}"
                      f"{'  WRONG' if err > WRONG else ''}", flush=True)


ATTENTION_CASES = ("1:2048:1,8:1024:1,32:1024:1,32:4096:1,128:1024:1,256:1024:1,1:4096:4096,"
                   "8:1024:1024,1:8192:8192")


def bench_attention(results, cases):
    rng = np.random.default_rng(1)
    nq, nkv, d, bs = 32, 8, 128, 16
    for batch, ctx, qlen in cases:
        nblk = batch * ((ctx + bs - 1) // bs)
        kc32 = rng.standard_normal((nblk, bs, nkv, d)).astype(np.float32)
        vc32 = rng.standard_normal((nblk, bs, nkv, d)).astype(np.float32)
        # Decode streams the cache once a layer: copies in turn (>= 256 MB) keep the next call
        # from finding it in L2, as the linear products' weights. Prefill is compute-bound.
        copies = rotations(2 * kc32.size * 2) if qlen == 1 else 1
        kcs = [DeviceArray.from_numpy(bits_bf16(kc32), BF16) for _ in range(copies)]
        vcs = [DeviceArray.from_numpy(bits_bf16(vc32), BF16) for _ in range(copies)]
        per = (ctx + bs - 1) // bs
        table = np.arange(nblk, dtype=np.int32).reshape(batch, per)
        q32 = rng.standard_normal((batch * qlen, nq * d)).astype(np.float32)
        q = DeviceArray.from_numpy(bits_bf16(q32), BF16)
        out = DeviceArray.empty(q.shape, BF16)
        qsl = DeviceArray.from_numpy(np.arange(batch + 1, dtype=np.int32) * qlen)
        sl = DeviceArray.from_numpy(np.full(batch, ctx, np.int32))
        bt = DeviceArray.from_numpy(table)
        scale = d ** -0.5
        turn = iter(range(1 << 30))

        def ours_fn():
            i = next(turn) % copies
            # qlen as the longest query, as the engine passes it: long prompts' own kernel
            _C.ops.paged_attention(out, q, kcs[i], vcs[i], bt, qsl, sl, scale, 0, 0.0, qlen)
        kts = [torch.from_numpy(kc32.reshape(batch, ctx, nkv, d)).to("cuda", torch.bfloat16)
               .transpose(1, 2) for _ in range(copies)]
        vts = [torch.from_numpy(vc32.reshape(batch, ctx, nkv, d)).to("cuda", torch.bfloat16)
               .transpose(1, 2) for _ in range(copies)]
        qt = torch.from_numpy(q32.reshape(batch, qlen, nq, d)).to("cuda", torch.bfloat16)
        qt = qt.transpose(1, 2)
        causal = qlen > 1

        def sdpa():
            i = next(turn) % copies
            torch.nn.functional.scaled_dot_product_attention(qt, kts[i], vts[i], is_causal=causal,
                                                             enable_gqa=True)
        if qlen == 1:
            ours, theirs = graph_time(ours_fn, True), graph_time(sdpa, False)
        else:
            ours = timeit(ours_fn, _C.cuda_synchronize)
            theirs = timeit(sdpa, torch.cuda.synchronize)
        r = {"op": "paged_attention_bf16", "batch": batch, "context": ctx, "q_len": qlen,
             "heads": f"{nq}/{nkv}", "head_dim": d, "vllmx_ms": ours * 1e3,
             "torch_sdpa_ms": theirs * 1e3, "kv_GBps": 2 * kc32.size * 2 / ours / 1e9,
             "ratio": theirs / ours,
             "timing": (f"cuda graph of 20, {copies} cache copies in turn" if qlen == 1
                        else "20 launches")}
        if qlen > 1:  # causal: query i sees ctx - qlen + i + 1 keys; 4 flops per (q, k, head, d)
            pairs = qlen * (ctx - qlen) + qlen * (qlen + 1) / 2
            r["vllmx_tflops"] = 4 * batch * nq * d * pairs / ours / 1e12
            r["torch_tflops"] = 4 * batch * nq * d * pairs / theirs / 1e12
        results.append(r)
        print(f"attention batch={batch:2d} ctx={ctx:5d} q_len={qlen:4d}: vllmx {ours*1e3:8.3f} ms "
              f"({r['kv_GBps']:6.0f} GB/s KV)  torch SDPA {theirs*1e3:8.3f} ms  "
              f"ratio {r['ratio']:.2f}" + (f"  ({r['vllmx_tflops']:.0f} / {r['torch_tflops']:.0f}"
                                            " TFLOP/s)" if qlen > 1 else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["linear", "attention"], help="run one of the two")
    ap.add_argument("--tokens", default="1,8,32,512,4096",
                    help="linear: comma-separated T (rows of x) to sweep")
    ap.add_argument("--shapes", default=SHAPES,
                    help="linear: comma-separated NxK weight shapes")
    ap.add_argument("--weight-type", default="BF16",
                    help="linear: BF16, FP8 or a GGUF block type (Q4_K, Q6_K, IQ4_XS, ...): "
                         "vllmx on the blocks, torch on their bf16 values")
    ap.add_argument("--plans", default="auto",
                    help="linear: comma-separated kernels to time each case on (see above)")
    ap.add_argument("--attention-cases", default=ATTENTION_CASES,
                    help="attention: comma-separated batch:context:q_len")
    ap.add_argument("--json", default="gpu_kernels_vs_torch.json",
                    help="file name for the results (in $OUT, else bench/results)")
    args = ap.parse_args()
    if not _C.cuda_available():
        raise SystemExit("no CUDA GPU")
    results: list[dict] = []
    if args.only in (None, "linear"):
        shapes = [tuple(int(v) for v in nk.split("x")) for nk in args.shapes.split(",")]
        bench_linear(results, [int(t) for t in args.tokens.split(",")], shapes,
                     args.plans.split(","), args.weight_type)
    if args.only in (None, "attention"):
        bench_attention(results, [tuple(int(v) for v in c.split(":"))
                                  for c in args.attention_cases.split(",")])
    dest = os.path.join(os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results"),
                        args.json)
    with open(dest, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "results": results}, f, indent=2)
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
