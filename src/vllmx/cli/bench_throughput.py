"""`vllmx bench throughput`: vLLM's offline throughput benchmark — N random prompts of fixed
input/output lengths through LLM.generate at once; prints requests/s, total tokens/s and output
tokens/s as vLLM does."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def add_throughput_parser(bench_sub) -> None:
    t = bench_sub.add_parser("throughput", help="offline throughput of LLM.generate")
    t.add_argument("--model", default=None, help="default: the built-in default model")
    t.add_argument("--num-prompts", type=int, default=64)
    t.add_argument("--input-len", type=int, default=256)
    t.add_argument("--output-len", type=int, default=64)
    t.add_argument("--max-num-seqs", type=int, default=256)
    t.add_argument("--max-num-batched-tokens", type=int, default=8192)
    t.add_argument("--max-model-len", type=int, default=None)
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--output-json", default=None)


def run_throughput(args: argparse.Namespace) -> int:
    from vllmx import LLM, SamplingParams
    from vllmx.loader.model_source import DEFAULT_MODEL

    llm = LLM(args.model or DEFAULT_MODEL, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=args.max_model_len, num_threads=args.threads, seed=args.seed,
              enable_prefix_caching=False)
    vocab = llm.llm_engine.model.vocab_size
    rng = np.random.default_rng(args.seed)
    # Random token ids (as vLLM's random dataset), away from the special ids at the start.
    prompts = [{"prompt_token_ids": rng.integers(vocab // 8, vocab, args.input_len).tolist()}
               for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.output_len,
                            ignore_eos=True, seed=args.seed)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    total = out_tokens + sum(len(o.prompt_token_ids) for o in outs)
    result = {"elapsed_time": elapsed, "num_requests": len(outs),
              "total_num_tokens": total, "requests_per_second": len(outs) / elapsed,
              "tokens_per_second": total / elapsed, "output_tokens_per_second": out_tokens / elapsed}
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, "
          f"{result['tokens_per_second']:.2f} total tokens/s, "
          f"{result['output_tokens_per_second']:.2f} output tokens/s")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
