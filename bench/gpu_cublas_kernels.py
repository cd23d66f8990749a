"""Which cuBLAS kernels torch runs for bf16 linear products, the peer's side of
bench/gpu_kernels_vs_torch.py: for each T and N x K, the kernels of one call per weight copy
(name, grid, block, shared memory, registers, mean time) from a kineto trace. The kernel names
(nvjet_sm90_tst_64x64_64x13_2x1_v_bz_TNT: a 64 x 64 output tile, 64 deep, 13 stages, a 2x1
cluster) say which tile shapes and splits cuBLAS's heuristics pick; the grid how many CTAs.

    python bench/gpu_cublas_kernels.py                       (on a GPU machine)
    python bench/gpu_cublas_kernels.py --tokens 128 --shapes 4096x4096
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

# Llama-3-8B's projections: qkv, o_proj, gate_up (fused), down.
SHAPES = "6144x4096,4096x4096,28672x4096,4096x14336"


def kernels(T: int, n: int, k: int) -> list[dict]:
    """torch's kernels for x [T, k] @ w [n, k]^T, one call per copy of w (>= 512 MB in all, so
    that none finds its weights in L2)."""
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
          for _ in range(max(2, 512 * 2**20 // (n * k * 2)))]
    x = torch.randn(T, k, device="cuda", dtype=torch.bfloat16)
    for w in ws:
        torch.nn.functional.linear(x, w)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for w in ws:
            torch.nn.functional.linear(x, w)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        p.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    found: dict[tuple, list[float]] = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memset", "gpu_memcpy"):
            continue
        a = e.get("args", {})
        key = (e["name"], str(a.get("grid")), str(a.get("block")), a.get("shared memory"),
               a.get("registers per thread"))
        found.setdefault(key, []).append(e.get("dur", 0))
    return [{"T": T, "N": n, "K": k, "kernel": name, "grid": grid, "block": block, "smem": smem,
             "regs": regs, "calls": len(ds), "mean_us": sum(ds) / len(ds)}
            for (name, grid, block, smem, regs), ds in found.items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="64,128,256", help="comma-separated T")
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated NxK weight shapes")
    ap.add_argument("--json", default="gpu_cublas_kernels.json",
                    help="file name for the results (in $OUT, else bench/results)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU")
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        for n, k in (tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")):
            for r in kernels(t, n, k):
                rows.append(r)
                print(f"T={t} {n}x{k} x{r['calls']} {r['mean_us']:.1f} us grid {r['grid']} "
                      f"block {r['block']} smem {r['smem']} regs {r['regs']} {r['kernel'][:120]}",
                      flush=True)
    dest = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
    with open(os.path.join(dest, args.json), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "kernels": rows}, f, indent=1)


if __name__ == "__main__":
    main()
