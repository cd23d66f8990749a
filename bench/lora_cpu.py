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

On the GPU (no internet there, no torch needed), in the same call: `--write-dummy DIR --shape
qwen3-0.6b` writes that shape's config.json and --adapters random PEFT adapters of its shapes
(numpy; 39 MB each for Qwen3-0.6B at rank 16, too much to carry), then `--workdir DIR --device
cuda --load-format dummy` runs them (bf16, CUDA graphs).
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


def save_safetensors(tensors: dict, path: str) -> None:
    """f32 arrays as a safetensors file (an 8-byte header size, the JSON header, the bytes),
    without the safetensors package, which the GPU machine's image may lack."""
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for a in tensors.values():
            f.write(a.tobytes())


def write_dummy(workdir: str, shape: str, adapters: int, rank: int) -> tuple[str, list[str]]:
    """A random-weight shape's config.json (bench/gpu_vs_vllm.py's shapes) and random PEFT
    adapters of its projections' shapes, written with numpy (no transformers model built)."""
    from gpu_vs_vllm import write_config

    base = write_config(shape, os.path.join(workdir, "base"))
    return base, write_adapters(workdir, shape, adapters, rank)


def write_adapters(workdir: str, shape: str, adapters: int, rank: int,
                   layers: int | None = None) -> list[str]:
    """--adapters random PEFT adapters of rank `rank` on every projection of the shape's first
    `layers` layers (default all), as workdir/lora{a}-r{rank}; their paths."""
    import numpy as np
    from gpu_vs_vllm import SHAPES

    spec = SHAPES[shape]
    hidden, inter = spec["hidden_size"], spec["intermediate_size"]
    heads, kv = spec["num_attention_heads"], spec.get("num_key_value_heads", 0)
    head_dim = spec.get("head_dim") or hidden // heads
    dims = {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, (kv or heads) * head_dim),
            "v_proj": (hidden, (kv or heads) * head_dim), "o_proj": (heads * head_dim, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}
    paths = []
    for a in range(adapters):
        rng = np.random.default_rng(a + 1)
        tensors = {}
        for i in range(layers or spec["num_hidden_layers"]):
            for m, (k, n) in dims.items():
                part = "self_attn" if m.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) \
                    else "mlp"
                name = f"base_model.model.model.layers.{i}.{part}.{m}"
                tensors[f"{name}.lora_A.weight"] = (rng.standard_normal((rank, k))
                                                    / np.sqrt(k)).astype(np.float32)
                tensors[f"{name}.lora_B.weight"] = (rng.standard_normal((n, rank))
                                                    / np.sqrt(rank)).astype(np.float32)
        path = os.path.join(workdir, f"lora{a}-r{rank}")
        os.makedirs(path, exist_ok=True)
        save_safetensors(tensors, os.path.join(path, "adapter_model.safetensors"))
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                       "target_modules": TARGETS, "bias": "none"}, f)
        paths.append(path)
    return paths


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
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--load-format", default="auto", help="dummy: random weights (GPU shapes)")
    ap.add_argument("--write-dummy", metavar="DIR",
                    help="write --shape's config and random adapters into DIR, then exit")
    ap.add_argument("--shape", default="qwen3-0.6b")
    args = ap.parse_args()
    if args.write_dummy:
        write_dummy(args.write_dummy, args.shape, args.adapters, args.rank)
        return
    if args.load_format == "dummy":
        base = os.path.join(args.workdir, "base")
        paths = [os.path.join(args.workdir, f"lora{a}-r{args.rank}")
                 for a in range(args.adapters)]
    else:
        base, paths = write_checkpoints(args.workdir, args.adapters, args.rank)
        if args.dtype == "bfloat16":
            base += "-bf16"

    from vllmx import LLM, SamplingParams
    from vllmx.lora.request import LoRARequest

    common = {"skip_tokenizer_init": True, "num_threads": args.threads,
              "max_num_seqs": args.batch, "max_model_len": 512, "enable_prefix_caching": False,
              "device": args.device, "load_format": args.load_format}
    if args.device != "cpu":  # two engines share the GPU: a fixed cache each, not a fraction
        common["kv_cache_memory_bytes"] = 4 << 30
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
    on_gpu = args.device != "cpu"
    name = ("lora_gpu.json" if on_gpu else
            "lora_cpu_bf16.json" if args.dtype == "bfloat16" else "lora_cpu.json")
    write_result(name, {
        "shape": args.shape if on_gpu else f"SmolLM2-135M (random, {args.dtype})",
        "device": args.device, "batch": args.batch,
        "adapters": args.adapters,
        "rank": args.rank, "new_tokens": n, "threads": args.threads, "repeats": args.repeats,
        "decode_tok_s": rate, "ratio": ratio, "commit": git_commit(), "cpu": cpu_name()})


if __name__ == "__main__":
    main()
