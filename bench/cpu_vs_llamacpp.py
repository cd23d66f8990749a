"""vllmx vs llama.cpp (llama-cpp-python) on the same GGUF with the same threads, in one run,
alternating engines: prefill tok/s (512-token prompt) and batch-1 decode tok/s (128 tokens).
Prints the ratios and writes JSON under bench/results/.

    python bench/cpu_vs_llamacpp.py [--model PATH_OR_ALIAS] [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
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


class VllmxRunner:
    name = "vllmx"

    def __init__(self, model: str, threads: int):
        from vllmx import LLM, SamplingParams

        # No prefix caching: every timed prefill must compute the whole prompt.
        self.llm = LLM(model, max_model_len=1024, num_threads=threads, enable_prefix_caching=False)
        self.sp = SamplingParams

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


class LlamaCppRunner:
    name = "llama.cpp"

    def __init__(self, model: str, threads: int):
        import llama_cpp

        self.llm = llama_cpp.Llama(model, n_ctx=1024, n_batch=512, n_threads=threads,
                                   n_threads_batch=threads, flash_attn=True, verbose=False)

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


def main() -> None:
    import llama_cpp

    from vllmx import __version__
    from vllmx.loader.model_source import DEFAULT_MODEL, resolve_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-len", type=int, default=128)
    args = ap.parse_args()
    path = resolve_model(args.model)

    runners = [VllmxRunner(path, args.threads), LlamaCppRunner(path, args.threads)]
    ids = make_prompt(lambda s: runners[1].llm.tokenize(s.encode(), add_bos=False), args.prompt_len)
    short = ids[:16]
    for r in runners:  # warm-up
        r.prefill(ids)
        r.decode(short, 8)
    times = {r.name: {"prefill": [], "decode": []} for r in runners}
    for _ in range(args.repeats):  # alternate engines so that drift hits both
        for r in runners:
            times[r.name]["prefill"].append(r.prefill(ids))
            times[r.name]["decode"].append(r.decode(short, args.decode_len))
    result = {}
    for name, t in times.items():
        result[name] = {
            "prefill_tok_s": args.prompt_len / statistics.median(t["prefill"]),
            "decode_tok_s": args.decode_len / statistics.median(t["decode"]),
        }
    ratios = {k: result["vllmx"][k] / result["llama.cpp"][k] for k in result["vllmx"]}
    print(f"model {os.path.basename(path)}, {args.threads} threads, median of {args.repeats}")
    print(f"{'':10s} {'prefill tok/s':>14s} {'decode tok/s':>13s}")
    for name in ("vllmx", "llama.cpp"):
        print(f"{name:10s} {result[name]['prefill_tok_s']:14.1f} {result[name]['decode_tok_s']:13.1f}")
    print(f"{'ratio':10s} {ratios['prefill_tok_s']:13.2f}x {ratios['decode_tok_s']:12.2f}x")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    out = {
        "model": os.path.basename(path), "threads": args.threads, "repeats": args.repeats,
        "prompt_len": args.prompt_len, "decode_len": args.decode_len, "results": result,
        "ratios": ratios, "commit": commit, "vllmx": __version__,
        "llama_cpp_python": llama_cpp.__version__, "machine": platform.machine(),
        "cpu": _cpu_name(), "date": time.strftime("%Y-%m-%d"),
    }
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    dest = os.path.join(os.path.dirname(__file__), "results",
                        f"cpu_vs_llamacpp_{os.path.splitext(out['model'])[0]}.json")
    with open(dest, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {dest}")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
