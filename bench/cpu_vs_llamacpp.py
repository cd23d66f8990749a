"""vllmx vs llama.cpp (llama-cpp-python) on the same GGUF with the same threads, in one run,
alternating engines: prefill tok/s (512-token prompt), batch-1 decode tok/s (128 tokens) and
output tok/s for 16 requests x 64 new tokens (distinct ~32-token prompts; vllmx batched through
its engine, llama.cpp one request after another). Then the peak RSS of each engine, each measured
in a child process of its own that loads the model and runs the same workload once. Prints the
ratios and writes JSON under bench/results/.

    python bench/cpu_vs_llamacpp.py [--model PATH_OR_ALIAS] [--threads 2] [--repeats 5]
    python bench/cpu_vs_llamacpp.py --rss-only vllmx|llama.cpp --model PATH --threads N
        (the child: prints one JSON line {"engine", "maxrss_kib"})
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from cpu_vs_llamacpp_lib import (
    RUNNERS,
    LlamaCppRunner,
    VllmxRunner,
    cpu_name,
    git_commit,
    make_prompt,
    measure_rss,
    rss_child,
    run_workload,
    throughput_prompts,
    write_result,
)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF path or alias (default: vllmx's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--requests", type=int, default=16, help="throughput: number of requests")
    ap.add_argument("--request-len", type=int, default=32, help="throughput: prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=64, help="throughput: new tokens each")
    ap.add_argument("--rss-only", choices=sorted(RUNNERS), default=None,
                    help="child mode: load only this engine, run the workload once, print RSS")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.rss_only:  # keep the child free of the other engine's imports
        rss_child(args.rss_only, args.model, args.threads, args.prompt_len, args.decode_len,
                  args.requests, args.new_tokens, args.request_len)
        return

    import llama_cpp

    from vllmx import __version__
    from vllmx.loader.model_source import DEFAULT_MODEL, resolve_model

    path = resolve_model(args.model or DEFAULT_MODEL)
    # Peak RSS first, one fresh child per engine, while this process is still small: a child's
    # ru_maxrss starts from its parent's RSS at spawn (Linux carries the high-water mark
    # across fork and exec), so spawning after loading both models would report this process.
    extra = ["--prompt-len", str(args.prompt_len), "--decode-len", str(args.decode_len),
             "--requests", str(args.requests), "--request-len", str(args.request_len),
             "--new-tokens", str(args.new_tokens)]
    rss = {name: measure_rss(os.path.abspath(__file__), name, path, args.threads, extra)
           for name in ("vllmx", "llama.cpp")}

    runners = [VllmxRunner(path, args.threads), LlamaCppRunner(path, args.threads)]
    ids = make_prompt(runners[1].tokenize, args.prompt_len)
    prompts = throughput_prompts(runners[1].tokenize, args.requests, args.request_len)
    short = ids[:16]
    for r in runners:  # warm-up (the throughput one also covers vllmx's batch-16 decode steps)
        r.prefill(ids)
        r.decode(short, 8)
        r.throughput(prompts, 4)
    times = {r.name: {"prefill": [], "decode": [], "throughput": []} for r in runners}
    for _ in range(args.repeats):  # alternate engines so that drift hits both
        for r in runners:
            pre, dec, thr = run_workload(r, ids, args.decode_len, prompts, args.new_tokens)
            times[r.name]["prefill"].append(pre)
            times[r.name]["decode"].append(dec)
            times[r.name]["throughput"].append(thr)
    result = {}
    for name, t in times.items():
        result[name] = {
            "prefill_tok_s": args.prompt_len / statistics.median(t["prefill"]),
            "decode_tok_s": args.decode_len / statistics.median(t["decode"]),
            "throughput_tok_s": args.requests * args.new_tokens / statistics.median(t["throughput"]),
            "peak_rss_mib": rss[name]["maxrss_kib"] / 1024,
        }
    ratios = {k: result["vllmx"][k] / result["llama.cpp"][k] for k in result["vllmx"]}

    thr_col = f"{args.requests}x{args.new_tokens} tok/s"
    print(f"model {os.path.basename(path)}, {args.threads} threads, median of {args.repeats}")
    print(f"{'':10s} {'prefill tok/s':>14s} {'decode tok/s':>13s}")
    for name in ("vllmx", "llama.cpp"):
        print(f"{name:10s} {result[name]['prefill_tok_s']:14.1f} {result[name]['decode_tok_s']:13.1f}")
    print(f"{'ratio':10s} {ratios['prefill_tok_s']:13.2f}x {ratios['decode_tok_s']:12.2f}x")
    print(f"{'':10s} {thr_col:>14s} {'peak RSS MiB':>13s}")
    for name in ("vllmx", "llama.cpp"):
        res = result[name]
        print(f"{name:10s} {res['throughput_tok_s']:14.1f} {res['peak_rss_mib']:13.1f}")
    print(f"{'ratio':10s} {ratios['throughput_tok_s']:13.2f}x {ratios['peak_rss_mib']:12.2f}x")

    out = {
        "model": os.path.basename(path), "threads": args.threads, "repeats": args.repeats,
        "prompt_len": args.prompt_len, "decode_len": args.decode_len,
        "throughput_requests": args.requests, "throughput_prompt_len": args.request_len,
        "throughput_new_tokens": args.new_tokens, "results": result,
        "ratios": ratios, "rss_children_kib": rss, "commit": git_commit(), "vllmx": __version__,
        "llama_cpp_python": llama_cpp.__version__, "machine": platform.machine(),
        "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"),
    }
    write_result(f"cpu_vs_llamacpp_{os.path.splitext(out['model'])[0]}.json", out, indent=2)


if __name__ == "__main__":
    main()
