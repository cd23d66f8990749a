"""`vllmx serve` under hostile load, in its own process: a 10 MB prompt to tokenize, many
concurrent streams, clients that leave mid-stream, a long soak with a small KV cache (the
server's RSS sampled throughout).

    python bench/serve_stress.py [--prompt-mb 10] [--streams 512] [--disconnects 100]
        [--soak 10000] [--concurrency 64] [--out bench/results/serve_stress.json]

Checks, and exits non-zero when one fails: /health answers 200 in under 100 ms all the while
the large prompt is tokenized; every stream completes with exactly max_tokens
tokens (EOS ignored); after the disconnects every KV block is free again; /health stays 200;
RSS after warm-up stays flat. tests/server/test_stress.py runs the same functions, smaller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import httpx

MODEL = "SmolLM2-135M-Instruct"


def metric(url: str, name: str) -> float:
    """One sample of /metrics (the first series of that name)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        m = re.match(r"^([^{\s]+)(?:\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) == name:
            return float(m.group(2))
    raise KeyError(name)


def wait_idle(url: str, timeout: float = 30.0) -> float:
    """Seconds until no request runs or waits and the KV cache is empty (raises past timeout)."""
    t0 = time.perf_counter()
    while True:
        if (metric(url, "vllm:num_requests_running") == 0
                and metric(url, "vllm:num_requests_waiting") == 0
                and metric(url, "vllm:kv_cache_usage_perc") == 0.0):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("the server did not go idle")
        time.sleep(0.01)


async def _stream(http: httpx.AsyncClient, body: dict) -> int:
    """Completion tokens of one streamed request (from its usage chunk)."""
    usage = None
    async with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
    return usage["completion_tokens"] if usage else -1


def _body(i: int, max_tokens: int, model: str, stream: bool = True) -> dict:
    return {"model": model, "prompt": f"Request {i}: tell me about the number {i}.",
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.8, "seed": i,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}


def concurrent_streams(url: str, n: int, max_tokens: int = 16, model: str = MODEL) -> dict:
    """n streams at once; each must end with exactly max_tokens tokens."""
    async def run():
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
            return await asyncio.gather(*(_stream(http, _body(i, max_tokens, model))
                                          for i in range(n)))

    t0 = time.perf_counter()
    counts = asyncio.run(run())
    wall = time.perf_counter() - t0
    return {"streams": n, "max_tokens": max_tokens, "completed": sum(c == max_tokens
                                                                     for c in counts),
            "token_counts_wrong": [c for c in counts if c != max_tokens][:10],
            "wall_s": round(wall, 2), "tokens_per_s": round(sum(counts) / wall, 1)}


def disconnects(url: str, n: int, model: str = MODEL, at_once: int = 20) -> dict:
    """n clients that read the first chunk of a long stream and hang up; every KV block must
    come back (the time until the server is idle again is reported)."""
    async def one(http, i):
        body = _body(i, 400, model)
        async with http.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    return  # leave mid-stream: the connection closes here

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            for start in range(0, n, at_once):
                await asyncio.gather(*(one(http, i) for i in range(start, min(n, start +
                                                                               at_once))))

    t0 = time.perf_counter()
    asyncio.run(run())
    left = time.perf_counter() - t0
    idle_after = wait_idle(url)
    return {"disconnects": n, "wall_s": round(left, 2), "kv_free_after_s": round(idle_after, 3),
            "kv_usage_after": metric(url, "vllm:kv_cache_usage_perc")}


def soak(url: str, total: int, rss_kib, concurrency: int = 32, max_tokens: int = 4,
         samples: int = 20, model: str = MODEL) -> dict:
    """total short requests, concurrency at a time (streamed and not, alternately), the
    server's RSS sampled `samples` times; reports the curve and its growth after warm-up
    (the first quarter)."""
    curve: list[tuple[int, int]] = []
    done = 0
    failures: list[str] = []

    async def worker(http, queue):
        nonlocal done
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                if i % 2:
                    r = await http.post("/v1/completions", json=_body(i, max_tokens, model,
                                                                      stream=False))
                    r.raise_for_status()
                    got = r.json()["usage"]["completion_tokens"]
                else:
                    got = await _stream(http, _body(i, max_tokens, model))
                if got != max_tokens:
                    failures.append(f"request {i}: {got} tokens")
            except Exception as e:  # noqa: BLE001 - counted and reported
                failures.append(f"request {i}: {type(e).__name__}: {e}")
            done += 1
            if done % max(1, total // samples) == 0:
                curve.append((done, rss_kib()))

    async def run():
        queue: asyncio.Queue = asyncio.Queue()
        for i in range(total):
            queue.put_nowait(i)
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            await asyncio.gather(*(worker(http, queue) for _ in range(concurrency)))

    start_rss = rss_kib()
    t0 = time.perf_counter()
    asyncio.run(run())
    wall = time.perf_counter() - t0
    warm = next(rss for n, rss in curve if n >= total // 4)
    return {"requests": total, "concurrency": concurrency, "max_tokens": max_tokens,
            "failures": len(failures), "first_failures": failures[:5],
            "wall_s": round(wall, 1), "requests_per_s": round(total / wall, 1),
            "rss_start_mib": round(start_rss / 1024, 1),
            "rss_after_warmup_mib": round(warm / 1024, 1),
            "rss_end_mib": round(curve[-1][1] / 1024, 1),
            "rss_growth_after_warmup_mib": round((curve[-1][1] - warm) / 1024, 1),
            "rss_curve_mib": [(n, round(r / 1024, 1)) for n, r in curve]}


def health_during_large_prompt(url: str, megabytes: float = 10.0, path: str = "/tokenize",
                               model: str = MODEL, **fields) -> dict:
    """/health latencies (polled every 50 ms) while a prompt of that many megabytes is being
    tokenized by another request (fields: more of that request's body)."""
    text = "All work and no play makes Jack a dull boy. "
    body = {"model": model, "prompt": text * int(megabytes * 1e6 / len(text)), **fields}

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=600) as http:
            t0 = time.perf_counter()
            big = asyncio.ensure_future(http.post(path, json=body))
            latencies = []
            while not big.done():
                t = time.perf_counter()
                r = await http.get("/health")
                latencies.append((time.perf_counter() - t, r.status_code))
                await asyncio.sleep(0.05)
            response = await big
            return response, time.perf_counter() - t0, latencies

    response, wall, latencies = asyncio.run(run())
    times = sorted(t for t, _ in latencies)
    return {"prompt_mb": megabytes, "path": path, "status": response.status_code,
            "tokens": response.json().get("count") if response.status_code == 200 else None,
            "request_s": round(wall, 2), "health_polls": len(times),
            "health_not_200": sum(code != 200 for _, code in latencies),
            "health_max_ms": round(1000 * times[-1], 1) if times else None,
            "health_p50_ms": round(1000 * times[len(times) // 2], 1) if times else None}


def process_rss_kib(pid: int):
    def read() -> int:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return read


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_process(*args: str, timeout: float = 120.0, module: str = "vllmx.cli.main"):
    """`vllmx serve` in its own process on a free loopback port: yields (url, Popen).
    module: what `python -m` runs (a test's wrapper that injects a fault, say)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Its log goes to a file (a pipe nobody reads would fill and block the server):
    # proc.log() reads it.
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen([sys.executable, "-m", module, "serve", "--host",
                             "127.0.0.1", "--port", str(port), "--disable-log-requests", *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)

    def read_log() -> str:
        log.seek(0)
        return log.read()

    proc.log = read_log
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllmx serve exited: {read_log()}")
            if time.monotonic() > deadline:
                raise TimeoutError("vllmx serve did not come up")
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint / GGUF (default: the built-in)")
    ap.add_argument("--streams", type=int, default=512)
    ap.add_argument("--disconnects", type=int, default=100)
    ap.add_argument("--soak", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prompt-mb", type=float, default=10.0,
                    help="the prompt tokenized while /health is polled")
    ap.add_argument("--out", default="bench/results/serve_stress.json")
    args = ap.parse_args()
    model_args = [args.model] if args.model else []
    # A small KV cache (16 MiB: about 900 tokens of SmolLM2) so that the soak recycles every
    # block many times over, and preemption happens under the stream burst.
    flags = [*model_args, "--max-model-len", "512", "--max-num-seqs", "64",
             "--kv-cache-memory-bytes", "16M", "--disable-log-stats",
             "--served-model-name", MODEL]
    report: dict = {"flags": flags, "cpu_count": os.cpu_count()}
    with serve_process(*flags) as (url, proc):
        rss = process_rss_kib(proc.pid)
        report["rss_idle_mib"] = round(rss() / 1024, 1)
        report["large_prompt"] = health_during_large_prompt(url, args.prompt_mb)
        report["large_prompt"]["rss_after_mib"] = round(rss() / 1024, 1)
        # A completion keeping the prompt's last 64 tokens: the whole prompt is tokenized.
        report["large_prompt_completion"] = health_during_large_prompt(
            url, args.prompt_mb, "/v1/completions", truncate_prompt_tokens=64, max_tokens=4)
        report["large_prompt_completion"]["rss_after_mib"] = round(rss() / 1024, 1)
        print("large prompt completion", report["large_prompt_completion"], flush=True)
        print("large prompt", report["large_prompt"], flush=True)
        report["streams"] = concurrent_streams(url, args.streams)
        print("streams", report["streams"], flush=True)
        wait_idle(url)
        report["disconnects"] = disconnects(url, args.disconnects)
        print("disconnects", report["disconnects"], flush=True)
        report["soak"] = soak(url, args.soak, rss, concurrency=args.concurrency)
        print("soak", {k: v for k, v in report["soak"].items() if k != "rss_curve_mib"},
              flush=True)
        report["health_after"] = httpx.get(f"{url}/health").status_code
    ok = (all(report[k]["health_not_200"] == 0 and report[k]["health_max_ms"] < 100
              and report[k]["status"] == 200 for k in ("large_prompt", "large_prompt_completion"))
          and report["streams"]["completed"] == args.streams
          and report["disconnects"]["kv_usage_after"] == 0.0
          and report["soak"]["failures"] == 0 and report["health_after"] == 200)
    report["ok"] = ok
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}; ok={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
