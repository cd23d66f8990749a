"""`vllmx bench serve`: vLLM's serving benchmark against any OpenAI-compatible server
(/v1/completions, streamed). Prompts come from a random dataset (random token ids of exact
lengths, sent as token-id prompts) or a ShareGPT JSON file; requests arrive as a Poisson
process (--request-rate) under an optional concurrency cap (--max-concurrency). Metrics are
vLLM's: TTFT, TPOT = (E2E - TTFT) / (output tokens - 1), ITL between streamed chunks, E2E.
The HTTP client is plain asyncio (HTTP/1.1, chunked SSE), so it adds no dependency."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import numpy as np


@dataclass
class SampleRequest:
    prompt: str | list[int]
    prompt_len: int
    expected_output_len: int


@dataclass
class RequestFuncOutput:
    success: bool = False
    generated_text: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""


# -- datasets -----------------------------------------------------------------------------------
def sample_random(tokenizer, num: int, input_len: int, output_len: int, range_ratio: float,
                  seed: int) -> list[SampleRequest]:
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(tokenizer.vocab_size) if i not in special]
    lo_in, hi_in = int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio))
    lo_out, hi_out = int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio))
    out = []
    for _ in range(num):
        n_in = int(rng.integers(max(lo_in, 1), hi_in + 1))
        ids = [vocab[j] for j in rng.integers(0, len(vocab), n_in)]
        out.append(SampleRequest(ids, n_in, int(rng.integers(max(lo_out, 1), hi_out + 1))))
    return out


def sample_sharegpt(path: str, tokenizer, num: int, output_len: int | None,
                    seed: int) -> list[SampleRequest]:
    """vLLM's ShareGPT sampling: first human turn as prompt, the reply's length as the output
    length; pairs with a prompt or reply under 4 tokens, a prompt over 1024 or a total over
    2048 tokens are skipped."""
    with open(path, encoding="utf-8") as f:
        data = [d for d in json.load(f) if len(d.get("conversations", [])) >= 2]
    random.Random(seed).shuffle(data)
    out = []
    for d in data:
        if len(out) == num:
            break
        prompt, reply = d["conversations"][0]["value"], d["conversations"][1]["value"]
        p_len = len(tokenizer.encode(prompt))
        o_len = output_len or len(tokenizer.encode(reply, add_special_tokens=False))
        if p_len < 4 or (output_len is None and o_len < 4) or p_len > 1024 or p_len + o_len > 2048:
            continue
        out.append(SampleRequest(prompt, p_len, o_len))
    if len(out) < num:
        raise ValueError(f"{path}: only {len(out)} usable conversations, {num} requested")
    return out


# -- the client -----------------------------------------------------------------------------------
async def _sse_events(url: str, body: dict, headers: dict):
    """POSTs JSON and yields the `data:` payloads of the SSE response (HTTP/1.1, plain TCP)."""
    u = urlparse(url)
    if u.scheme != "http":
        raise ValueError(f"only http:// URLs are supported, got {url!r}")
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    try:
        payload = json.dumps(body).encode()
        head = [f"POST {u.path} HTTP/1.1", f"Host: {u.netloc}", "Connection: close",
                "Content-Type: application/json", f"Content-Length: {len(payload)}",
                *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status = (await reader.readline()).decode().split(" ", 2)
        resp_headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            resp_headers[k.strip().lower()] = v.strip()
        chunked = resp_headers.get("transfer-encoding", "").lower() == "chunked"

        async def chunks():
            if not chunked:
                while data := await reader.read(65536):
                    yield data
                return
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    return
                yield await reader.readexactly(size)
                await reader.readline()

        if status[1] != "200":
            text = b"".join([c async for c in chunks()]).decode(errors="replace")
            raise RuntimeError(f"HTTP {status[1]}: {text[:300]}")
        buf = b""
        async for data in chunks():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        yield line[5:].strip().decode()
    finally:
        writer.close()


async def request_completion(url: str, model: str, req: SampleRequest, ignore_eos: bool,
                             api_key: str | None) -> RequestFuncOutput:
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.expected_output_len,
            "temperature": 0.0, "stream": True, "ignore_eos": ignore_eos,
            "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    out = RequestFuncOutput(prompt_len=req.prompt_len)
    start = last = time.perf_counter()
    text = []
    try:
        async for data in _sse_events(url, body, headers):
            if data == "[DONE]":
                break
            msg = json.loads(data)
            if "error" in msg:
                raise RuntimeError(msg["error"].get("message"))
            if msg.get("usage"):
                out.output_tokens = msg["usage"]["completion_tokens"]
            if msg.get("choices") and msg["choices"][0].get("text"):
                now = time.perf_counter()
                if not text:
                    out.ttft = now - start
                else:
                    out.itl.append(now - last)
                last = now
                text.append(msg["choices"][0]["text"])
        out.latency = time.perf_counter() - start
        out.generated_text = "".join(text)
        out.success = True
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        out.error = f"{type(e).__name__}: {e}"
    return out


async def _arrivals(requests: list[SampleRequest], rate: float, seed: int):
    rng = np.random.default_rng(seed)
    for req in requests:
        yield req
        if rate != float("inf"):
            await asyncio.sleep(float(rng.exponential(1.0 / rate)))


async def benchmark(args, url: str, model: str, requests: list[SampleRequest]) -> dict:
    test = await request_completion(url, model, requests[0], args.ignore_eos, args.api_key)
    if not test.success:
        raise ValueError(f"the test request failed: {test.error}")
    sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

    async def limited(req):
        if sem is None:
            return await request_completion(url, model, req, args.ignore_eos, args.api_key)
        async with sem:
            return await request_completion(url, model, req, args.ignore_eos, args.api_key)

    start = time.perf_counter()
    tasks = [asyncio.ensure_future(limited(r))
             async for r in _arrivals(requests, args.request_rate, args.seed)]
    outputs = await asyncio.gather(*tasks)
    return calculate_metrics(requests, outputs, time.perf_counter() - start, args)


def calculate_metrics(requests, outputs: list[RequestFuncOutput], duration: float, args) -> dict:
    ok = [o for o in outputs if o.success]
    for o in ok:
        if not o.output_tokens:  # the server sent no usage: count streamed chunks
            o.output_tokens = len(o.itl) + 1
    ttfts = [o.ttft for o in ok]
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    itls = [x for o in ok for x in o.itl]
    e2els = [o.latency for o in ok]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    result = {
        "date": time.strftime("%Y%m%d-%H%M%S"), "backend": "openai", "model_id": args.model,
        "num_prompts": len(requests), "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency, "duration": duration, "completed": len(ok),
        "failed": len(outputs) - len(ok), "total_input_tokens": total_in,
        "total_output_tokens": total_out, "request_throughput": len(ok) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        arr = np.array(values or [0.0]) * 1000
        result[f"mean_{name}_ms"] = float(arr.mean())
        result[f"median_{name}_ms"] = float(np.median(arr))
        result[f"std_{name}_ms"] = float(arr.std())
        result[f"p99_{name}_ms"] = float(np.percentile(arr, 99))
    result.update({"input_lens": [o.prompt_len for o in outputs],
                   "output_lens": [o.output_tokens for o in outputs], "ttfts": ttfts,
                   "itls": [o.itl for o in outputs],
                   "generated_texts": [o.generated_text for o in outputs],
                   "errors": [o.error for o in outputs]})
    return result


def format_result(r: dict) -> str:
    lines = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="=")]

    def row(label, value, fmt="{:<10.2f}"):
        lines.append(f"{label:<40} " + fmt.format(value))

    row("Successful requests:", r["completed"], "{:<10}")
    row("Failed requests:", r["failed"], "{:<10}")
    if r["max_concurrency"]:
        row("Maximum request concurrency:", r["max_concurrency"], "{:<10}")
    row("Benchmark duration (s):", r["duration"])
    row("Total input tokens:", r["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", r["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", r["request_throughput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Total Token throughput (tok/s):", r["total_token_throughput"])
    titles = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
              "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
    for name, title in titles.items():
        lines.append("{s:{c}^50}".format(s=f" {title} ", c="-"))
        for stat in ("mean", "median", "p99"):
            row(f"{stat.capitalize() if stat != 'p99' else 'P99'} {name.upper()} (ms):",
                r[f"{stat}_{name}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)


# -- the command ----------------------------------------------------------------------------------
def add_bench_parser(sub) -> argparse.ArgumentParser:
    from vllmx.cli.bench_throughput import add_throughput_parser

    p = sub.add_parser("bench", help="benchmarks: serve (an OpenAI-compatible server), "
                                     "throughput (offline)")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    add_throughput_parser(bench_sub)
    s = bench_sub.add_parser("serve", help="benchmark the online serving throughput and latency")
    s.add_argument("--base-url", default=None, help="e.g. http://127.0.0.1:8000")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--endpoint", default="/v1/completions")
    s.add_argument("--model", default=None, help="default: the server's first model")
    s.add_argument("--tokenizer", default=None, help="default: the model's (vllmx resolves it)")
    s.add_argument("--api-key", default=None)
    s.add_argument("--dataset-name", choices=["random", "sharegpt"], default="random")
    s.add_argument("--dataset-path", default=None, help="ShareGPT JSON file")
    s.add_argument("--num-prompts", type=int, default=1000)
    s.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests/s (Poisson arrivals); inf sends them all at once")
    s.add_argument("--max-concurrency", type=int, default=None)
    s.add_argument("--random-input-len", type=int, default=1024)
    s.add_argument("--random-output-len", type=int, default=128)
    s.add_argument("--random-range-ratio", type=float, default=0.0)
    s.add_argument("--sharegpt-output-len", type=int, default=None)
    s.add_argument("--ignore-eos", action="store_true")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--save-result", action="store_true")
    s.add_argument("--result-filename", default=None)
    return p


def _first_model(base_url: str, api_key: str | None) -> str:
    import urllib.request

    req = urllib.request.Request(f"{base_url}/v1/models", headers={
        "Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["data"][0]["id"]


def run_bench(args: argparse.Namespace) -> int:
    if args.bench_command == "throughput":
        from vllmx.cli.bench_throughput import run_throughput

        return run_throughput(args)
    from vllmx.loader.model_source import resolve_model
    from vllmx.tokenizer import get_tokenizer

    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    args.model = args.model or _first_model(base_url, args.api_key)
    tokenizer = get_tokenizer(resolve_model(args.tokenizer or args.model))
    if args.dataset_name == "random":
        requests = sample_random(tokenizer, args.num_prompts, args.random_input_len,
                                 args.random_output_len, args.random_range_ratio, args.seed)
    else:
        if not args.dataset_path:
            raise ValueError("--dataset-name sharegpt needs --dataset-path")
        requests = sample_sharegpt(args.dataset_path, tokenizer, args.num_prompts,
                                   args.sharegpt_output_len, args.seed)
    result = asyncio.run(benchmark(args, base_url + args.endpoint, args.model, requests))
    print(format_result(result))
    if args.save_result:
        name = args.result_filename or (f"openai-{args.request_rate}qps-"
                                        f"{args.model.split('/')[-1]}-{result['date']}.json")
        with open(name, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        print(f"saved {name}", file=sys.stderr)
    return 0 if result["completed"] else 1
