"""vllmx on the GPU against transformers (generate, sdpa) on the same GPU, in one run.

Random-weight bf16 models of real shapes (Qwen3-0.6B, Llama-3-8B) are made with transformers'
config classes on the GPU and saved as safetensors; transformers runs them from memory, vllmx
(in a subprocess, so each engine's peak memory is its own) from the saved files. Workload:
`--input-len` random prompt tokens and `--output-len` generated tokens (EOS ignored) for each
batch size. Per engine and batch:

  prefill tok/s = batch * input_len / (time of a generate with 1 new token)
  total tok/s   = batch * (input_len + output_len) / (time of the full generate)
  decode tok/s  = batch * output_len / (full time - prefill time)

plus peak GPU memory (transformers: torch.cuda.max_memory_allocated; vllmx: device memory in
use, KV cache included, which vLLM sizes by gpu_memory_utilization) and, at batch 1, decode as a
fraction of the bandwidth limit (weight bytes / measured device copy bandwidth).

    python bench/gpu_vs_transformers.py                       # both models, batches 1 8 32
    python bench/gpu_vs_transformers.py --models qwen3-0.6b --batches 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = {
    "qwen3-0.6b": dict(arch="Qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960),
    "llama-3-8b": dict(arch="Llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, tie_word_embeddings=False, max_position_embeddings=8192,
                       rope_theta=500000.0),
}


def make_model(name: str, out_dir: str):
    import torch
    import transformers

    spec = dict(SHAPES[name])
    arch = spec.pop("arch")
    cfg = getattr(transformers, f"{arch}Config")(**spec, bos_token_id=1, eos_token_id=2,
                                                  torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    t0 = time.perf_counter()
    model.save_pretrained(out_dir)
    print(f"  saved {name} to {out_dir} in {time.perf_counter() - t0:.1f}s", flush=True)
    return model


def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    import torch

    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 10
    for _ in range(n):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * a.numel() * n / (time.perf_counter() - t0)


def prompts(batch: int, input_len: int, vocab: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed + batch)
    return rng.integers(3, vocab, size=(batch, input_len)).tolist()


def bench_transformers(model, batches, input_len, output_len):
    import torch

    vocab = model.config.vocab_size
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    def run(ids, new):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False)
        torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + new
        return time.perf_counter() - t0

    results = {}
    for b in batches:
        ids = torch.tensor(prompts(b, input_len, vocab), device="cuda")
        run(ids[:, :64], 4)  # warm-up
        torch.cuda.reset_peak_memory_stats()
        t_prefill = min(run(ids, 1) for _ in range(2))
        t_total = run(ids, output_len)
        results[b] = summarize(b, input_len, output_len, t_prefill, t_total,
                               torch.cuda.max_memory_allocated())
        print(f"  transformers batch {b}: {results[b]}", flush=True)
    return results


def summarize(b, input_len, output_len, t_prefill, t_total, peak):
    return {"prefill_tok_s": b * input_len / t_prefill,
            "total_tok_s": b * (input_len + output_len) / t_total,
            "decode_tok_s": b * output_len / max(t_total - t_prefill, 1e-9),
            "prefill_s": t_prefill, "total_s": t_total, "peak_gib": peak / 2**30}


def stage_decode(runner, b: int, ctx: int) -> None:
    """Puts a decode step of b sequences at context ctx in the runner's device inputs (cache
    reads over arbitrary blocks, KV writes skipped, random token ids), for replaying bucket b's
    graph alone."""
    import numpy as np

    nblk = -(-ctx // runner.block_size)
    # Distinct tokens, as a real batch has: one id for all rows would route every row of a
    # mixture of experts to the same k experts and time a step that reads 8 of them, where
    # the engine's batch-32 steps read most of the 128 (measured: 0.74 vs 1.98 ms, 4 layers).
    runner.input_ids[:b] = np.random.default_rng(b).integers(3, 1000, b)
    runner.positions[:b] = ctx - 1
    runner.slot_mapping[:b] = -1
    runner.seq_lens[:b] = ctx
    runner.query_start_loc[:b + 1] = np.arange(b + 1)
    runner.block_table[:b, :nblk] = np.arange(b * nblk).reshape(b, nblk)
    runner._inputs(b, b, max_query_len=1)


def vllmx_worker(path, batches, input_len, output_len, vocab) -> dict:
    """Runs in its own process: vllmx on the saved checkpoint."""
    import logging

    from vllmx import LLM, SamplingParams, _C

    logging.basicConfig(level=logging.INFO, format="%(message)s")

    t0 = time.perf_counter()
    llm = LLM(path, skip_tokenizer_init=True, device="cuda", max_model_len=input_len + output_len
              + 64, max_num_seqs=max(batches))
    load_s = time.perf_counter() - t0
    free, total = _C.cuda_mem_get_info()

    def run(ps, new):
        params = SamplingParams(temperature=0, max_tokens=new, min_tokens=new, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], params)
        dt = time.perf_counter() - t
        assert all(len(o.outputs[0].token_ids) == new for o in outs)
        return dt

    results = {"load_s": load_s}
    for b in batches:
        ps = prompts(b, input_len, vocab)
        run([p[:64] for p in ps], 4)  # warm-up

        def fresh(new):  # no prefix-cache hits from the previous run of the same prompts
            llm.reset_prefix_cache()
            return run(ps, new)

        t_prefill = min(fresh(1) for _ in range(2))
        t_total = fresh(output_len)
        llm.reset_prefix_cache()
        results[b] = summarize(b, input_len, output_len, t_prefill, t_total, total - free)
        # The GPU time of one decode step (its CUDA graph replayed alone): the rest of a step's
        # time is the host (scheduler, input copy, sampler, outputs).
        runner = llm.llm_engine.model_runner
        graph = runner.decode_capture.steps.get(b)
        if graph is not None:
            # Restage a decode step at mid-generation context: the last real step may have
            # been another bucket's layout.
            stage_decode(runner, b, input_len + output_len // 2)
            _C.cuda_synchronize()
            t = time.perf_counter()
            for _ in range(20):
                graph.replay()
            _C.cuda_synchronize()
            results[b]["graph_step_ms"] = (time.perf_counter() - t) / 20 * 1e3
            results[b]["step_ms"] = 1e3 * b / results[b]["decode_tok_s"]
        print(f"  vllmx batch {b}: {results[b]}", flush=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--workdir", default="/tmp/vllmx-gpu-bench")
    ap.add_argument("--vllmx-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllmx_worker:
        res = vllmx_worker(args.vllmx_worker, args.batches, args.input_len, args.output_len,
                           args.vocab)
        print("RESULT " + json.dumps(res))
        return 0

    import torch

    bw = copy_bandwidth()
    print(f"device copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    report = {"device": torch.cuda.get_device_name(), "copy_bandwidth_tb_s": bw / 1e12,
              "input_len": args.input_len, "output_len": args.output_len, "models": {}}
    for name in args.models:
        print(f"== {name}", flush=True)
        path = os.path.join(args.workdir, name)
        model = make_model(name, path)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        vocab = model.config.vocab_size
        hf = bench_transformers(model, args.batches, args.input_len, args.output_len)
        del model
        torch.cuda.empty_cache()
        cmd = [sys.executable, __file__, "--vllmx-worker", path, "--vocab", str(vocab),
               "--input-len", str(args.input_len), "--output-len", str(args.output_len),
               "--batches", *map(str, args.batches)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(proc.stdout[-4000:])
        if proc.returncode != 0:
            sys.stdout.write(proc.stderr[-6000:])
            report["models"][name] = {"error": proc.stderr[-2000:]}
            continue
        sys.stdout.write("\n".join(l for l in proc.stderr.splitlines() if "CUDA" in l) + "\n")
        vx = json.loads(proc.stdout.split("RESULT ", 1)[1])
        rows = {}
        for b in args.batches:
            v, h = vx[str(b)], hf[b]
            rows[b] = {"vllmx": v, "transformers": h,
                       "ratio": {k: v[k] / h[k] for k in ("total_tok_s", "decode_tok_s",
                                                          "prefill_tok_s")}}
        limit = bw / weight_bytes
        report["models"][name] = {"weight_gb": weight_bytes / 1e9, "bandwidth_limit_tok_s": limit,
                                  "vllmx_load_s": vx["load_s"], "batches": rows}
        if 1 in rows:
            report["models"][name]["batch1_decode_fraction_of_limit"] = (
                rows[1]["vllmx"]["decode_tok_s"] / limit)
    print_table(report)
    out = json.dumps(report, indent=1)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(here, exist_ok=True)
    # A failed run keeps its report apart: it must not replace the last good results.
    failed = any("error" in m for m in report["models"].values())
    name = "gpu_vs_transformers.failed.json" if failed else "gpu_vs_transformers.json"
    for d in (here, os.environ.get("OUT")):
        if d:
            with open(os.path.join(d, name), "w") as f:
                f.write(out)
    return 1 if failed else 0


def print_table(report) -> None:
    print(f"\n{report['device']}, copy bandwidth {report['copy_bandwidth_tb_s']:.2f} TB/s, "
          f"{report['input_len']} in / {report['output_len']} out")
    print("| model | batch | total tok/s vllmx / hf (x) | decode tok/s (x) | prefill tok/s (x) "
          "| peak GiB vllmx / hf |")
    print("|---|---|---|---|---|---|")
    for name, m in report["models"].items():
        if "error" in m:
            print(f"| {name} | error | | | | |")
            continue
        for b, r in m["batches"].items():
            v, h, x = r["vllmx"], r["transformers"], r["ratio"]
            print(f"| {name} | {b} | {v['total_tok_s']:,.0f} / {h['total_tok_s']:,.0f} "
                  f"({x['total_tok_s']:.2f}x) | {v['decode_tok_s']:,.0f} / "
                  f"{h['decode_tok_s']:,.0f} ({x['decode_tok_s']:.2f}x) | "
                  f"{v['prefill_tok_s']:,.0f} / {h['prefill_tok_s']:,.0f} "
                  f"({x['prefill_tok_s']:.2f}x) | {v['peak_gib']:.1f} / {h['peak_gib']:.1f} |")
        if "batch1_decode_fraction_of_limit" in m:
            print(f"  {name}: batch-1 decode {m['batches'][1]['vllmx']['decode_tok_s']:.0f} tok/s "
                  f"= {100 * m['batch1_decode_fraction_of_limit']:.0f}% of the bandwidth limit "
                  f"{m['bandwidth_limit_tok_s']:.0f} tok/s ({m['weight_gb']:.2f} GB of weights)")


if __name__ == "__main__":
    sys.exit(main())
