"""vllmx's CPU step capture (decode steps replayed from a native op tape) against its own eager
steps (enforce_eager=True), same model and threads, alternating in one run: batch-1 decode tok/s
(128 tokens), output tok/s for 16 requests x 64 new tokens, and per decode step (batch 1 and
16) the time of the model forward alone and of the whole engine step. The eager forward minus
the replayed one is the Python (op dispatch, numpy allocation) that capture takes out. Writes
JSON under bench/results/.

    python bench/cpu_step_capture.py [--model PATH_OR_ALIAS] [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from cpu_vs_llamacpp_lib import (
    VllmxRunner,
    cpu_name,
    git_commit,
    make_prompt,
    throughput_prompts,
    write_result,
)


class Runner(VllmxRunner):
    def __init__(self, model: str, threads: int, enforce_eager: bool):
        from vllmx import LLM, SamplingParams

        self.name = "eager" if enforce_eager else "capture"
        self.llm = LLM(model, max_model_len=1024, num_threads=threads,
                       enable_prefix_caching=False, enforce_eager=enforce_eager)
        self.sp = SamplingParams

    def step_times(self, prompts: list[list[int]], reps: int = 30) -> tuple[float, float]:
        """Median seconds of (the model forward, a whole engine step) for a decode batch of
        len(prompts) requests."""
        engine = self.llm.llm_engine
        runner = engine.model_runner
        for i, p in enumerate(prompts):
            engine.add_request(f"s{i}", {"prompt_token_ids": p},
                               self.sp(temperature=0, max_tokens=reps + 5, ignore_eos=True))
        for _ in range(3):  # prefills, then decode steps (the capture happens here)
            engine.step()
        nb = len(prompts)
        fwd, step = [], []
        for _ in range(reps):
            t = time.perf_counter()
            runner._forward(nb, nb, True)  # the last step's inputs again (same KV slots)
            fwd.append(time.perf_counter() - t)
            t = time.perf_counter()
            engine.step()
            step.append(time.perf_counter() - t)
        while engine.has_unfinished_requests():
            engine.step()
        return statistics.median(fwd), statistics.median(step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    from vllmx.loader.model_source import fetch_builtin

    model = args.model if os.path.exists(args.model) else fetch_builtin(args.model)
    runners = [Runner(model, args.threads, eager) for eager in (True, False)]
    tok = runners[0].tokenize
    prompt = make_prompt(tok, 32)
    prompts = throughput_prompts(tok, 16, 32)
    res: dict[str, dict[str, list[float]]] = {r.name: {} for r in runners}
    for r in runners:  # warm-up: every bucket the workload uses is captured here
        r.decode(prompt, 8)
        r.throughput(prompts, 8)
    for rep in range(args.repeats):
        for r in runners if rep % 2 == 0 else runners[::-1]:
            d = res[r.name]
            d.setdefault("decode_tok_s", []).append(128 / r.decode(prompt, 128))
            d.setdefault("throughput_tok_s", []).append(16 * 64 / r.throughput(prompts, 64))
            for b in (1, 16):
                f, s = r.step_times(prompts[:b])
                d.setdefault(f"forward_ms_b{b}", []).append(f * 1e3)
                d.setdefault(f"step_ms_b{b}", []).append(s * 1e3)
    print(f"model {os.path.basename(model)}, threads {args.threads}, medians of {args.repeats}")
    keys = list(res["eager"])
    print(f"{'':18}" + "".join(f"{k:>18}" for k in keys))
    for name, d in res.items():
        print(f"{name:18}" + "".join(f"{statistics.median(d[k]):18.2f}" for k in keys))
    e, c = res["eager"], res["capture"]
    print(f"{'capture / eager':18}" + "".join(
        f"{statistics.median(c[k]) / statistics.median(e[k]):18.3f}" for k in keys))
    medians = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
    out = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                       "python": platform.python_version()},
           "commit": git_commit(), "model": os.path.basename(model), "threads": args.threads,
           "repeats": args.repeats, "medians": medians, "runs": res}
    write_result(f"cpu_step_capture_{os.path.basename(model)}_t{args.threads}.json", out)


if __name__ == "__main__":
    main()
