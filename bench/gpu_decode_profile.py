"""Where a batch-1 decode step's GPU time goes: each kernel of the step's CUDA graph, timed by
the CUDA profiler (CUPTI through torch.profiler, which records every kernel of the process,
vllmx's included), and the gaps between them.

Random bf16 models of the benchmark's shapes (bench/gpu_vs_vllm.py's, the MoE one too) with
fewer layers (per-layer kernels are the same at any depth; weights made by the engine,
load_format="dummy"): the graph of a decode bucket is replayed at a
1088-token context and the trace's kernels are grouped by name. Also the engine's own decode
step (generate) against the graph replayed alone, i.e. the host's share.

    python bench/gpu_decode_profile.py --models qwen3-0.6b llama-3-8b --layers 28 8
    python bench/gpu_decode_profile.py --models llama-3-8b --layers 8 --batch 8 --prefill
    python bench/gpu_decode_profile.py --models qwen3-30b-a3b --layers 4 --batch 32
    python bench/gpu_decode_profile.py --models qwen3-0.6b --layers 28 --batch 32 --lora 4

--lora N: the same with N random rank-16 adapters on every projection (bench/lora_cpu.py's),
the rows cycling through them (issue 17's GPU measure, kernel by kernel).

--prefill also profiles the prompts' prefill (a 1-token generate of batch x context tokens,
eager) the same way. Kernels launched with programmatic dependent launch start before their
predecessor ends, so a kernel's traced time includes its wait: read the gaps and the span too.

--engine vllm profiles vLLM 0.26.0 (the gpu-peers bundle in --vllm-site) on the same config,
in a process of its own with its engine in that process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so
that the profiler sees its kernels: a decode step's kernels are those of a generate of 33
tokens less those of a 1-token one, over 32, grouped by name (count and time a step; vLLM's
steps are graphs and Triton kernels of its own, so no "adds" column). --random-weights: both
engines on the same random safetensors (random_checkpoint.py: a mixture of experts then reads
as many distinct experts in both), written before either runs.

    python bench/gpu_decode_profile.py --models qwen3.5-35b-a3b --layers 4 --batch 8 \
        --random-weights --engine vllmx vllm
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_vs_transformers import stage_decode
from gpu_vs_vllm import FP8_CONFIG, SHAPES, weight_bytes, write_config
from peer_process import engine_env, worker_result


def short(name: str) -> str:
    name = re.sub(r"<.*", "", name).replace("(anonymous namespace)", "anon")
    name = re.sub(r"\(.*", "", name)
    return name.split("::")[-1][:120]  # (cuBLAS names its tile, cluster and stages)


def trace_kernels(prof, out_dir: str) -> list[dict]:
    """The GPU events (kernels, copies, memsets) of a torch.profiler trace, in time order."""
    path = os.path.join(out_dir, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    os.remove(path)
    return sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                  key=lambda e: e["ts"])


def kernel_summary(prof, reps: int, layers: int, out_dir: str) -> dict:
    """The last of `reps` identical repetitions in a torch.profiler trace: its kernels grouped by
    name (count, time, gaps before them, and the time each adds to the step), printed and
    returned. A kernel launched with programmatic dependent launch starts while its
    predecessor runs and waits inside, so its traced time overstates it; what it adds, the
    time from the last end before it to its own end, is what to read (these add up to the
    span; a kernel that ends before its predecessor adds 0)."""
    kernels = trace_kernels(prof, out_dir)
    per_step = len(kernels) // reps
    step = kernels[-per_step:]  # the last repetition
    rows: dict[str, list] = {}
    busy = 0.0
    last_end = step[0]["ts"]
    for i, e in enumerate(step):
        gap = 0.0 if i == 0 else e["ts"] - (step[i - 1]["ts"] + step[i - 1]["dur"])
        end = e["ts"] + e["dur"]
        r = rows.setdefault(short(e["name"]), [0, 0.0, 0.0, 0.0])
        r[0] += 1
        r[1] += e["dur"]
        r[2] += gap
        r[3] += max(0.0, end - last_end)
        last_end = max(last_end, end)
        busy += e["dur"]
    span = step[-1]["ts"] + step[-1]["dur"] - step[0]["ts"]
    print(f"traced span {span / 1e3:.3f} ms, kernels busy {busy / 1e3:.3f} ms, "
          f"{per_step} kernels ({per_step / layers:.1f} per layer)")
    print(f"{'kernel':48s} {'n':>4s} {'us each':>8s} {'us total':>9s} {'gap before':>10s} "
          f"{'adds each':>9s}")
    for k, (c, d, g, a) in sorted(rows.items(), key=lambda kv: -kv[1][3]):
        print(f"{k:48s} {c:4d} {d / c:8.2f} {d:9.1f} {g / c:10.2f} {a / c:9.2f}")
    first = step[:per_step // layers + 2]
    print("first layer in order: " + ", ".join(f"{short(e['name'])} {e['dur']:.1f}"
                                                for e in first))
    return {"span_ms": span / 1e3, "busy_ms": busy / 1e3, "kernels": per_step,
            "by_kernel": {k: {"n": c, "us": d, "gap_us": g, "adds_us": a}
                          for k, (c, d, g, a) in rows.items()}}


def kernel_totals(prof, out_dir: str) -> dict[str, list]:
    """{kernel name: [count, us]} over a torch.profiler trace."""
    rows: dict[str, list] = {}
    for e in trace_kernels(prof, out_dir):
        r = rows.setdefault(short(e["name"]), [0, 0.0])
        r[0] += 1
        r[1] += e["dur"]
    return rows


def profile_vllm(path: str, layers: int, batches: list[int], ctx: int, load_format: str,
                 prefill: bool = False) -> dict:
    """vLLM's decode step at each batch size, kernel by kernel (--engine vllm; runs in vLLM's
    environment, one engine for every batch size); with `prefill` also the kernels of the
    prompts' prefill, i.e. of the 1-token generate."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # (the engine in this process)
    import numpy as np
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    llm = LLM(model=path, load_format=load_format, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=ctx + 256, max_num_seqs=max(*batches, 8),
              gpu_memory_utilization=0.5, seed=0,
              **({"limit_mm_per_prompt": {"image": 0, "video": 0}}
                 if "vision_config" in cfg else {}),
              additional_config={"gdn_prefill_backend": "triton"})  # (gpu_vs_vllm.py: why)
    vocab = (cfg.get("text_config") or cfg)["vocab_size"]
    rng = np.random.default_rng(0)
    report = {}
    for batch in batches:
        ps = [TokensPrompt(prompt_token_ids=rng.integers(3, vocab, ctx).tolist())
              for _ in range(batch)]

        def generate(n: int, ps=ps) -> float:
            llm.reset_prefix_cache()
            sp = SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True,
                                detokenize=False)
            t = time.perf_counter()
            llm.generate(ps, sp, use_tqdm=False)
            return time.perf_counter() - t

        for n in (1, 129, 1, 129):
            generate(n)
        times = {n: min(generate(n) for _ in range(2)) for n in (1, 129)}
        step_ms = (times[129] - times[1]) / 128 * 1e3
        totals = {}
        for n in (1, 33):
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                generate(n)
                torch.cuda.synchronize()
            totals[n] = kernel_totals(prof, path)
        rows = {k: [(c - totals[1].get(k, [0, 0.0])[0]) / 32,
                    (d - totals[1].get(k, [0, 0.0])[1]) / 32]
                for k, (c, d) in totals[33].items()}
        rows = {k: r for k, r in rows.items() if r[0] > 0.5}
        busy = sum(d for _, d in rows.values())
        print(f"\n== vLLM, {layers} layers, batch {batch}, context {ctx}: engine decode step "
              f"{step_ms:.3f} ms, kernels busy {busy / 1e3:.3f} ms a step, "
              f"{sum(c for c, _ in rows.values()):.0f} kernels")
        report[f"batch {batch}"] = {"engine_step_ms": step_ms, "busy_ms": busy / 1e3,
                                    "by_kernel": kernel_table(rows, "us a step")}
        if prefill:
            busy = sum(d for _, d in totals[1].values())
            print(f"\n== vLLM prefill of {batch} x {ctx} tokens: {times[1] * 1e3:.2f} ms "
                  f"({batch * ctx / times[1]:,.0f} tok/s, a 1-token generate), kernels busy "
                  f"{busy / 1e3:.3f} ms")
            report[f"batch {batch}"]["prefill"] = {
                "ms": times[1] * 1e3, "busy_ms": busy / 1e3,
                "by_kernel": kernel_table(totals[1], "us total")}
    return report


