"""vllmx against vLLM on the same GPU, in one run: offline throughput at each batch size, and
(--serve) the two OpenAI servers under `vllmx bench serve` at each concurrency.

Both engines load the same config.json with load_format="dummy" (random weights of the real
shapes, made on the machine: no tens of GB of files), or with --random-weights the same random
safetensors written on the machine (random_checkpoint.py: for mixtures of experts, whose routing
on dummy weights differs between the engines; --layers N keeps the file small), and run the
same token-id prompts, greedy,
EOS ignored, with the same max_model_len, max_num_seqs and gpu_memory_utilization; each engine
runs in a process of its own. vLLM runs with its defaults (torch.compile, CUDA graphs,
FlashAttention 3). Per model, workload (input/output lengths) and batch:

  prefill tok/s = batch * input_len / (time of a generate with 1 new token)
  total tok/s   = batch * (input_len + output_len) / (time of the full generate)
  decode tok/s  = batch * output_len / (full time - prefill time)

plus load-to-ready time (constructor to first generate possible), the device memory in use
after loading (both reserve gpu_memory_utilization of it up front), and batch-1 decode against
the bandwidth limit (weight bytes / measured device copy bandwidth).

The serving run starts `vllmx serve` and `vllm serve` (one at a time, same flags, a trivial
byte-level BPE tokenizer written beside config.json: the random dataset sends token ids, the
tokenizer only supplies the vocabulary) and drives each with `vllmx bench serve --dataset-name
random` at each --concurrency (4 x concurrency prompts, at least 16): output tok/s, TTFT and TPOT
median and p99.

vLLM 0.26.0 comes from the gpu-peers bundle (its install.sh puts it in --vllm-site); the vLLM
worker gets that folder on its PYTHONPATH, the vllmx worker does not.

    python bench/gpu_vs_vllm.py                                  # both models, both workloads
    python bench/gpu_vs_vllm.py --models llama-3-8b --workloads 1024:128:1,8,32
    python bench/gpu_vs_vllm.py --models qwen3-0.6b --serve --concurrency 1 4 16 64 256
    python bench/gpu_vs_vllm.py --models llama-3-8b --serve --skip-offline --engines vllmx \
        --concurrency 64 256 --py-spy /tmp/site/bin/py-spy     # + where the server's GIL goes
    python bench/gpu_vs_vllm.py --models qwen3-30b-a3b --workloads 1024:128:1,8,32,64
    python bench/gpu_vs_vllm.py --models deepseek-v2-lite --workloads 1024:128:1,8,32,64
    python bench/gpu_vs_vllm.py --models qwen3.5-35b-a3b --workloads 1024:128:1,2,4,8,16,32
    python bench/gpu_vs_vllm.py --engines vllmx --vllm-results bench/results/gpu_vs_vllm.json

--vllm-results takes vLLM's numbers from an earlier report (same machine kind, same workloads)
instead of running vLLM again, when only vllmx changed: the report says which file and commit
they came from, and that they are not from the same run.

On the lent machine (600 s a command) run one model per command: vLLM's first start takes about
100 s. The report is rewritten after each engine finishes (gpu_vs_vllm.partial.json until the
last one), so a command cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_vs_llamacpp_lib import git_commit  # noqa: E402
from gpu_vs_transformers import SHAPES as DENSE_SHAPES  # noqa: E402
from gpu_vs_transformers import copy_bandwidth, prompts, summarize  # noqa: E402
from gpu_vs_vllm_serve import print_serve_table, serve_run, write_tokenizer  # noqa: E402
from peer_process import engine_env, worker_result  # noqa: E402

QWEN3_5_COMMON = dict(linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                      full_attention_interval=4, attn_output_gate=True, rope_theta=1e7,
                      partial_rotary_factor=0.25, tie_word_embeddings=False,
                      max_position_embeddings=262144)
# Beside the dense shapes, a mixture of experts of Qwen3-30B-A3B's shape (48 layers, 128
# experts of 768, top-8): issue 19's MoE benchmark (transformers has no fast MoE to compare).
# vLLM's block-scaled fp8 checkpoints' quantization_config (DeepSeek-V3, Qwen3-*-FP8): --fp8.
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [128, 128]}
SHAPES = {**DENSE_SHAPES,
          "qwen3-30b-a3b": dict(arch="Qwen3Moe", model_type="qwen3_moe", vocab_size=151936,
                                hidden_size=2048, intermediate_size=6144,
                                moe_intermediate_size=768, num_hidden_layers=48,
                                num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                decoder_sparse_step=1, mlp_only_layers=[],
                                tie_word_embeddings=False, max_position_embeddings=40960),
          # DeepSeek-V2-Lite (issue 19's MLA benchmark): multi-head latent attention (a 512-wide
          # latent + 64 rope dims cached per token), 64 routed experts of 1408 (top-6) and 2
          # shared, a dense first layer.
          "deepseek-v2-lite": dict(arch="DeepseekV2", model_type="deepseek_v2",
                                   vocab_size=102400, hidden_size=2048,
                                   intermediate_size=10944, moe_intermediate_size=1408,
                                   num_hidden_layers=27, num_attention_heads=16,
                                   num_key_value_heads=16, n_routed_experts=64,
                                   n_shared_experts=2, num_experts_per_tok=6,
                                   first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=512,
                                   q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                   v_head_dim=128, topk_method="greedy", n_group=1,
                                   topk_group=1, routed_scaling_factor=1.0,
                                   norm_topk_prob=False, scoring_func="softmax",
                                   rope_theta=10000.0, tie_word_embeddings=False,
                                   max_position_embeddings=163840,
                                   rope_scaling={"type": "yarn", "factor": 40,
                                                 "original_max_position_embeddings": 4096,
                                                 "beta_fast": 32, "beta_slow": 1,
                                                 "mscale": 0.707, "mscale_all_dim": 0.707}),
          # Qwen3.5 (issue 15's hybrids): three Gated DeltaNet layers (16 key heads, 128-wide
          # states) to each gated full-attention layer, text configs as the checkpoints' own.
          "qwen3.5-27b": dict(arch="Qwen3_5", model_type="qwen3_5_text", vocab_size=248320,
                              hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                              num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                              linear_num_key_heads=16, linear_num_value_heads=48,
                              **QWEN3_5_COMMON),
          "qwen3.5-35b-a3b": dict(arch="Qwen3_5Moe", model_type="qwen3_5_moe_text",
                                  vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
                                  num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                                  linear_num_key_heads=16, linear_num_value_heads=32,
                                  num_experts=256, num_experts_per_tok=8,
                                  moe_intermediate_size=512, shared_expert_intermediate_size=512,
                                  **QWEN3_5_COMMON)}

WORKLOADS = ["1024:128:1,8,32,128,256", "7936:64:1,4,16"]
def parse_workload(text: str) -> tuple[int, int, list[int]]:
    inp, out, batches = text.split(":")
    return int(inp), int(out), [int(b) for b in batches.split(",")]


def write_config(name: str, out_dir: str, **overrides) -> str:
    """config.json of shape `name` (overrides: fields changed, e.g. num_hidden_layers)."""
    spec = dict(SHAPES[name], **overrides)
    arch = spec.pop("arch")
    model_type = spec.pop("model_type", arch.lower())
    os.makedirs(out_dir, exist_ok=True)
    cfg = {"architectures": [f"{arch}ForCausalLM"], "model_type": model_type,
           "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "hidden_act": "silu",
           "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 1e6, **spec}
    if arch.startswith("Qwen3_5"):
        # As the checkpoints ship: ...ForConditionalGeneration around the text config (vLLM
        # registers Qwen3.5 only so); the vision tower's defaults, unused (no image inputs).
        cfg = {"architectures": [f"{arch}ForConditionalGeneration"],
               "model_type": model_type.removesuffix("_text"), "torch_dtype": "bfloat16",
               "tie_word_embeddings": cfg["tie_word_embeddings"], "text_config": cfg,
               "vision_config": {}}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return out_dir


def weight_bytes(path: str) -> int:
    from vllmx.models.registry import get_model_class

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    shapes = get_model_class(cfg).checkpoint_shapes(cfg)
    # bf16, but for an fp8 checkpoint's projections: a byte a weight and an f32 scale a 128 x 128
    # block (its embeddings, norms and lm_head stay bf16).
    fp8 = cfg.get("quantization_config", {}).get("quant_method") == "fp8"
    total = 0
    for name, s in shapes.items():
        if fp8 and len(s) == 2 and "proj" in name:
            total += math.prod(s) + 4 * math.ceil(s[0] / 128) * math.ceil(s[1] / 128)
        else:
            total += 2 * math.prod(s)
    return total


# ---- the two workers: each builds its engine, then measure() runs the same loop ----

def measure(generate, reset, workloads, vocab) -> dict:
    """generate(prompts, new_tokens) runs one batch to completion; reset() empties the prefix
    cache, so that each timed run computes every prompt token."""
    results = {}
    for inp, out, batches in workloads:
        for b in batches:
            ps = prompts(b, inp, vocab)
            # Warm-up: the whole workload once. vLLM compiles Triton kernels (its fused MoE,
            # FLA's) the first time a shape comes; with a short warm-up that landed in the timed
            # run (a 1,024 / 128 batch-8 run of Qwen3.5 took 4.4 s where batch 32 took 1.6).
            generate(ps, out)

            def fresh(new):
                reset()
                t = time.perf_counter()
                generate(ps, new)
                return time.perf_counter() - t

            t_prefill = min(fresh(1) for _ in range(2))
            t_total = fresh(out)
            results[f"{inp}:{out}:{b}"] = r = summarize(b, inp, out, t_prefill, t_total, 0)
            r.pop("peak_gib")
            print(f"  {inp}/{out} batch {b}: {r}", flush=True)
    return results


def vllmx_worker(path, workloads, vocab, max_len, max_seqs, max_tokens, util, device,
                 load_format, quantization=None, attention_decode=None) -> dict:
    from vllmx import _C, LLM, SamplingParams

    if attention_decode:  # (before the engine captures its decode graphs)
        _C.cuda_attention_tuning(attention_decode)
    t0 = time.perf_counter()
    llm = LLM(path, load_format=load_format, skip_tokenizer_init=True, device=device,
              max_model_len=max_len, max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens,
              gpu_memory_utilization=util, quantization=quantization)
    load_s = time.perf_counter() - t0
    free, total = _C.cuda_mem_get_info() if device == "cuda" else (0, 0)

    def generate(ps, new):
        sp = SamplingParams(temperature=0, max_tokens=new, min_tokens=new, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == new for o in outs)

    res = measure(generate, llm.reset_prefix_cache, workloads, vocab)
    return {"load_s": load_s, "mem_gib": (total - free) / 2**30, "runs": res}


def vllm_worker(path, workloads, vocab, max_len, max_seqs, max_tokens, util, device,
                load_format, quantization=None) -> dict:
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    with open(os.path.join(path, "config.json")) as f:
        vision = "vision_config" in json.load(f)
    llm = LLM(model=path, load_format=load_format, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=max_len, max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens,
              gpu_memory_utilization=util, seed=0, quantization=quantization,
              # (text only: vLLM then builds no vision tower, as vllmx never does)
              **({"limit_mm_per_prompt": {"image": 0, "video": 0}} if vision else {}),
              # Gated DeltaNet prefill: vLLM's default on Hopper is FlashInfer's kernel, which
              # the gpu-peers bundle does not carry; its Triton kernels (FLA's) instead.
              additional_config={"gdn_prefill_backend": "triton"})
    load_s = time.perf_counter() - t0
    free, total = torch.cuda.mem_get_info()

    def generate(ps, new):
        sp = SamplingParams(temperature=0, max_tokens=new, min_tokens=new, ignore_eos=True,
                            detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sp, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == new for o in outs)

    res = measure(generate, llm.reset_prefix_cache, workloads, vocab)
    return {"load_s": load_s, "mem_gib": (total - free) / 2**30, "runs": res,
            "version": vllm.__version__}


WORKERS = {"vllmx": vllmx_worker, "vllm": vllm_worker}


def run_worker(engine: str, args, path: str, vocab: int) -> dict:
    env = engine_env(engine, args.vllm_site)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--path", path,
           "--vocab", str(vocab), "--workloads", *args.workloads, "--max-num-seqs",
           str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
           "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--device", args.device,
           "--load-format", "auto" if args.random_weights else "dummy"]
    if args.quantization:
        cmd += ["--quantization", args.quantization]
    if engine == "vllmx" and args.attention_decode:
        cmd += ["--attention-decode", args.attention_decode]
    print(f"-- {engine}", flush=True)
    return worker_result(cmd, env, args.worker_timeout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(DENSE_SHAPES), choices=list(SHAPES))
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS,
                   help="INPUT:OUTPUT:B1,B2,... (prompt and generated tokens, batch sizes)")
    ap.add_argument("--engines", nargs="+", default=list(WORKERS), choices=list(WORKERS))
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192,
                    help="the chunked-prefill budget, the same for both engines")
    ap.add_argument("--worker-timeout", type=float, default=540)
    ap.add_argument("--device", default="cuda", help="vllmx's device (cpu: a dry run of the "
                    "harness on a machine without a GPU, vllmx only)")
    ap.add_argument("--skip-offline", action="store_true", help="the serving run only")
    ap.add_argument("--serve", action="store_true",
                    help="also the serving run (the first workload's lengths)")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 64, 256])
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--vllm-site", default="/root/vllm-site")
    ap.add_argument("--py-spy", default=None, metavar="PATH",
                    help="py-spy binary: GIL profile of vllmx's server at concurrency >= 64")
    ap.add_argument("--vllm-results", default=None,
                    help="vLLM's offline numbers from an earlier report of this script, instead "
                         "of running vLLM (with --engines vllmx)")
    ap.add_argument("--workdir", default="/tmp/vllmx-vs-vllm")
    ap.add_argument("--layers", type=int, default=0,
                    help="num_hidden_layers (0: the shape's); with --random-weights, a file "
                         "that fits the disk")
    ap.add_argument("--random-weights", action="store_true",
                    help="both engines load the same random safetensors written here "
                         "(random_checkpoint.py; MoE routing as spread as a trained model's) "
                         "instead of their dummy weights")
    ap.add_argument("--fp8", action="store_true",
                    help="the shapes as block-scaled fp8 checkpoints (quant_method fp8, 128 x 128 "
                         "blocks): dummy fp8 projections in both engines, W8A8 on Hopper")
    ap.add_argument("--quantization", default=None,
                    help="vLLM's quantization argument for both engines, e.g. fp8: online fp8 of "
                         "the dense dummy weights (W8A8 on Hopper)")
    ap.add_argument("--attention-decode", choices=["split", "balanced"], default=None,
                    help="vllmx's decode attention kernel in place of its planner's "
                         "(cuda_attention_tuning; benchmarks only)")
    ap.add_argument("--load-format", default="dummy", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    workloads = [parse_workload(w) for w in args.workloads]
    max_len = max(i + o for i, o, _ in workloads) + 64
    if args.worker:
        res = WORKERS[args.worker](args.path, workloads, args.vocab, max_len, args.max_num_seqs,
                                   args.max_num_batched_tokens, args.gpu_memory_utilization,
                                   args.device, args.load_format, args.quantization,
                                   **({"attention_decode": args.attention_decode}
                                      if args.worker == "vllmx" else {}))
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    if args.device == "cuda":
        import torch

        bw = copy_bandwidth()
        torch.cuda.empty_cache()  # the engines' processes size their caches by what is free
        device = torch.cuda.get_device_name()
    else:
        bw, device = float("nan"), args.device
    print(f"device copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    report = {"device": device, "copy_bandwidth_tb_s": bw / 1e12,
              "commit": git_commit(), "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens,
              "gpu_memory_utilization": args.gpu_memory_utilization,
              "weights": "random safetensors" if args.random_weights else "dummy",
              **({"attention_decode": args.attention_decode} if args.attention_decode else {}),
              "models": {}}
    earlier = None
    if args.vllm_results:
        with open(args.vllm_results) as f:
            earlier = json.load(f)
        report["vllm_from"] = {"file": args.vllm_results, "commit": earlier.get("commit"),
                               "device": earlier.get("device"), "same_run": False}
    for name in args.models:
        print(f"== {name}", flush=True)
        layers = {"num_hidden_layers": args.layers} if args.layers else {}
        if args.fp8:
            layers["quantization_config"] = FP8_CONFIG
        path = write_config(name, os.path.join(args.workdir, name + (
            f"-{args.layers}-layers" if args.layers else "") + ("-fp8" if args.fp8 else "")),
            **layers)
        entry = {"weight_gb": weight_bytes(path) / 1e9, **layers}
        if args.random_weights:
            from random_checkpoint import write_random_weights

            t0 = time.perf_counter()
            print(f"  wrote {write_random_weights(path):.1f} GB of random weights in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
        if earlier is not None and "vllm" in earlier["models"].get(name, {}):
            entry["vllm"] = earlier["models"][name]["vllm"]
        entry["bandwidth_limit_tok_s"] = bw / (entry["weight_gb"] * 1e9)
        report["models"][name] = entry
        for engine in [] if args.skip_offline else args.engines:
            entry[engine] = run_worker(engine, args, path, SHAPES[name]["vocab_size"])
            save(report, "gpu_vs_vllm.partial.json")
        if args.serve:
            write_tokenizer(path, SHAPES[name]["vocab_size"])
            for engine in args.engines:
                entry[f"{engine}_serve"] = serve_run(engine, args, path, max_len,
                                                       workloads[0][:2])
                save(report, "gpu_vs_vllm.partial.json")
    print_table(report)
    if args.serve:
        print_serve_table(report)
    failed = any("error" in v for m in report["models"].values() for k, v in m.items()
                 if isinstance(v, dict))
    # (A run against an earlier run's vLLM numbers never replaces a same-run report.)
    name = "gpu_vs_vllm_earlier_vllm" if earlier is not None else "gpu_vs_vllm"
    save(report, f"{name}.failed.json" if failed else f"{name}.json")
    return 1 if failed else 0


def save(report: dict, name: str) -> None:
    """The report into bench/results/ (GPU runs only: a dry run is no result) and $OUT (the
    device tool brings $OUT back)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    for d in (here if report["device"] != "cpu" else None, os.environ.get("OUT")):
        if d:
            with open(os.path.join(d, name), "w") as f:
                json.dump(report, f, indent=1)


