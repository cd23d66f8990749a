"""Speculative decoding on the GPU (issue 14's GPU benchmarks), in one run:

copy: SmolLM2-135M-Instruct in bf16 (a safetensors checkpoint made on the machine from vllmx's
default GGUF by transformers, so vllmx and vLLM 0.26.0 load the same weights), the CPU bench's
8 copy-heavy chat prompts (bench/spec_decode_cpu.py's TASKS, token ids from vllmx's chat
template, the same ids to both engines), greedy, --max-tokens new tokens (EOS ends a request
early): output tok/s over whole requests at concurrency 1 (one request after another) and 8,
without speculation and with ngram (prompt lookup, k = --k, lookup 2..4). Each engine runs in a
process of its own, vLLM's two configurations in one each; how many prompts' outputs are the
same with ngram as without is reported for both (bf16 on the GPU is not batch invariant), and
vllmx's must be the same in float32 (checked, its kernels' batch-invariant reference).

accept0: what a verify step costs when nothing is accepted: a random-weight target of
--target-shape (load_format dummy) and a random EAGLE-3 head written here for it (one midlayer,
fc over three of the target's layers, its own lm_head over a 32000-token draft vocabulary; its
drafts almost never match), vllmx with and without eagle3 at concurrency 1 and 8, random prompts
of 128 tokens, --max-tokens new tokens, EOS ignored. Issue 14's bar: at most 10% slower.

    python bench/spec_decode_gpu.py                       # both parts (vLLM from --vllm-site)
    python bench/spec_decode_gpu.py --parts accept0       # vllmx alone
    python bench/spec_decode_gpu.py --parts copy --engines vllmx
    python bench/spec_decode_gpu.py --parts llamacpp --llama-bin /root/llama.cpp-cuda/build/bin

llamacpp: the same comparison against llama.cpp's own prompt lookup decoding (its
examples/lookup: n-grams of 1 to 4 tokens from the context, k drafted, --spec-draft-n-max) on
the same file, vllmx's default GGUF (SmolLM2-135M-Instruct Q4_1), both on the GPU: vllmx with
and without ngram, and llama-lookup with k and with 0 drafts (plain decoding), one prompt after
another (concurrency 1, llama.cpp's example runs one sequence), the prompts as text with the
chat template applied (llama.cpp tokenizes them, special tokens parsed): new tokens over
prefill + decode seconds (llama.cpp's own timers), the median of --repeats. llama-lookup is an
example target: build llama.cpp with -DLLAMA_BUILD_EXAMPLES=ON.

The vLLM bundle comes from ../shared/gpu-peers (install.sh puts it in --vllm-site; its env also
supplies transformers for the conversion). Results: bench/results/spec_decode_gpu.json and $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_vs_vllm import write_config
from llamacpp_examples import llamacpp_spec
from peer_process import engine_env, worker_result
from spec_decode_cpu import TASKS

EAGLE3_DRAFT_VOCAB = 32000


def ngram_config(k: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4}


def timed_runs(generate, prompts, max_tokens, repeats, concurrency=(1, 8)) -> dict:
    """{concurrency: (median seconds, output ids)} for each concurrency: generate(batch,
    max_tokens) -> each prompt's output ids."""
    out = {}
    for c in concurrency:
        generate(prompts[:c], 8)  # warm-up of this batch size
        times, outs = [], None
        for _ in range(repeats):
            t = time.perf_counter()
            outs = [ids for i in range(0, len(prompts), c)
                    for ids in generate(prompts[i:i + c], max_tokens)]
            times.append(time.perf_counter() - t)
        out[c] = (statistics.median(times), outs)
    return out


def summarize(runs: dict) -> dict:
    return {f"c{c}": {"seconds": s, "tokens": sum(map(len, outs)),
                      "tok_s": sum(map(len, outs)) / s} for c, (s, outs) in runs.items()}


# ---- workers (each in its own process; the last stdout line "RESULT {json}") ----

