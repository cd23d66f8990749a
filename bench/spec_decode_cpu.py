"""Speculative decoding on the CPU: vllmx with and without ngram (prompt lookup) against
llama.cpp's own prompt-lookup decoding (llama-cpp-python's LlamaPromptLookupDecoding), on the
same GGUF, the same prompt tokens and the same threads, in one run.

The workload copies from its prompt (rewrite a paragraph, extract sentences, edit code), the
case prompt lookup is for. Greedy, max_tokens new tokens (EOS ends a request early, the same
tokens in every engine): output tok/s over whole requests (prefill included) at concurrency 1
(one request after another) and, for vllmx, concurrency 8 (all at once; llama-cpp-python runs
one sequence at a time). vllmx's outputs with speculation must equal its outputs without.

    python bench/spec_decode_cpu.py [--model PATH_OR_ALIAS] [--threads 2] [--k 4] [--repeats 3]

--draft PATH runs vLLM's draft_model method instead (PATH drafting for --model, e.g. the Q4_1
file for an F16 copy made by `vllmx quantize --type F16`), against llama.cpp's draft-model
decoding with --llama-bin (llama-cpp-python has none of its own).

--llama-bin DIR adds llama.cpp's own C++ examples on the same files and threads (built with
-DLLAMA_BUILD_EXAMPLES=ON, bench/llamacpp_examples.py): llama-lookup with k drafts (ngram) or
llama-speculative-simple with the draft (--draft), and llama-lookup with none (plain decoding),
at concurrency 1, the chat-templated prompts as text, timed by their own timers.

--structured: the workload copies JSON records from its prompts under a JSON schema (structured
outputs: the drafts cut where the grammar stops allowing them, each verify row masked or
checked), vllmx with and without speculation only.

--accept0: what speculation costs when nothing is accepted: ngram's drafts replaced by k random
tokens a step (acceptance ~0; the outputs still equal those without), vllmx with and without
only. Issue 14's bar: at most 10% slower.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from cpu_vs_llamacpp_lib import cpu_name, git_commit, write_result
from llamacpp_examples import llamacpp_spec

PARAGRAPH = ("The quick brown fox jumps over the lazy dog while the farmer watches from the "
             "porch. In the afternoon the clouds gathered over the hills and the wind began to "
             "blow through the tall grass. By evening the storm had passed, leaving the fields "
             "wet and the air fresh and cool.")
CODE = '''def mean(values):
    total = 0
    for v in values:
        total = total + v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total = total + (v - m) ** 2
    return total / len(values)
'''
TASKS = [
    f"Repeat the following text exactly, word for word:\n\n{PARAGRAPH}",
    f"Rewrite this paragraph with every sentence on its own line:\n\n{PARAGRAPH}",
    f"Copy the second and third sentences of this text:\n\n{PARAGRAPH}",
    f"Rename the variable `total` to `acc` in this code and print the whole code:\n\n{CODE}",
    f"Add a docstring to each function and print the whole code:\n\n{CODE}",
    f"Print this code unchanged:\n\n{CODE}",
    f"Repeat this text twice:\n\n{PARAGRAPH}",
    f"Quote the first sentence, then the last one:\n\n{PARAGRAPH}",
]

RECORDS = [
    {"name": "Ada Lovelace", "age": 36, "city": "London", "email": "ada@example.com",
     "tags": ["math", "poetry"]},
    {"name": "Alan Turing", "age": 41, "city": "Manchester", "email": "alan@example.com",
     "tags": ["logic", "running"]},
    {"name": "Grace Hopper", "age": 85, "city": "Arlington", "email": "grace@example.com",
     "tags": ["compilers", "navy"]},
    {"name": "Edsger Dijkstra", "age": 72, "city": "Nuenen", "email": "edsger@example.com",
     "tags": ["algorithms"]},
]
RECORD_SCHEMA = {"type": "object", "required": ["name", "age", "city", "email", "tags"],
                 "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                "city": {"type": "string"}, "email": {"type": "string"},
                                "tags": {"type": "array", "items": {"type": "string"}}}}
JSON_TASKS = [f"Copy this record as JSON exactly: {json.dumps(r)}" for r in RECORDS] + [
    f"Copy this record as JSON exactly, with the age one year more: {json.dumps(r)}"
    for r in RECORDS]


def vllmx_engine(model, threads, spec):
    from vllmx import LLM

    return LLM(model, num_threads=threads, enable_prefix_caching=False, max_model_len=2048,
               speculative_config=spec)


def vllmx_run(llm, prompts, max_tokens, concurrency,
              structured: bool = False) -> tuple[float, list[list[int]]]:
    from vllmx import SamplingParams
    from vllmx.sampling_params import StructuredOutputsParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=(
        StructuredOutputsParams(json=RECORD_SCHEMA) if structured else None))
    t = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), concurrency):
        batch = [{"prompt_token_ids": p} for p in prompts[i:i + concurrency]]
        outs += [o.outputs[0].token_ids for o in llm.generate(batch, sp, use_tqdm=False)]
    return time.perf_counter() - t, outs


def llamacpp_run(llm, prompts, max_tokens) -> tuple[float, list[list[int]]]:
    outs = []
    t = time.perf_counter()
    for p in prompts:
        llm.reset()
        toks = []
        for tok in llm.generate(p, temp=0.0, top_k=1, reset=True):
            if llm._token_eos == tok:
                break
            toks.append(tok)
            if len(toks) == max_tokens:
                break
        outs.append(toks)
    return time.perf_counter() - t, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF path or alias (default: vllmx's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup-min", type=int, default=2)
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--draft", default=None, help="draft model (method draft_model)")
    ap.add_argument("--structured", action="store_true",
                    help="copy JSON records under a JSON schema (vllmx only)")
    ap.add_argument("--accept0", action="store_true",
                    help="random drafts: the cost of speculation at acceptance 0 (vllmx only)")
    ap.add_argument("--llama-bin", default=None,
                    help="the folder of llama.cpp's llama-lookup / llama-speculative-simple")
    args = ap.parse_args()
    only_vllmx = args.draft or args.structured or args.accept0

    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from vllmx import __version__
    from vllmx.loader.model_source import DEFAULT_MODEL, resolve_model

    model = resolve_model(args.model or DEFAULT_MODEL)
    spec = {"method": "ngram", "num_speculative_tokens": args.k,
            "prompt_lookup_min": args.lookup_min, "prompt_lookup_max": args.lookup_max}
    if args.draft:
        spec = {"method": "draft_model", "model": resolve_model(args.draft),
                "num_speculative_tokens": args.k}
    base, specd = vllmx_engine(model, args.threads, None), vllmx_engine(model, args.threads, spec)
    if args.accept0:  # this engine's drafter proposes k random tokens for every request
        import numpy as np

        rng, vocab = np.random.default_rng(0), specd.llm_engine.model_runner.model.vocab_size
        specd.llm_engine.model_runner.drafter.propose_batch = lambda seqs: {
            r: rng.integers(0, vocab, args.k).tolist() for r in seqs}
    tok = base.get_tokenizer()
    chats = [[{"role": "user", "content": t}] for t in (JSON_TASKS if args.structured else TASKS)]
    prompts = [tok.apply_chat_template(c, tokenize=True, add_generation_prompt=True)
               for c in chats]
    kw = dict(n_ctx=2048, n_batch=512, n_threads=args.threads, n_threads_batch=args.threads,
              flash_attn=True, verbose=False)
    plain_cpp = llama_cpp.Llama(model, **kw)
    spec_cpp = llama_cpp.Llama(model, draft_model=LlamaPromptLookupDecoding(
        max_ngram_size=args.lookup_max, num_pred_tokens=args.k), **kw)

    m = spec["method"]
    st = args.structured
    runs = {
        "vllmx c1": lambda: vllmx_run(base, prompts, args.max_tokens, 1, st),
        f"vllmx+{m} c1": lambda: vllmx_run(specd, prompts, args.max_tokens, 1, st),
        "vllmx c8": lambda: vllmx_run(base, prompts, args.max_tokens, 8, st),
        f"vllmx+{m} c8": lambda: vllmx_run(specd, prompts, args.max_tokens, 8, st),
    }
    if not only_vllmx:
        runs["llama.cpp c1"] = lambda: llamacpp_run(plain_cpp, prompts, args.max_tokens)
        runs["llama.cpp+lookup c1"] = lambda: llamacpp_run(spec_cpp, prompts, args.max_tokens)
    failed: dict[str, str] = {}
    for name, f in list(runs.items()):  # warm-up (CPU tapes recorded, caches warm)
        try:
            f()
        except RuntimeError as e:
            if name.startswith("vllmx"):
                raise
            # llama.cpp's prompt lookup cuts a rejected draft's KV (llama_memory_seq_rm),
            # which its recurrent-state memory (hybrid models) cannot: decode fails.
            failed[name] = f"{type(e).__name__}: {e}"
            print(f"{name}: fails ({failed[name]})")
            del runs[name]
    times: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):  # engines alternate within each repeat
        for name, f in runs.items():
            dt, outs = f()
            times[name].append(dt)
            outputs[name] = outs
    for name in (f"vllmx+{m} c1", "vllmx c8", f"vllmx+{m} c8"):
        if outputs[name] != outputs["vllmx c1"]:
            raise RuntimeError(f"{name}: outputs differ from vllmx without speculation")
    results = {}
    for name, ts in times.items():
        n = sum(len(o) for o in outputs[name])
        results[name] = {"seconds": statistics.median(ts), "tokens": n,
                         "tok_s": n / statistics.median(ts)}
        print(f"{name:22s} {results[name]['tok_s']:8.1f} tok/s  ({n} tokens, median of "
              f"{args.repeats})")
    examples = {}
    if args.llama_bin and not (args.structured or args.accept0):
        texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                 for c in chats]
        for name, k in (("none", 0), (m, args.k)):
            examples[name] = llamacpp_spec(args.llama_bin, model, texts, args.max_tokens, k,
                                           args.repeats, draft=spec.get("model") if k else None,
                                           threads=args.threads, ngl=0)
            print(f"llama.cpp example {name:8s} {examples[name]['tok_s']:8.1f} tok/s  "
                  f"({examples[name]['tokens']} tokens, median of {args.repeats})")
    st = specd.llm_engine.scheduler.make_stats()
    acceptance = st.spec_decode_num_accepted_tokens / max(1, st.spec_decode_num_draft_tokens)
    r = {k: v["tok_s"] for k, v in results.items()}
    ratios = {f"{m} vs none, c1": r[f"vllmx+{m} c1"] / r["vllmx c1"],
              f"{m} vs none, c8": r[f"vllmx+{m} c8"] / r["vllmx c8"]}
    if "llama.cpp+lookup c1" in r:
        ratios["ngram vs llama.cpp lookup, c1"] = r["vllmx+ngram c1"] / r["llama.cpp+lookup c1"]
        ratios["llama.cpp lookup vs none, c1"] = r["llama.cpp+lookup c1"] / r["llama.cpp c1"]
    if "llama.cpp c1" in r:
        ratios[f"vllmx+{m} vs llama.cpp, c1"] = r[f"vllmx+{m} c1"] / r["llama.cpp c1"]
    if examples:
        ex = {k: v["tok_s"] for k, v in examples.items()}
        ratios[f"vllmx+{m} vs llama.cpp example {m}, c1"] = r[f"vllmx+{m} c1"] / ex[m]
        ratios[f"llama.cpp example {m} vs none"] = ex[m] / ex["none"]
        ratios["vllmx vs llama.cpp example, no speculation, c1"] = r["vllmx c1"] / ex["none"]
    for k, v in ratios.items():
        print(f"{k:48s} {v:5.2f}x")
    print(f"draft acceptance {acceptance:.2f}")
    out = {"model": os.path.basename(model), "threads": args.threads, "cpu": cpu_name(),
           "vllmx": __version__, "llama_cpp_python": llama_cpp.__version__,
           "commit": git_commit(), "speculative_config": spec, "max_tokens": args.max_tokens,
           "repeats": args.repeats, "structured": args.structured, "accept0": args.accept0,
           "results": results, "llama.cpp examples": examples,
           "ratios": ratios, "failed": failed,
           "acceptance": acceptance}
    name = os.path.basename(model) + (f"_draft_{os.path.basename(args.draft)}" if args.draft
                                       else "") + ("_structured" if args.structured else "") + (
        "_accept0" if args.accept0 else "")
    write_result(f"spec_decode_cpu_{name}.json", out)


if __name__ == "__main__":
    main()
