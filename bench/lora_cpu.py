"""Multi-LoRA decode against the base model alone, same process, same prompts, one run (issue
17's measure, there on the GPU at batch 32 with 4 adapters: >= 0.8x the base model alone).

A random-weight checkpoint of SmolLM2-135M's shape (f32 safetensors, LoRA's CPU dtype) and
--adapters random PEFT adapters of rank --rank on every projection are written by
transformers + peft into --workdir (once). Two engines: the base model alone, and the same
checkpoint with enable_lora (max_loras = --adapters), whose --batch requests cycle through the
adapters. Greedy, --new-tokens each, EOS ignored; decode timed by the requests' own clocks
(the batch's last first token to its last token), alternating runs, the best of --repeats.

    python bench/lora_cpu.py --threads 2 [--batch 32 --adapters 4 --rank 16 --repeats 5]
                             [--dtype bfloat16: the base's weights in bf16, the adapters too]
"""

from __future__ import annotations

import argparse
import json
import os

from cpu_vs_llamacpp_lib import cpu_name, git_commit, write_result

SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
         "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
         "max_position_embeddings": 2048, "tie_word_embeddings": True, "rms_norm_eps": 1e-5}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_checkpoints(workdir: str, adapters: int, rank: int) -> tuple[str, list[str]]:
    """The base checkpoint and the adapters' directories (written where missing)."""
    import peft
    import torch
    import transformers

    base = os.path.join(workdir, "base")
    if not os.path.exists(os.path.join(base, "config.json")):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE))
        model.save_pretrained(base, safe_serialization=True)
        model.to(torch.bfloat16).save_pretrained(base + "-bf16", safe_serialization=True)
    paths = []
    for i in range(adapters):
        path = os.path.join(workdir, f"lora{i}-r{rank}")
        if not os.path.exists(os.path.join(path, "adapter_config.json")):
            torch.manual_seed(i + 1)
            model = peft.get_peft_model(
                transformers.LlamaForCausalLM.from_pretrained(base),
                peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS,
                                init_lora_weights=False))
            model.save_pretrained(path)
        paths.append(path)
    return base, paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workdir", default="/tmp/vllmx-lora-bench")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the base checkpoint's weights (activations stay f32 on the CPU)")
    args = ap.parse_args()
    base, paths = write_checkpoints(args.workdir, args.adapters, args.rank)
    if args.dtype == "bfloat16":
        base += "-bf16"

    from vllmx import LLM, SamplingParams
    from vllmx.lora.request import LoRARequest

    common = {"skip_tokenizer_init": True, "num_threads": args.threads,
              "max_num_seqs": args.batch, "max_model_len": 512, "enable_prefix_caching": False}
    engines = {"base": LLM(base, **common),
               "lora": LLM(base, enable_lora=True, max_loras=args.adapters,
                           max_lora_rank=args.rank, **common)}
    loras = [LoRARequest(f"lora{i}", i + 1, p) for i, p in enumerate(paths)]
    per_request = {"base": None, "lora": [loras[i % len(loras)] for i in range(args.batch)]}
    prompts = [{"prompt_token_ids": [1 + (i * 37 + j * 11) % 40000 for j in range(32)]}
               for i in range(args.batch)]
    n = args.new_tokens
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    def decode_time(name: str) -> float:
        outs = engines[name].generate(prompts, sp, use_tqdm=False,
                                      lora_request=per_request[name])
        return (max(o.metrics.last_token_time for o in outs)
                - max(o.metrics.first_token_time for o in outs))

    for name in engines:
        decode_time(name)  # warm-up
    times = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name in engines:
            times[name].append(decode_time(name))
    rate = {name: args.batch * (n - 1) / min(ts) for name, ts in times.items()}
    ratio = rate["lora"] / rate["base"]
    print(f"batch {args.batch}, {args.adapters} adapters of rank {args.rank}, {n} new tokens, "
          f"{args.threads} threads, best of {args.repeats}")
    print(f"  decode tok/s: base {rate['base']:.1f}, {args.adapters} adapters "
          f"{rate['lora']:.1f} ({ratio:.2f}x the base)")
    print("  decode seconds:", json.dumps({k: [round(x, 3) for x in v] for k, v in times.items()}))
    write_result("lora_cpu_bf16.json" if args.dtype == "bfloat16" else "lora_cpu.json", {
        "shape": f"SmolLM2-135M (random, {args.dtype})", "batch": args.batch,
        "adapters": args.adapters,
        "rank": args.rank, "new_tokens": n, "threads": args.threads, "repeats": args.repeats,
        "decode_tok_s": rate, "ratio": ratio, "commit": git_commit(), "cpu": cpu_name()})


if __name__ == "__main__":
    main()
