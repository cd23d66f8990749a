"""Continuous batching vs one request at a time, same engine, same requests, one run.

24 mixed requests (half share a long system prompt; max_tokens vary) with max_num_seqs=6,
max_num_batched_tokens=64 and a KV cache too small to hold them all, so chunked prefill,
prefix-cache hits and preemption all happen. Checks that every request's greedy tokens are
the same both ways, then prints the wall-time ratio.

    python bench/engine_batching.py [--model PATH_OR_ALIAS] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time

SYSTEM = ("You are a meticulous assistant for a city library. You answer questions about "
          "opening hours, book loans, renewals, late fees, study rooms, printing, and events. "
          "Be brief, accurate and friendly, and say when you do not know something. ")
QUESTIONS = ["When does the library open on Sunday?", "How many books can I borrow?",
             "What is the fee for a late DVD?", "Can I book a study room for four people?",
             "Do you have a 3D printer?", "How do I renew a loan online?",
             "Is there a children's story hour?", "Can I print in colour?",
             "Where do I return books after hours?", "Do you sell used books?",
             "Is the wifi free?", "Can I bring coffee inside?"]


def make_requests(tok):
    reqs = []
    for i, q in enumerate(QUESTIONS):
        shared = tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": q}],
                                         add_generation_prompt=True)
        plain = tok.encode(f"Question {i}: {q}\nAnswer:")
        reqs.append((shared, 16 + 8 * (i % 4)))
        reqs.append((plain, 24 + 4 * (i % 3)))
    return reqs


def main() -> None:
    from vllmx import LLM, SamplingParams
    from vllmx.loader.model_source import DEFAULT_MODEL

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    llm = LLM(args.model, max_model_len=320, max_num_seqs=6, max_num_batched_tokens=64,
              num_gpu_blocks_override=20, block_size=16, num_threads=args.threads)
    reqs = make_requests(llm.get_tokenizer())
    prompts = [{"prompt_token_ids": ids} for ids, _ in reqs]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in reqs]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up

    llm.reset_prefix_cache()
    t = time.perf_counter()
    alone = [llm.generate([p], [sp], use_tqdm=False)[0] for p, sp in zip(prompts, params)]
    t_alone = time.perf_counter() - t
    llm.reset_prefix_cache()
    engine = llm.llm_engine
    preempt0 = engine.scheduler.num_preemptions
    t = time.perf_counter()
    batched = llm.generate(prompts, params, use_tqdm=False)
    t_batched = time.perf_counter() - t
    same = all(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(alone, batched))
    cached = sum(1 for b in batched if b.num_cached_tokens > 0)
    out_tokens = sum(len(b.outputs[0].token_ids) for b in batched)
    result = {
        "requests": len(reqs), "output_tokens": out_tokens, "identical_tokens": same,
        "requests_with_prefix_hits": cached,
        "preemptions": engine.scheduler.num_preemptions - preempt0,
        "one_at_a_time_s": t_alone, "batched_s": t_batched, "speedup": t_alone / t_batched,
        "threads": args.threads,
    }
    print(json.dumps(result, indent=2))
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "engine_batching.json"), "w") as f:
        json.dump(result, f, indent=2)
    if not same:
        raise SystemExit("batched tokens differ from one-at-a-time tokens")


if __name__ == "__main__":
    main()
