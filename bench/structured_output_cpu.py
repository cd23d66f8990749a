"""What structured output costs in decode throughput, same engine, same prompts, one run
(issue 16's bar: at most 10% at batch 32 on the CPU with SmolLM2).

32 chat prompts, greedy, 64 new tokens each, generated as one batch three times: free (EOS
ignored) and under two constraints no 64-token answer can finish, so that every step is masked
by llguidance and none is cut short:
- json: an app's JSON schema (an object with a topic string and a list of at least 100 word
  strings), the kind of request vLLM's structured-output benchmark sends;
- regex `[a-z ]{600}`: a bounded repetition, llguidance's costly case (every step's lexer state
  is new, so its token-trie walk finds nothing cached: ~10x the json mask's time);
- json_compact: the json schema with disable_any_whitespace, whose `","` between the words the
  grammar forces: the runner fast-forwards those tokens (appended unsampled, their KV computed
  with the next step's), so its tok/s counts tokens the steps did not sample one by one.
--sampling adds free requests with 5 top logprobs and with penalties, the other sampling that
reads host state. Decode is timed by the requests' own clocks (RequestOutput.metrics): from the
step that gave the last first token (the batch's prefill) to the last token, decode tok/s =
batch * (new tokens - 1) / that span. (Until 2026-12-05 the prefill was timed in a run of its
own and taken off each run's wall time, as bench/gpu_vs_vllm.py does against vLLM; on the 2-core
machines that run's time and the prefill inside each run differed by up to 0.3 s from run to
run, a constant ~10% of decode charged or credited to whichever run followed.) Alternating
runs, the best of --repeats: the 2-core machines run in two speeds ~20% apart that last a few
seconds each (2026-12-05, free decode 1.84 / 1.50 / 1.79 / 1.46 s in turn), so a median
compares whichever speed each setting happened to get.

    python bench/structured_output_cpu.py [--model PATH_OR_ALIAS] [--threads 2] [--batch 32]

On the GPU (which has no internet, so no default model to download): write a random-weight
checkpoint of a real shape with the default model's tokenizer here, carry it, and run it there
with load_format="dummy":

    python bench/structured_output_cpu.py --write-dummy .gpu/so-qwen3 [--shape qwen3-0.6b]
    python bench/structured_output_cpu.py --model .gpu/so-qwen3 --load-format dummy --device cuda
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from cpu_vs_llamacpp_lib import cpu_name, git_commit, write_result

QUESTION = "Write a long list of lowercase words about {}, separated by spaces."
TOPICS = ["rivers", "cities", "birds", "trees", "music", "stars", "bread", "ships"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="path or alias (default: vllmx's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--load-format", default="auto", help="dummy: random weights (GPU shapes)")
    ap.add_argument("--write-dummy", metavar="DIR",
                    help="write a --shape config with the default model's tokenizer, then exit")
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--sampling", action="store_true",
                    help="also time free requests with 5 top logprobs and with penalties (what "
                         "the other sampling that crosses to the host costs)")
    args = ap.parse_args()
    if args.write_dummy:
        write_dummy(args.write_dummy, args.shape)
        return

    from vllmx import LLM, SamplingParams
    from vllmx.sampling_params import StructuredOutputsParams

    kw = {"model": args.model} if args.model else {}
    llm = LLM(**kw, num_threads=args.threads, max_num_seqs=args.batch, device=args.device,
              load_format=args.load_format, max_model_len=2048)  # chat prompt + new tokens
    tok = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": tok.apply_chat_template(
        [{"role": "user", "content": QUESTION.format(TOPICS[i % len(TOPICS)]) + f" ({i})"}],
        add_generation_prompt=True)} for i in range(args.batch)]
    n = args.new_tokens
    constraints = {
        "json": StructuredOutputsParams(json={
            "type": "object", "required": ["topic", "words"],
            "properties": {"topic": {"type": "string"}, "words": {
                "type": "array", "items": {"type": "string"}, "minItems": 100}}}),
        "regex": StructuredOutputsParams(regex="[a-z ]{600}"),
    }
    # The json schema without free whitespace: its punctuation between the words (`","`) is
    # forced, so the runner fast-forwards it (appended unsampled, computed in the next step).
    constraints["json_compact"] = dataclasses.replace(constraints["json"],
                                                      disable_any_whitespace=True)
    runs = {"free": SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)}
    runs.update({name: SamplingParams(temperature=0, max_tokens=n, structured_outputs=so)
                 for name, so in constraints.items()})
    if args.sampling:
        runs["logprobs"] = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=5)
        runs["penalties"] = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                                           repetition_penalty=1.1, presence_penalty=0.5)

    def decode_time(sp) -> float:
        """Seconds from the batch's last first token to its last token."""
        llm.reset_prefix_cache()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == sp.max_tokens for o in outs), \
            "a run stopped early: the comparison needs every request at max_tokens"
        return (max(o.metrics.last_token_time for o in outs)
                - max(o.metrics.first_token_time for o in outs))

    decode_time(SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    for name in constraints:
        decode_time(runs[name])  # warm-up, and llguidance's grammar compiled
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, sp in runs.items():
            times[name].append(decode_time(sp))
    print("  decode seconds:", {k: [round(x, 3) for x in v] for k, v in times.items()})
    rate = {name: args.batch * (n - 1) / min(ts) for name, ts in times.items()}
    cost = {name: 1 - rate[name] / rate["free"] for name in runs if name != "free"}
    print(f"batch {args.batch}, {n} new tokens, {args.threads} threads, best of {args.repeats}")
    print(f"  decode tok/s: free {rate['free']:.1f}, "
          + ", ".join(f"{name}{'-constrained' if name in constraints else ''} "
                      f"{rate[name]:.1f} (costs {cost[name] * 100:.1f}%)" for name in cost))
    on_gpu = args.device != "cpu"
    write_result("structured_output_gpu.json" if on_gpu else "structured_output_cpu.json", {
        "model": os.path.basename(llm.llm_engine.config.model_config.model), "batch": args.batch,
        "new_tokens": n, "threads": args.threads, "repeats": args.repeats,
        "decode_tok_s": rate, "cost": cost, "commit": git_commit(),
        "device": args.device, "load_format": args.load_format, "cpu": cpu_name()})


def write_dummy(out_dir: str, shape: str) -> None:
    """config.json of `shape` (bench/gpu_vs_transformers.py's shapes) sized to the default
    model's vocabulary, and that tokenizer (tokenizer.json, its chat template and special
    tokens) beside it: a checkpoint load_format="dummy" fills with random weights."""
    import json

    from gpu_vs_vllm import write_config

    from vllmx.loader.model_source import DEFAULT_MODEL, fetch_builtin
    from vllmx.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf_file(fetch_builtin(DEFAULT_MODEL))  # (its weights not loaded)
    write_config(shape, out_dir)
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               tie_word_embeddings=True)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    tok.backend_tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.bos_token,
                   "eos_token": tok.eos_token, "chat_template": tok.chat_template}, f)
    print(f"wrote {out_dir}: {shape} shape, vocabulary {len(tok)}")


if __name__ == "__main__":
    main()