def kernel_table(rows: dict[str, list], label: str) -> dict:
    """Prints {kernel: [count, us]}, the most time first; returns them as a report's entries."""
    print(f"{'kernel':48s} {'n':>6s} {'us each':>8s} {label:>9s}")
    for k, (c, d) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:48s} {c:6.1f} {d / c:8.2f} {d:9.1f}")
    return {k: {"n": c, "us": d} for k, (c, d) in rows.items()}


def profile(name: str, layers: int, batch: int, ctx: int, out_dir: str,
            host_profile: bool = False, prefill: bool = False, lora: int = 0,
            load_format: str = "dummy", ssm_dtype: str = "float32") -> dict:
    import numpy as np
    import torch

    weight_total = weight_bytes(out_dir)
    vocab = SHAPES[name]["vocab_size"]

    from vllmx import _C, LLM, SamplingParams

    lora_kw, per_row = {}, None
    if lora:
        from lora_cpu import write_adapters

        from vllmx.lora.request import LoRARequest

        reqs = [LoRARequest(f"lora{a}", a + 1, p)
                for a, p in enumerate(write_adapters(out_dir, name, lora, 16, layers))]
        per_row = [reqs[i % lora] for i in range(batch)]
        lora_kw = {"enable_lora": True, "max_loras": lora, "max_lora_rank": 16}
    llm = LLM(out_dir, load_format=load_format, skip_tokenizer_init=True, device="cuda",
              max_model_len=ctx + 256, max_num_seqs=max(batch, 8), gpu_memory_utilization=0.5,
              mamba_ssm_cache_dtype=ssm_dtype, **lora_kw)
    rng = np.random.default_rng(0)
    ps = [{"prompt_token_ids": rng.integers(3, vocab, ctx).tolist()}
          for _ in range(batch)]
    generate = llm.generate
    if lora:  # every generate below with the rows' adapters
        def generate(prompts, sp):
            return llm.generate(prompts, sp, lora_request=per_row)
    p1 = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    pn = SamplingParams(temperature=0, max_tokens=129, min_tokens=129, ignore_eos=True)
    generate(ps, p1)
    times = []
    for sp in (p1, pn, p1, pn):
        llm.reset_prefix_cache()
        t = time.perf_counter()
        generate(ps, sp)
        times.append(time.perf_counter() - t)
    engine_step_ms = (min(times[1], times[3]) - min(times[0], times[2])) / 128 * 1e3
    if host_profile:  # where the host's share of a step goes (Python's own profiler)
        import cProfile
        import pstats

        llm.reset_prefix_cache()
        prof = cProfile.Profile()
        prof.runcall(generate, ps, pn)
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)

    runner = llm.llm_engine.model_runner
    graph = runner.decode_capture.steps[batch]
    stage_decode(runner, batch, ctx)
    if lora:  # the rows' slots, as the engine's steps set them
        llm.llm_engine.lora_manager.set_active_loras(
            np.array([r.lora_int_id for r in per_row], np.int32),
            {r.lora_int_id: r for r in per_row})
    for _ in range(5):
        graph.replay()
    _C.cuda_synchronize()
    n = 50
    t = time.perf_counter()
    for _ in range(n):
        graph.replay()
    _C.cuda_synchronize()
    graph_ms = (time.perf_counter() - t) / n * 1e3

    reps = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        _C.cuda_synchronize()
    print(f"\n== {name}, {layers} layers, batch {batch}, context {ctx}: "
          f"{weight_total / 1e9:.2f} GB of weights")
    print(f"engine decode step {engine_step_ms:.3f} ms; graph replay {graph_ms:.3f} ms")
    summary = kernel_summary(prof, reps, layers, out_dir)
    result = {"engine_step_ms": engine_step_ms, "graph_ms": graph_ms, **summary}
    if prefill:  # the prompts' prefill (max_tokens 1), eager: every kernel of reps identical runs
        prefill_ms = min(times[0], times[2]) * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                llm.reset_prefix_cache()
                generate(ps, p1)
            _C.cuda_synchronize()
        print(f"\n== prefill of {batch} x {ctx} tokens: {prefill_ms:.2f} ms "
              f"({batch * ctx / prefill_ms * 1e3:,.0f} tok/s, a 1-token generate)")
        result["prefill"] = {"ms": prefill_ms, **kernel_summary(prof, reps, layers, out_dir)}
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--layers", nargs="+", type=int, default=[28, 8])
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--context", type=int, default=1088)
    ap.add_argument("--host-profile", action="store_true", help="cProfile a generate call")
    ap.add_argument("--prefill", action="store_true",
                    help="also the kernels of the prompts' prefill (batch x context tokens)")
    ap.add_argument("--lora", type=int, default=0,
                    help="N random rank-16 adapters, the rows cycling through them")
    ap.add_argument("--engine", nargs="+", default=["vllmx"], choices=["vllmx", "vllm"])
    ap.add_argument("--random-weights", action="store_true",
                    help="both engines on the same random safetensors (random_checkpoint.py)")
    ap.add_argument("--vllm-site", default="/root/vllm-site")
    ap.add_argument("--mamba-ssm-cache-dtype", default="float32",
                    help="vllmx's hybrid recurrent states (auto: the activations' dtype)")
    ap.add_argument("--fp8", action="store_true",
                    help="the shapes as block-scaled fp8 checkpoints (gpu_vs_vllm.py --fp8)")
    ap.add_argument("--vllm-worker", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fmt = "auto" if args.random_weights else "dummy"
    if args.vllm_worker:
        res = profile_vllm(args.vllm_worker, args.layers[0], args.batch, args.context, fmt,
                           args.prefill)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    report = {}
    for name, layers in zip(args.models, args.layers):
        with tempfile.TemporaryDirectory() as d:
            write_config(name, d, num_hidden_layers=layers,
                         **({"quantization_config": FP8_CONFIG} if args.fp8 else {}))
            if args.random_weights:
                from random_checkpoint import write_random_weights

                print(f"wrote {write_random_weights(d):.1f} GB of random weights", flush=True)
            for engine in sorted(args.engine, key=lambda e: e != "vllm"):  # (vLLM's process
                # first: it checks that gpu_memory_utilization of the device is free)
                key = name if engine == "vllmx" else f"{name} (vLLM)"
                if engine == "vllmx":
                    report[key] = {f"batch {b}": profile(name, layers, b, args.context, d,
                                                         args.host_profile, args.prefill,
                                                         args.lora, fmt,
                                                         args.mamba_ssm_cache_dtype)
                                   for b in args.batch}
                    continue
                cmd = [sys.executable, os.path.abspath(__file__), "--vllm-worker", d,
                       "--layers", str(layers), "--batch", *map(str, args.batch), "--context",
                       str(args.context)] + (["--random-weights"] if args.random_weights else [])
                cmd += ["--prefill"] if args.prefill else []
                report[key] = worker_result(cmd, engine_env("vllm", args.vllm_site), 900)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_decode_profile.json"), "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
