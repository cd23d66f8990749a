"""vllmx against llama.cpp on the GPU, on the same GGUF files, in one run (issue 20's benchmark).

Per model shape: a random-weight checkpoint of the real shape (f16 shards written from a
random pool, with the byte-level BPE vocabulary gpu_vs_vllm.py's serving run writes, so that
llama.cpp loads the file), turned into an F16 GGUF by `vllmx quantize`, then into each quant
type by llama.cpp's own `llama-quantize` (so Q4_K_M and IQ4_XS are llama.cpp's mixes: the
output and some attention / FFN tensors in other types, as in the files people download).
Both engines then run the same file: llama.cpp with `llama-batched-bench` (every layer on the
GPU, flash attention on, its default batch sizes), vllmx through `LLM.generate` with token-id
prompts, greedy, EOS ignored (gpu_vs_vllm.measure). Per batch size:

  prefill tok/s = batch * input_len / (time to process the prompts)
  decode tok/s  = batch * output_len / (time of the generation steps)
  total tok/s   = batch * (input_len + output_len) / (both)

which are llama-batched-bench's S_PP, S_TG and S columns. Batch-1 decode is also given against
the bandwidth limit: the bytes of the file's tensors a decode step reads (every tensor except
the token embedding, of which it reads one row) over the measured device copy bandwidth.

llama.cpp comes from ../shared/gpu-peers (build_llamacpp_cuda.sh with the targets
llama-batched-bench and llama-quantize), or binaries built elsewhere (--llama-bin).

    python bench/gpu_vs_llamacpp.py --llama-bin /root/llama.cpp-cuda/build/bin
    python bench/gpu_vs_llamacpp.py --models qwen3-0.6b --types Q4_0 Q4_K_M --batches 1,8,32

Files are kept in --workdir between runs (the checkpoint and F16 GGUF of the Llama-3-8B shape
take 32 GB; each run rewrites only what is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_vs_transformers import copy_bandwidth
from gpu_vs_vllm import SHAPES, git_commit, measure, save, write_config, write_tokenizer

TYPES = ["Q4_0", "Q8_0", "Q4_K_M", "Q6_K", "IQ4_XS"]
DENSE = ["qwen3-0.6b", "llama-3-8b"]


def write_random_checkpoint(path: str, seed: int = 0) -> None:
    """f16 shards (one per layer) of the config's tensors, each a strided window of one random
    pool (rows shifted by a prime step: every quant block differs, no 8-GB draw of normals)."""
    import numpy as np
    from safetensors.numpy import save_file

    from vllmx.models.registry import get_model_class

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    shapes = get_model_class(cfg).checkpoint_shapes(cfg)
    pool = (np.random.default_rng(seed).standard_normal(1 << 24) * 0.02).astype(np.float16)
    shards: dict[str, dict] = {}
    for i, (name, shape) in enumerate(shapes.items()):
        rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], int(np.prod(shape[1:])))
        step = 13 if (rows - 1) * 13 + cols < pool.size else 1
        off = (i * 7919) % (pool.size - (rows - 1) * step - cols + 1)
        view = np.lib.stride_tricks.as_strided(pool[off:], (rows, cols), (2 * step, 2))
        layer = name.split(".layers.")[1].split(".")[0] if ".layers." in name else "rest"
        shards.setdefault(layer, {})[name] = np.ascontiguousarray(view).reshape(shape)
    for layer, tensors in shards.items():
        save_file(tensors, os.path.join(path, f"model-{layer}.safetensors"))


def base_gguf(name: str, workdir: str) -> str:
    """The F16 GGUF of shape `name` (written once per workdir)."""
    from vllmx.cli.quantize import quantize_model

    out = os.path.join(workdir, f"{name}-F16.gguf")
    if os.path.exists(out):
        return out
    t0 = time.perf_counter()
    ckpt = write_config(name, os.path.join(workdir, name))
    write_tokenizer(ckpt, SHAPES[name]["vocab_size"])
    write_random_checkpoint(ckpt)
    quantize_model(ckpt, out, "F16")
    for f in os.listdir(ckpt):  # the GGUF holds it all now
        if f.endswith(".safetensors"):
            os.remove(os.path.join(ckpt, f))
    print(f"  {out}: {os.path.getsize(out) / 1e9:.1f} GB in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return out


def typed_gguf(base: str, qtype: str, bin_dir: str) -> str:
    out = base.replace("-F16.gguf", f"-{qtype}.gguf")
    if not os.path.exists(out):
        t0 = time.perf_counter()
        subprocess.run([os.path.join(bin_dir, "llama-quantize"), base, out + ".part", qtype,
                        str(os.cpu_count())], check=True, capture_output=True)
        os.replace(out + ".part", out)
        print(f"  {out}: {os.path.getsize(out) / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s",
              flush=True)
    return out


def decode_bytes(path: str) -> tuple[int, dict[str, int]]:
    """Bytes a decode step streams (all tensors but token_embd) and the tensor count per type."""
    import gguf

    r = gguf.GGUFReader(path)
    total, types = 0, {}
    for t in r.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        if not t.name.startswith("token_embd"):
            total += int(t.n_bytes)
    return total, types


def run_llamacpp(path: str, bin_dir: str, inp: int, out: int, batches: list[int]) -> dict:
    cmd = [os.path.join(bin_dir, "llama-batched-bench"), "-m", path, "-ngl", "99", "-fa", "on",
           "-c", str(max(batches) * (inp + out) + 256), "-npp", str(inp), "-ntg", str(out),
           "-npl", ",".join(map(str, batches)), "--output-format", "jsonl"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    rows = [json.loads(line) for line in proc.stdout.splitlines() + proc.stderr.splitlines()
            if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        return {"error": (proc.stderr or proc.stdout)[-2000:]}
    return {"runs": {f"{inp}:{out}:{r['pl']}": {
        "prefill_tok_s": r["speed_pp"], "decode_tok_s": r["speed_tg"], "total_tok_s": r["speed"],
        "prefill_s": r["t_pp"], "total_s": r["t"]} for r in rows}}


def vllmx_worker(path: str, inp: int, out: int, batches: list[int], vocab: int) -> dict:
    from vllmx import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(path, skip_tokenizer_init=True, device="cuda", max_model_len=inp + out + 64,
              max_num_seqs=256, gpu_memory_utilization=0.9)
    load_s = time.perf_counter() - t0

    def generate(ps, new):
        sp = SamplingParams(temperature=0, max_tokens=new, min_tokens=new, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == new for o in outs)

    return {"load_s": load_s,
            "runs": measure(generate, llm.reset_prefix_cache, [(inp, out, batches)], vocab)}


def run_vllmx(path: str, inp: int, out: int, batches: list[int], vocab: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--input", str(inp),
           "--output", str(out), "--batches", ",".join(map(str, batches)), "--vocab", str(vocab)]
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 900 s"}
    sys.stdout.write(proc.stdout[-2000:])
    res = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not res:
        return {"error": proc.stderr[-2000:]}
    return json.loads(res[-1][len("RESULT "):])


def print_table(report: dict) -> None:
    print(f"\n{report['device']}, copy bandwidth {report['copy_bandwidth_tb_s']:.2f} TB/s, "
          f"commit {report['commit']}")
    print("| model | type | batch | decode tok/s vllmx / llama.cpp (x) | total tok/s (x) "
          "| prefill tok/s (x) |\n|---|---|---|---|---|---|")
    for key, e in report["files"].items():
        a, b = e.get("vllmx", {}).get("runs"), e.get("llamacpp", {}).get("runs")
        if not a or not b:
            print(f"| {key} | no run: {'vllmx' if not a else 'llama.cpp'} |")
            continue
        for run, x in a.items():
            y = b.get(run)
            if y is None:
                continue
            cells = [f"{x[k]:,.0f} / {y[k]:,.0f} ({x[k] / y[k]:.2f}x)"
                     for k in ("decode_tok_s", "total_tok_s", "prefill_tok_s")]
            print(f"| {e['model']} | {e['type']} | {run.split(':')[2]} | " + " | ".join(cells)
                  + " |")
        one = next((k for k in a if k.endswith(":1")), None)
        if one and one in b:
            limit = e["bandwidth_limit_tok_s"]
            print(f"  {key}: batch-1 decode {a[one]['decode_tok_s']:.0f} tok/s = "
                  f"{a[one]['decode_tok_s'] / limit:.0%} of the bandwidth limit {limit:.0f} "
                  f"(llama.cpp {b[one]['decode_tok_s'] / limit:.0%})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=DENSE, choices=DENSE)
    ap.add_argument("--types", nargs="+", default=TYPES, help="llama-quantize type names")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--input", type=int, default=1024)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--engines", nargs="+", default=["vllmx", "llamacpp"],
                    choices=["vllmx", "llamacpp"])
    ap.add_argument("--llama-bin", default="/root/llama.cpp-cuda/build/bin")
    ap.add_argument("--workdir", default="/root/gguf-bench")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.worker:
        res = vllmx_worker(args.worker, args.input, args.output, batches, args.vocab)
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    import torch

    bw = copy_bandwidth()
    torch.cuda.empty_cache()
    report = {"device": torch.cuda.get_device_name(), "copy_bandwidth_tb_s": bw / 1e12,
              "commit": git_commit(), "llama_bin": args.llama_bin, "files": {}}
    print(f"device copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    for name in args.models:
        print(f"== {name}", flush=True)
        base = base_gguf(name, args.workdir)
        vocab = SHAPES[name]["vocab_size"]
        for qtype in args.types:
            path = typed_gguf(base, qtype, args.llama_bin)
            nbytes, types = decode_bytes(path)
            entry = report["files"][f"{name}-{qtype}"] = {
                "model": name, "type": qtype, "file_gb": os.path.getsize(path) / 1e9,
                "tensor_types": types, "decode_gb": nbytes / 1e9,
                "bandwidth_limit_tok_s": bw / nbytes}
            for engine in args.engines:
                print(f"-- {name} {qtype} {engine}", flush=True)
                entry[engine] = (run_vllmx(path, args.input, args.output, batches, vocab)
                                 if engine == "vllmx" else
                                 run_llamacpp(path, args.llama_bin, args.input, args.output,
                                              batches))
                if "error" in entry[engine]:
                    print(f"  {engine} failed: {entry[engine]['error'][-800:]}", flush=True)
                save(report, "gpu_vs_llamacpp.partial.json")
    print_table(report)
    failed = any("error" in e.get(k, {}) for e in report["files"].values()
                 for k in ("vllmx", "llamacpp"))
    save(report, "gpu_vs_llamacpp.failed.json" if failed else "gpu_vs_llamacpp.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
