"""A mixture-of-experts GGUF of a chosen shape with random weights, for benchmarking MoE on the
CPU against llama.cpp on the same file (no hub here, so no real MoE GGUF): llama.cpp's qwen3moe
layout (q/k norms, every layer sparse, top-k renormalized), SmolLM2's tokenizer copied from the
default model so both engines tokenize the benchmark's text, weights drawn at 1/sqrt(fan-in) in
F16, then llama.cpp's own quantizer (llama_model_quantize) to the type asked (Q4_K_M by default).

    python bench/moe_gguf.py [--layers 12 --hidden 1024 --experts 32 --top-k 4 ...] \
        [--ftype Q4_K_M] --out ~/.cache/vllmx/models/moe-bench.Q4_K_M.gguf
    python bench/cpu_vs_llamacpp.py --model ~/.cache/vllmx/models/moe-bench.Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import ctypes
import os

import numpy as np


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--expert-ffn", type=int, default=384)
    ap.add_argument("--ftype", default="Q4_K_M", help="llama.cpp file type (LLAMA_FTYPE_MOSTLY_*)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    return ap.parse_args()


def copy_tokenizer(writer, src_gguf: str) -> int:
    """Every tokenizer.* key of src_gguf into writer; returns the vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(src_gguf)
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            value = field.contents()
            writer.add_key_value(name, value, vtype, sub_type=field.types[-1])
            if name == "tokenizer.ggml.tokens":
                vocab = len(value)
        else:
            writer.add_key_value(name, field.contents(), vtype)
    return vocab


def write_f16(args, path: str, tokenizer_src: str) -> None:
    import gguf

    rng = np.random.default_rng(args.seed)
    h, hd, nh, nkv = args.hidden, args.head_dim, args.heads, args.kv_heads
    e, inter = args.experts, args.expert_ffn

    def rand(*shape):  # rows x fan-in, scaled to keep activations O(1)
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(
            np.float16)

    w = gguf.GGUFWriter(path, "qwen3moe")
    vocab = copy_tokenizer(w, tokenizer_src)
    w.add_name("vllmx moe bench (random weights)")
    w.add_block_count(args.layers)
    w.add_context_length(4096)
    w.add_embedding_length(h)
    w.add_feed_forward_length(inter)
    w.add_expert_feed_forward_length(inter)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(e)
    w.add_expert_used_count(args.top_k)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", rand(vocab, h))
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    w.add_tensor("output.weight", rand(vocab, h))
    for i in range(args.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(p + "attn_q.weight", rand(nh * hd, h))
        w.add_tensor(p + "attn_k.weight", rand(nkv * hd, h))
        w.add_tensor(p + "attn_v.weight", rand(nkv * hd, h))
        w.add_tensor(p + "attn_output.weight", rand(h, nh * hd))
        w.add_tensor(p + "attn_q_norm.weight", np.ones(hd, np.float32))
        w.add_tensor(p + "attn_k_norm.weight", np.ones(hd, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(p + "ffn_gate_inp.weight", rand(e, h).astype(np.float32))
        w.add_tensor(p + "ffn_gate_exps.weight", rand(e, inter, h))
        w.add_tensor(p + "ffn_up_exps.weight", rand(e, inter, h))
        w.add_tensor(p + "ffn_down_exps.weight", rand(e, h, inter))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src: str, dst: str, ftype: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize -> {rc}")


def main() -> None:
    args = parse_args()
    from vllmx.loader.model_source import DEFAULT_MODEL, resolve_model

    out = os.path.expanduser(args.out)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    f16 = out + ".f16.tmp"
    write_f16(args, f16, resolve_model(DEFAULT_MODEL))
    try:
        quantize(f16, out, args.ftype)
    finally:
        os.remove(f16)
    print(f"wrote {out} ({os.path.getsize(out) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