def convert_worker(args) -> dict:
    """SmolLM2's GGUF -> a bf16 safetensors checkpoint with its tokenizer (transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(args.gguf)
    AutoTokenizer.from_pretrained(d, gguf_file=f).save_pretrained(args.path)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
    # Its weights are dequantized: nothing of the GGUF's quantization is kept.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(args.path)
    return {"path": args.path}


def vllmx_engine(model: str, args, spec, dtype="auto"):
    from vllmx import LLM

    return LLM(model, device=args.device, max_model_len=2048, enable_prefix_caching=False,
               kv_cache_memory_bytes=2 << 30, speculative_config=spec, dtype=dtype)


def vllmx_generate(llm, ignore_eos: bool = False):
    """run(batch of prompt ids, new tokens) -> each prompt's output ids, greedy."""
    from vllmx import SamplingParams

    def run(batch, new):
        sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=ignore_eos)
        outs = llm.generate([{"prompt_token_ids": x} for x in batch], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    return run


def chat_prompts(llm, tokenize: bool) -> list:
    """TASKS through the model's chat template: token ids, or the text."""
    tok = llm.get_tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=tokenize,
                                    add_generation_prompt=True) for t in TASKS]


def vllmx_copy_worker(args) -> dict:
    def engine(spec, dtype="auto"):
        return vllmx_engine(args.path, args, spec, dtype)

    plain, specd = engine(None), engine(ngram_config(args.k))
    prompts = chat_prompts(plain, tokenize=True)
    base = timed_runs(vllmx_generate(plain), prompts, args.max_tokens, args.repeats)
    spec = timed_runs(vllmx_generate(specd), prompts, args.max_tokens, args.repeats)
    st = specd.llm_engine.scheduler.make_stats()
    del plain, specd
    # bf16 on the GPU is not batch invariant (a 5-row verify step runs the skinny GEMM where a
    # 1-row decode step runs the GEMV), so a near tie can round the other way with drafts: how
    # many prompts agree is reported, as for vLLM. The f32 kernels are batch invariant: there
    # the outputs must be the same (checked).
    f32 = {name: timed_runs(vllmx_generate(engine(s, "float32")), prompts, args.max_tokens, 1)
           for name, s in (("none", None), ("ngram", ngram_config(args.k)))}
    for c in f32["none"]:
        if f32["ngram"][c][1] != f32["none"][c][1]:
            raise RuntimeError(f"vllmx + ngram in float32 at concurrency {c}: outputs differ "
                               f"without it")
    return {"prompts": prompts, "none": summarize(base), "ngram": summarize(spec),
            "acceptance": st.spec_decode_num_accepted_tokens
            / max(1, st.spec_decode_num_draft_tokens),
            "outputs with ngram = without (prompts, bf16)": {
                f"c{c}": sum(a == b for a, b in zip(spec[c][1], base[c][1])) for c in base},
            "outputs with ngram = without (float32)": "all (checked)",
            "outputs": base[1][1]}


def vllmx_gguf_worker(args) -> dict:
    """The llamacpp part's vllmx side: the GGUF itself, concurrency 1, without and with ngram;
    the prompts' texts for llama.cpp."""
    out = {}
    for name, spec in (("none", None), ("ngram", ngram_config(args.k))):
        llm = vllmx_engine(args.gguf, args, spec)
        prompts = chat_prompts(llm, tokenize=True)
        out[name] = summarize(timed_runs(vllmx_generate(llm), prompts, args.max_tokens,
                                         args.repeats, concurrency=(1,)))
        if spec is not None:
            st = llm.llm_engine.scheduler.make_stats()
            out["acceptance"] = (st.spec_decode_num_accepted_tokens
                                 / max(1, st.spec_decode_num_draft_tokens))
        out["texts"] = chat_prompts(llm, tokenize=False)
        out["prompt_tokens"] = sum(map(len, prompts))
        del llm
    return out


def vllm_copy_worker(args) -> dict:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.prompts) as f:
        prompts = json.load(f)
    spec = ngram_config(args.k) if args.spec else None
    llm = LLM(model=args.path, dtype="bfloat16", max_model_len=2048, seed=0,
              enable_prefix_caching=False, gpu_memory_utilization=0.5,
              speculative_config=spec)

    def run(batch, new):
        sp = SamplingParams(temperature=0, max_tokens=new, detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in batch], sp,
                            use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    runs = timed_runs(run, prompts, args.max_tokens, args.repeats)
    return {"results": summarize(runs), "outputs": runs[1][1], "version": vllm.__version__}