def print_table(report) -> None:
    print(f"\n{report['device']}, copy bandwidth {report['copy_bandwidth_tb_s']:.2f} TB/s, "
          f"commit {report['commit']}")
    if "vllm_from" in report:
        print(f"(vLLM's numbers from an earlier run: {report['vllm_from']['file']}, vllmx commit "
              f"{report['vllm_from']['commit']}; not the same run)")
    print("| model | in / out | batch | total tok/s vllmx / vLLM (x) | decode tok/s (x) "
          "| prefill tok/s (x) |\n|---|---|---|---|---|---|")
    for name, m in report["models"].items():
        vx, vl = m.get("vllmx", {}), m.get("vllm", {})
        if "runs" not in vx or "runs" not in vl:
            print(f"| {name} | no run: {'vllmx' if 'runs' not in vx else 'vLLM'} |")
            continue
        for key, a in vx["runs"].items():
            b = vl["runs"].get(key)
            if b is None:
                continue
            inp, out, batch = key.split(":")
            cells = [f"{a[k]:,.0f} / {b[k]:,.0f} ({a[k] / b[k]:.2f}x)"
                     for k in ("total_tok_s", "decode_tok_s", "prefill_tok_s")]
            print(f"| {name} | {inp} / {out} | {batch} | " + " | ".join(cells) + " |")
        print(f"  {name}: load-to-ready {vx['load_s']:.1f} s / {vl['load_s']:.1f} s; device "
              f"memory in use {vx['mem_gib']:.1f} / {vl['mem_gib']:.1f} GiB", end="")
        one = vx["runs"].get(next((k for k in vx["runs"] if k.endswith(":1")), ""), None)
        if one:
            print(f"; vllmx batch-1 decode {one['decode_tok_s']:.0f} tok/s = "
                  f"{one['decode_tok_s'] / m['bandwidth_limit_tok_s']:.0%} of the bandwidth "
                  f"limit {m['bandwidth_limit_tok_s']:.0f}", end="")
        print()


if __name__ == "__main__":
    sys.exit(main())
