"""Where the resident memory goes, vllmx vs llama.cpp on the same GGUF: each engine in a fresh
child process runs cpu_vs_llamacpp.py's workload (512-token prefill, 128-token decode, 16
requests x 64 tokens) and reports, after each stage, RSS split into anonymous and file-backed
pages (/proc/self/status), the part of it that is the GGUF file's own mapping (/proc/self/smaps),
and the peak within the stage (VmHWM, reset before each stage through /proc/self/clear_refs).
The last line is the whole run's peak, the largest stage peak: the number the issue's 1.2x bound
is about (ru_maxrss would be too, but the resets lower it: Linux derives it from VmHWM).

    python bench/rss_breakdown.py [--model PATH_OR_ALIAS] [--threads 2] [--engine vllmx]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from cpu_vs_llamacpp_lib import make_prompt, throughput_prompts

ENGINES = ("vllmx", "llama.cpp")


def status_kib() -> dict[str, int]:
    keys = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in keys:
                out[name] = int(rest.split()[0])
    return out


def mapping_rss_kib(path: str) -> int:
    """Resident KiB of every mapping of `path` in this process (smaps' Rss lines)."""
    path, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) == 6 and head[5].strip() == path
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def reset_peak() -> None:
    """Makes VmHWM restart from the current RSS (Linux >= 4.0), so it measures one stage."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(engine: str, model: str, threads: int) -> None:
    peak = 0

    def report(stage: str) -> None:
        nonlocal peak
        s = status_kib()
        peak = max(peak, s["VmHWM"])
        print(json.dumps({"stage": stage, "stage_peak": s["VmHWM"], "rss": s["VmRSS"],
                          "anon": s["RssAnon"], "file": s["RssFile"],
                          "gguf": mapping_rss_kib(model)}), flush=True)
        reset_peak()

    from cpu_vs_llamacpp_lib import RUNNERS

    reset_peak()
    if engine == "vllmx":
        import vllmx  # noqa: F401
    else:
        import llama_cpp  # noqa: F401
    report("import")
    r = RUNNERS[engine](model, threads)
    report("load")
    ids = make_prompt(r.tokenize, 512)
    r.prefill(ids)
    report("prefill 512")
    r.decode(ids[:16], 128)
    report("decode 128")
    r.throughput(throughput_prompts(r.tokenize, 16, 32), 64)
    report("16 x 64")
    print(json.dumps({"stage": "peak", "rss": peak}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF path or alias (default: vllmx's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", choices=ENGINES, default=None, help="only this engine")
    ap.add_argument("--child", choices=ENGINES, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.model, args.threads)
        return
    from vllmx.loader.model_source import DEFAULT_MODEL, resolve_model

    path = os.path.abspath(resolve_model(args.model or DEFAULT_MODEL))
    print(f"{os.path.basename(path)} ({os.path.getsize(path) / 2**20:.0f} MiB), "
          f"{args.threads} threads; MiB")
    peaks = {}
    for engine in [args.engine] if args.engine else ENGINES:
        # A fresh interpreter: ru_maxrss would otherwise start from this process's RSS.
        cmd = [sys.executable, __file__, "--child", engine, "--model", path,
               "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not rows:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        print(f"\n{engine:16s} {'RSS':>7s} {'anon':>7s} {'file':>7s} {'gguf':>7s} {'peak in':>8s}")
        for row in rows:
            mib = {k: v / 1024 for k, v in row.items() if k != "stage"}
            if "anon" in mib:
                print(f"{row['stage']:16s} {mib['rss']:7.1f} {mib['anon']:7.1f} {mib['file']:7.1f} "
                      f"{mib['gguf']:7.1f} {mib['stage_peak']:8.1f}")
            else:
                print(f"{row['stage']:16s} {mib['rss']:7.1f}")
                peaks[engine] = mib["rss"]
    if len(peaks) == 2:
        print(f"\npeak RSS vllmx / llama.cpp: {peaks['vllmx'] / peaks['llama.cpp']:.2f}x")


if __name__ == "__main__":
    main()