def eagle3_head(path: str, target_cfg: dict, seed: int = 0) -> str:
    """A random EAGLE-3 head (LlamaForCausalLMEagle3's layout, f16) for a target of target_cfg:
    its drafts are noise, so the target accepts almost none."""
    import numpy as np
    from safetensors.numpy import save_file

    h, nh, nkv = target_cfg["hidden_size"], target_cfg["num_attention_heads"], \
        target_cfg["num_key_value_heads"]
    hd, inter = target_cfg.get("head_dim") or h // nh, target_cfg["intermediate_size"]
    rng = np.random.default_rng(seed)

    def dense(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(
            np.float16)

    p, v = "midlayer.", EAGLE3_DRAFT_VOCAB
    w = {p + "self_attn.q_proj.weight": dense(nh * hd, 2 * h),
         p + "self_attn.k_proj.weight": dense(nkv * hd, 2 * h),
         p + "self_attn.v_proj.weight": dense(nkv * hd, 2 * h),
         p + "self_attn.o_proj.weight": dense(h, nh * hd),
         p + "mlp.gate_proj.weight": dense(inter, h), p + "mlp.up_proj.weight": dense(inter, h),
         p + "mlp.down_proj.weight": dense(h, inter), "fc.weight": dense(h, 3 * h),
         "lm_head.weight": dense(v, h)}
    for name in ("midlayer.input_layernorm", "midlayer.hidden_norm",
                 "midlayer.post_attention_layernorm", "norm"):
        w[name + ".weight"] = np.ones(h, np.float16)
    w["d2t"] = np.zeros(v, np.int64)  # draft id i is target id i
    w["t2d"] = np.arange(target_cfg["vocab_size"]) < v
    os.makedirs(path, exist_ok=True)
    save_file(w, os.path.join(path, "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
           "hidden_size": h, "intermediate_size": inter, "num_attention_heads": nh,
           "num_key_value_heads": nkv, "head_dim": hd, "num_hidden_layers": 1,
           "vocab_size": target_cfg["vocab_size"], "draft_vocab_size": v,
           "rms_norm_eps": target_cfg["rms_norm_eps"],
           "max_position_embeddings": target_cfg.get("max_position_embeddings", 8192),
           "rope_theta": target_cfg.get("rope_theta", 1e6), "torch_dtype": "float16"}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def vllmx_accept0_worker(args) -> dict:
    import numpy as np

    from vllmx import LLM

    with open(os.path.join(args.path, "config.json")) as f:
        cfg = json.load(f)
    head = eagle3_head(os.path.join(args.path, "eagle3-random"), cfg)
    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": args.k}

    def engine(s):
        return LLM(args.path, load_format="dummy", skip_tokenizer_init=True, device=args.device,
                   max_model_len=1024, enable_prefix_caching=False,
                   kv_cache_memory_bytes=4 << 30, speculative_config=s)

    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, cfg["vocab_size"], 128).tolist() for _ in range(8)]
    results = {}
    for name, s in (("none", None), ("eagle3", spec)):
        llm = engine(s)
        results[name] = summarize(timed_runs(vllmx_generate(llm, ignore_eos=True), prompts,
                                             args.max_tokens, args.repeats))
        if s is not None:
            st = llm.llm_engine.scheduler.make_stats()
            results["acceptance"] = (st.spec_decode_num_accepted_tokens
                                     / max(1, st.spec_decode_num_draft_tokens))
        del llm
    return results


def copy_ratios(copy: dict) -> dict:
    """Speedups with ngram, vllmx against vLLM with it, and how many prompts' outputs agree."""
    out = {}
    x, v = copy.get("vllmx", {}), copy.get("vllm", {})
    if "none" in x:
        for c in x["none"]:
            out[f"vllmx ngram vs none, {c}"] = x["ngram"][c]["tok_s"] / x["none"][c]["tok_s"]
    if "results" in v.get("none", {}) and "results" in v.get("ngram", {}):
        vn, vs = v["none"]["results"], v["ngram"]["results"]
        for c in vn:
            out[f"vllm ngram vs none, {c}"] = vs[c]["tok_s"] / vn[c]["tok_s"]
            if "ngram" in x:
                out[f"vllmx ngram vs vllm ngram, {c}"] = x["ngram"][c]["tok_s"] / vs[c]["tok_s"]
        out["vllm outputs with ngram = without (prompts)"] = sum(
            a == b for a, b in zip(v["none"]["outputs"], v["ngram"]["outputs"]))
        if "outputs" in x:
            out["vllmx outputs = vllm's (prompts)"] = sum(
                a == b for a, b in zip(x["outputs"], v["none"]["outputs"]))
    return out


WORKERS = {"convert": convert_worker, "vllmx-copy": vllmx_copy_worker,
           "vllm-copy": vllm_copy_worker, "vllmx-accept0": vllmx_accept0_worker,
           "vllmx-gguf": vllmx_gguf_worker}


