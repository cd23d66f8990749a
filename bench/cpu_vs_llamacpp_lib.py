"""Helpers for cpu_vs_llamacpp.py: the prompts, one runner per engine (prefill, batch-1 decode,
16-request throughput) and the peak-RSS child (`--rss-only ENGINE`), which loads one engine in a
process of its own, runs the workload once and prints one JSON line."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

TEXT = ("The history of the city begins with a small settlement on the river, where traders "
        "met to exchange grain, salt and cloth. Over the centuries it grew into a market town, "
        "then a regional capital, and finally one of the great cities of the continent. ")


def make_prompt(tokenize, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenize(TEXT)
    return ids[:n]


def throughput_prompts(tokenize, num: int, length: int, stride: int = 3) -> list[list[int]]:
    """`num` distinct prompts of `length` tokens: windows of the repeated TEXT at offsets
    0, stride, 2*stride, ... (TEXT is ~52 tokens, so 16 offsets of 3 stay within one period)."""
    stream = make_prompt(tokenize, length + stride * num)
    prompts = [stream[i * stride:i * stride + length] for i in range(num)]
    if len({tuple(p) for p in prompts}) != num:
        raise ValueError("throughput prompts are not distinct; change the stride")
    return prompts


class VllmxRunner:
    name = "vllmx"

    def __init__(self, model: str, threads: int):
        from vllmx import LLM, SamplingParams

        # No prefix caching: every timed prefill must compute the whole prompt.
        self.llm = LLM(model, max_model_len=1024, num_threads=threads, enable_prefix_caching=False)
        self.sp = SamplingParams

    def tokenize(self, s: str) -> list[int]:
        return self.llm.get_tokenizer().encode(s, add_special_tokens=False)

    def prefill(self, ids: list[int]) -> float:
        t = time.perf_counter()
        self.llm.generate([{"prompt_token_ids": ids}],
                          self.sp(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t

    def decode(self, ids: list[int], n: int) -> float:
        """Seconds for n decode steps (total minus the prefill that produced the first token)."""
        engine = self.llm.llm_engine
        engine.add_request("bench", {"prompt_token_ids": ids},
                           self.sp(temperature=0, max_tokens=n + 1, ignore_eos=True))
        engine.step()  # prefill + first token
        t = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        return time.perf_counter() - t

    def throughput(self, prompts: list[list[int]], n: int) -> float:
        """Seconds to produce n new tokens for every prompt, all submitted at once (batched)."""
        t = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                 self.sp(temperature=0, max_tokens=n, ignore_eos=True),
                                 use_tqdm=False)
        dt = time.perf_counter() - t
        if any(len(o.outputs[0].token_ids) != n for o in outs):
            raise RuntimeError("vllmx returned fewer tokens than asked for")
        return dt


class LlamaCppRunner:
    name = "llama.cpp"

    def __init__(self, model: str, threads: int):
        import llama_cpp

        self.llm = llama_cpp.Llama(model, n_ctx=1024, n_batch=512, n_threads=threads,
                                   n_threads_batch=threads, flash_attn=True, verbose=False)

    def tokenize(self, s: str) -> list[int]:
        return self.llm.tokenize(s.encode(), add_bos=False)

    def prefill(self, ids: list[int]) -> float:
        self.llm.reset()
        t = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - t

    def decode(self, ids: list[int], n: int) -> float:
        self.llm.reset()
        self.llm.eval(ids)
        tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
        t = time.perf_counter()
        for _ in range(n):
            self.llm.eval([tok])
            tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
        return time.perf_counter() - t

    def throughput(self, prompts: list[list[int]], n: int) -> float:
        """Seconds to produce n new tokens for every prompt, one request after another: the
        prompt's eval gives the first token, n - 1 eval steps give the rest."""
        t = time.perf_counter()
        for p in prompts:
            self.llm.reset()
            self.llm.eval(p)
            tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
            for _ in range(n - 1):
                self.llm.eval([tok])
                tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
        return time.perf_counter() - t


RUNNERS = {r.name: r for r in (VllmxRunner, LlamaCppRunner)}


def run_workload(r, ids: list[int], decode_len: int, prompts: list[list[int]], new_tokens: int):
    """The workload both the timed loop and the RSS child run: prefill, decode, throughput."""
    return r.prefill(ids), r.decode(ids[:16], decode_len), r.throughput(prompts, new_tokens)


def rss_child(engine: str, model: str, threads: int, prompt_len: int, decode_len: int,
              num_requests: int, new_tokens: int, request_len: int) -> None:
    """Entry point of `--rss-only ENGINE`: load only that engine, run the workload once, print
    {"engine", "maxrss_kib"} as one JSON line (ru_maxrss is KiB on Linux)."""
    if model is None or not os.path.isfile(model):  # an alias: resolve it (imports vllmx)
        from vllmx.loader.model_source import DEFAULT_MODEL, resolve_model
        model = resolve_model(model or DEFAULT_MODEL)
    r = RUNNERS[engine](model, threads)
    ids = make_prompt(r.tokenize, prompt_len)
    run_workload(r, ids, decode_len, throughput_prompts(r.tokenize, num_requests, request_len),
                 new_tokens)
    print(json.dumps({"engine": engine,
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "vm_hwm_kib": _vm_hwm_kib()}))


def _vm_hwm_kib() -> int | None:
    """VmHWM (this address space's peak RSS since exec), a cross-check of ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def measure_rss(script: str, engine: str, model: str, threads: int, extra: list[str]) -> dict:
    """Run `script --rss-only ENGINE` in a fresh process; return its JSON line (KiB)."""
    cmd = [sys.executable, script, "--rss-only", engine, "--model", model,
           "--threads", str(threads), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def git_commit() -> str:
    """The checkout's commit, `-dirty` where tracked files outside bench/results differ from it:
    a run that wrote an earlier report there (a GPU call's copy of the tree runs several) is
    still the commit's code. "unknown" outside a git checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True,
                              text=True, cwd=here, check=True).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":/",
             ":(exclude,top)bench/results"],
            capture_output=True, text=True, cwd=here, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")


def write_result(name: str, result: dict, indent: int = 1) -> str:
    """bench/results/<name> <- result as JSON; prints and returns the path."""
    dest = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "w") as f:
        json.dump(result, f, indent=indent)
    print("wrote", dest)
    return dest


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
