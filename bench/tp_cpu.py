"""Tensor parallelism on the CPU against one rank, in one run on the same cores: tp=1 (its
decode steps replayed from tapes, and eager), tp=2 (one process a rank, each with half the
threads; steps run eagerly, collectives over shared memory). The model: a random-weight bf16
checkpoint of Qwen3-0.6B's shape (load_format="dummy"). Prefill tok/s (512-token prompt),
batch-1 decode tok/s (64 tokens), and output tok/s for 16 requests x 32 new tokens (32-token
prompts, batched). Prints the ratios to tp=1 and writes JSON under bench/results/.

    python bench/tp_cpu.py [--threads N] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from cpu_vs_llamacpp_lib import cpu_name, git_commit, write_result
from gpu_vs_vllm import write_config

CONFIGS = {"tp1": {"tensor_parallel_size": 1}, "tp1_eager": {"enforce_eager": True},
           "tp2": {"tensor_parallel_size": 2}}


def measure(llm, sp, prompt: list[int], decode_len: int, prompts: list[list[int]],
            new_tokens: int) -> dict:
    t = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], sp(temperature=0, max_tokens=1,
                                                   ignore_eos=True), use_tqdm=False)
    prefill = len(prompt) / (time.perf_counter() - t)
    engine = llm.llm_engine
    engine.add_request("decode", {"prompt_token_ids": prompt[:16]},
                       sp(temperature=0, max_tokens=decode_len + 1, ignore_eos=True))
    engine.step()
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    decode = decode_len / (time.perf_counter() - t)
    t = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts],
                 sp(temperature=0, max_tokens=new_tokens, ignore_eos=True), use_tqdm=False)
    batched = len(prompts) * new_tokens / (time.perf_counter() - t)
    return {"prefill_tok_s": prefill, "decode_tok_s": decode, "batched_tok_s": batched}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from vllmx import LLM, SamplingParams

    path = write_config("qwen3-0.6b", os.path.join(tempfile.mkdtemp(), "qwen3-0.6b"))
    prompt = [(7 * i) % 150000 + 10 for i in range(512)]
    prompts = [[(11 * i + 13 * j) % 150000 + 10 for i in range(32)] for j in range(16)]
    runs = {}
    for name, extra in CONFIGS.items():
        tp = extra.get("tensor_parallel_size", 1)
        llm = LLM(path, load_format="dummy", skip_tokenizer_init=True, max_model_len=1024,
                  enable_prefix_caching=False, num_threads=max(1, args.threads // tp), **extra)
        measure(llm, SamplingParams, prompt[:64], 4, prompts[:2], 2)  # warm-up
        reps = [measure(llm, SamplingParams, prompt, 64, prompts, 32)
                for _ in range(args.repeats)]
        runs[name] = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
        print(name, {k: round(v, 1) for k, v in runs[name].items()}, flush=True)
        del llm
    base = runs["tp1"]
    ratios = {name: {k: r[k] / base[k] for k in r} for name, r in runs.items()}
    for name, r in ratios.items():
        print(f"{name} / tp1: " + ", ".join(f"{k} {v:.2f}x" for k, v in r.items()))
    write_result("tp_cpu_qwen3-0.6b.json", {
        "what": __doc__.split("\n\n")[0], "cpu": cpu_name(), "threads": args.threads,
        "commit": git_commit(), "runs": runs, "ratios_to_tp1": ratios})


if __name__ == "__main__":
    main()
