"""bench/gpu_vs_vllm.py --serve: `vllmx serve` and `vllm serve` started one at a time with the
same flags (a trivial byte-level BPE tokenizer written beside config.json: the random dataset
sends token ids, the tokenizer only supplies the vocabulary), each driven by `vllmx bench serve
--dataset-name random` at each --concurrency; with --py-spy, where the vllmx server's GIL goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from peer_process import engine_env


def write_tokenizer(path: str, vocab: int) -> None:
    """A byte-level BPE with exactly `vocab` tokens ("a", "b", their merge "ab", then "<tN>"
    fillers): enough for both servers to start and detokenize; the prompts are token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = {"a": 0, "b": 1, "ab": 2} | {f"<t{i}>": i for i in range(3, vocab)}
    tok = Tokenizer(models.BPE(vocab=table, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)


def server_cmd(engine: str, args, path: str, port: int, max_len: int) -> list[str]:
    flags = ["--port", str(port), "--load-format", "dummy", "--max-model-len", str(max_len),
             "--max-num-seqs", str(args.max_num_seqs),
             "--max-num-batched-tokens", str(args.max_num_batched_tokens),
             "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if engine == "vllmx":
        return [sys.executable, "-m", "vllmx", "serve", path, "--device", args.device, *flags]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path,
            "--dtype", "bfloat16", *flags]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until GET /health answers 200 (RuntimeError if the server exits or times out)."""
    import urllib.request

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the server was not ready after {timeout:.0f} s")


def start_py_spy(args, engine: str, pid: int, c: int, path: str, mode: str):
    """--py-spy: a profile of vllmx's server process for 8 s, 3 s into each run at concurrency
    >= 64. mode "gil": only samples holding the GIL (which thread's Python the serving run
    waits on: the engine's step loop or the event loop's streams); mode "idle": every thread
    at every sample, idle included (where the engine thread's time goes: its Python, or
    waiting on the device inside a native call)."""
    if not args.py_spy or engine != "vllmx" or c < 64:
        return None
    out = os.path.join(os.environ.get("OUT") or path, f"{mode}-c{c}.txt")
    cmd = [args.py_spy, "record", "-p", str(pid), "-d", "8", "-r", "200", "-f", "raw", "-o", out,
           "--threads", "--nonblocking", "--gil" if mode == "gil" else "--idle"]
    return subprocess.Popen(["bash", "-c", 'sleep 3; exec "$@"', "_", *cmd],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out


def scrape_steps(url: str) -> tuple[float, float] | None:
    """(engine steps, tokens they scheduled) so far: vllm:iteration_tokens_total's count and
    sum, which both servers export (differences over a run: steps/s and tokens per step)."""
    import urllib.request

    count = total = 0.0
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("vllm:iteration_tokens_total_count"):
            count += float(value)
        elif name.startswith("vllm:iteration_tokens_total_sum"):
            total += float(value)
    return count, total


def finish_py_spy(proc: subprocess.Popen, out: str) -> dict:
    """Samples per thread, and the 12 functions most often on their stacks."""
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"error": "py-spy did not finish"}
    if not os.path.exists(out):
        return {"error": "py-spy wrote nothing"}
    threads: dict[str, int] = {}
    funcs: dict[str, int] = {}
    with open(out) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            threads[frames[0]] = threads.get(frames[0], 0) + int(n)
            for fn in set(frames[1:]):
                funcs[fn] = funcs.get(fn, 0) + int(n)
    top = sorted(funcs.items(), key=lambda kv: -kv[1])[:12]
    return {"samples_by_thread": threads, "top_inclusive": dict(top), "raw": out}


def serve_run(engine: str, args, path: str, max_len: int, lengths: tuple[int, int]) -> dict:
    """lengths: the random dataset's (input, output) tokens a request."""
    port = 8100 if engine == "vllmx" else 8200
    url = f"http://127.0.0.1:{port}"
    log = open(os.path.join(path, f"{engine}-serve.log"), "w")
    proc = subprocess.Popen(server_cmd(engine, args, path, port, max_len), stdout=log,
                            stderr=subprocess.STDOUT, env=engine_env(engine, args.vllm_site))
    result: dict = {}
    try:
        result["ready_s"] = wait_ready(url, proc, args.worker_timeout)
        inp, out = lengths
        for c in args.concurrency:
            dest = os.path.join(path, f"{engine}-serve-c{c}.json")
            bench = [sys.executable, "-m", "vllmx", "bench", "serve", "--base-url", url,
                     "--dataset-name", "random", "--random-input-len", str(inp),
                     "--random-output-len", str(out), "--num-prompts", str(max(16, 4 * c)),
                     "--max-concurrency", str(c), "--ignore-eos", "--save-result",
                     "--result-filename", dest]
            spies = {m: start_py_spy(args, engine, proc.pid, c, path, m) for m in ("gil", "idle")}
            steps0 = scrape_steps(url)
            done = subprocess.run(bench, capture_output=True, text=True,
                                  env=engine_env("vllmx", args.vllm_site),
                                  timeout=args.worker_timeout)
            steps1 = scrape_steps(url)
            for m, spy in spies.items():
                if spy is not None:
                    result[f"{m}_c{c}"] = finish_py_spy(*spy)
            if done.returncode != 0 or not os.path.exists(dest):
                result[str(c)] = {"error": done.stderr[-1500:]}
                continue
            with open(dest) as f:
                r = json.load(f)
            result[str(c)] = {k: r[k] for k in (
                "completed", "failed", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
                "median_tpot_ms", "p99_tpot_ms", "duration")}
            if steps0 is None or steps1 is None:
                continue
            n = steps1[0] - steps0[0]
            result[str(c)].update(steps=n, tokens_per_step=(steps1[1] - steps0[1]) / max(n, 1),
                                  ms_per_step=1e3 * r["duration"] / max(n, 1))
            print(f"  {engine} serve c={c}: {result[str(c)]}", flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    if "error" in result:  # why the server stopped (e.g. a module its image lacks) is in its log
        with open(log.name, errors="replace") as f:
            result["server_log_tail"] = f.read()[-2000:]
        print(f"  {engine} serve failed: {result['error']}\n{result['server_log_tail']}",
              flush=True)
    return result


def print_serve_table(report) -> None:
    print("| model | concurrency | output tok/s vllmx / vLLM (x) | TTFT p50 ms | TTFT p99 ms "
          "| TPOT p50 ms | TPOT p99 ms |\n|---|---|---|---|---|---|---|")
    for name, m in report["models"].items():
        a, b = m.get("vllmx_serve", {}), m.get("vllm_serve", {})
        for c, r in a.items():
            o = b.get(c)
            if not isinstance(r, dict) or "output_throughput" not in r:
                continue
            if not isinstance(o, dict) or "output_throughput" not in o:
                o = {k: float("nan") for k in r}
            cells = [f"{r['output_throughput']:,.0f} / {o['output_throughput']:,.0f} "
                     f"({r['output_throughput'] / o['output_throughput']:.2f}x)"]
            cells += [f"{r[k]:.1f} / {o[k]:.1f}" for k in (
                "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")]
            print(f"| {name} | {c} | " + " | ".join(cells) + " |")