def run_worker(name: str, args, **kw) -> dict:
    engine = "vllm" if name in ("convert", "vllm-copy") else "vllmx"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--k", str(args.k),
           "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats),
           "--device", args.device]
    for key, value in kw.items():
        cmd += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    print(f"-- {name} {kw}", flush=True)
    return worker_result(cmd, engine_env(engine, args.vllm_site), args.worker_timeout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", nargs="+", default=["copy", "accept0"],
                    choices=["copy", "accept0", "llamacpp"])
    ap.add_argument("--llama-bin", default="/root/llama.cpp-cuda/build/bin",
                    help="the folder of llama.cpp's llama-lookup (the llamacpp part)")
    ap.add_argument("--engines", nargs="+", default=["vllmx", "vllm"], choices=["vllmx", "vllm"])
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--target-shape", default="llama-3-8b", help="accept0's target")
    ap.add_argument("--target-layers", type=int, default=0, help="(0: the shape's)")
    ap.add_argument("--device", default="cuda", help="vllmx's (cpu: a dry run, no result)")
    ap.add_argument("--vllm-site", default="/root/vllm-site")
    ap.add_argument("--workdir", default="/tmp/vllmx-spec-gpu")
    ap.add_argument("--worker-timeout", type=float, default=540)
    ap.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--spec", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(WORKERS[args.worker](args)), flush=True)
        return

    from cpu_vs_llamacpp_lib import git_commit

    from vllmx.loader.model_source import DEFAULT_MODEL, resolve_model

    os.makedirs(args.workdir, exist_ok=True)
    report = {"commit": git_commit(), "k": args.k, "max_tokens": args.max_tokens,
              "repeats": args.repeats}
    if "copy" in args.parts:
        smol = os.path.join(args.workdir, "smollm2-135m-bf16")
        if not os.path.exists(os.path.join(smol, "config.json")):
            r = run_worker("convert", args, gguf=resolve_model(DEFAULT_MODEL), path=smol)
            if "error" in r:
                raise SystemExit("converting the GGUF failed")
        copy = report["copy"] = {}
        if "vllmx" in args.engines:
            copy["vllmx"] = run_worker("vllmx-copy", args, path=smol)
        prompts = copy.get("vllmx", {}).get("prompts")
        if "vllm" in args.engines and prompts:
            pf = os.path.join(args.workdir, "prompts.json")
            with open(pf, "w") as f:
                json.dump(prompts, f)
            copy["vllm"] = {"none": run_worker("vllm-copy", args, path=smol, prompts=pf),
                            "ngram": run_worker("vllm-copy", args, path=smol, prompts=pf,
                                                spec=True)}
        report["copy_ratios"] = copy_ratios(copy)
        for side in (copy.get("vllmx", {}), *copy.get("vllm", {}).values()):
            side.pop("prompts", None)
            side.pop("outputs", None)
    if "llamacpp" in args.parts:
        gguf = resolve_model(DEFAULT_MODEL)
        x = run_worker("vllmx-gguf", args, gguf=gguf)
        lc = report["llamacpp"] = {"vllmx": x}
        if "texts" in x:
            texts = x.pop("texts")
            lc["llama.cpp"] = {name: llamacpp_spec(args.llama_bin, gguf, texts, args.max_tokens,
                                                   k, args.repeats)
                               for name, k in (("none", 0), ("lookup", args.k))}
            ln, ll = lc["llama.cpp"]["none"], lc["llama.cpp"]["lookup"]
            report["llamacpp_ratios"] = {
                "vllmx ngram vs none, c1": x["ngram"]["c1"]["tok_s"] / x["none"]["c1"]["tok_s"],
                "llama.cpp lookup vs none": ll["tok_s"] / ln["tok_s"],
                "vllmx ngram vs llama.cpp lookup": x["ngram"]["c1"]["tok_s"] / ll["tok_s"],
                "vllmx none vs llama.cpp none": x["none"]["c1"]["tok_s"] / ln["tok_s"]}
    if "accept0" in args.parts:
        layers = {"num_hidden_layers": args.target_layers} if args.target_layers else {}
        target = write_config(args.target_shape, os.path.join(args.workdir, args.target_shape),
                              **layers)
        report["accept0"] = run_worker("vllmx-accept0", args, path=target)
        a = report["accept0"]
        if "none" in a and "eagle3" in a:
            report["accept0_ratios"] = {c: a["eagle3"][c]["tok_s"] / a["none"][c]["tok_s"]
                                        for c in a["none"]}
    print(json.dumps(report, indent=1)[:6000])
    name = "spec_decode_gpu.json"
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    for d in (here if args.device != "cpu" else None, os.environ.get("OUT")):
        if d:
            with open(os.path.join(d, name), "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
