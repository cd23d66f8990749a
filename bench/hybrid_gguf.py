"""A hybrid GGUF of a chosen shape with random weights, for benchmarking a Mamba2 + attention
model on the CPU against llama.cpp on the same file (no hub here, so no real Granite-4 GGUF):
llama.cpp's granitehybrid layout (Granite-4.0-H's dense variant: mamba layers with every
--attn-every-th one attention without rope, a SwiGLU MLP in every layer, Granite's four
multipliers), SmolLM2's tokenizer copied from the default model so both engines tokenize the
benchmark's text, weights drawn at 1/sqrt(fan-in) in F16 (A = -exp(A_log) and D in F32 as the
converter leaves them), then llama.cpp's own quantizer to the type asked (Q8_0 by default).

    python bench/hybrid_gguf.py [--layers 24 --hidden 768 ...] [--ftype Q8_0] \
        --out ~/.cache/vllmx/models/hybrid-bench.Q8_0.gguf
    python bench/cpu_vs_llamacpp.py --model ~/.cache/vllmx/models/hybrid-bench.Q8_0.gguf
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from moe_gguf import copy_tokenizer, quantize


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--attn-every", type=int, default=6, help="every n-th layer is attention")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--mamba-heads", type=int, default=48)
    ap.add_argument("--mamba-head-dim", type=int, default=32)
    ap.add_argument("--state", type=int, default=128)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--conv", type=int, default=4)
    ap.add_argument("--ftype", default="Q8_0", help="llama.cpp file type (LLAMA_FTYPE_MOSTLY_*)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    return ap.parse_args()


def write_f16(args, path: str, tokenizer_src: str) -> None:
    import gguf

    rng = np.random.default_rng(args.seed)
    h, nh, nkv = args.hidden, args.heads, args.kv_heads
    hd = h // nh  # Granite's attention: no head_dim key, hidden / heads
    heads, d_inner = args.mamba_heads, args.mamba_heads * args.mamba_head_dim
    conv = d_inner + 2 * args.groups * args.state
    attn = [(i + 1) % args.attn_every == 0 for i in range(args.layers)]

    def rand(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(
            np.float16)

    w = gguf.GGUFWriter(path, "granitehybrid")
    vocab = copy_tokenizer(w, tokenizer_src)
    w.add_name("vllmx hybrid bench (random weights)")
    w.add_block_count(args.layers)
    w.add_context_length(4096)
    w.add_embedding_length(h)
    w.add_feed_forward_length(args.ffn)
    w.add_head_count(nh)
    w.add_head_count_kv([nkv if a else 0 for a in attn])
    w.add_rope_dimension_count(hd)
    w.add_rope_scaling_finetuned(False)  # Granite-4.0-H: no rope
    w.add_layer_norm_rms_eps(1e-5)
    w.add_embedding_scale(12.0)
    w.add_residual_scale(0.22)
    w.add_attention_scale(0.0078125)
    w.add_logit_scale(3.0)
    w.add_ssm_conv_kernel(args.conv)
    w.add_ssm_state_size(args.state)
    w.add_ssm_group_count(args.groups)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_time_step_rank(heads)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", rand(vocab, h))
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    for i in range(args.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(h, np.float32))
        if attn[i]:
            w.add_tensor(p + "attn_q.weight", rand(nh * hd, h))
            w.add_tensor(p + "attn_k.weight", rand(nkv * hd, h))
            w.add_tensor(p + "attn_v.weight", rand(nkv * hd, h))
            w.add_tensor(p + "attn_output.weight", rand(h, nh * hd))
        else:
            w.add_tensor(p + "ssm_in.weight", rand(2 * d_inner + 2 * args.groups * args.state
                                                   + heads, h))
            w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((conv, args.conv)) / 2)
                         .astype(np.float32))
            w.add_tensor(p + "ssm_conv1d.bias", np.zeros(conv, np.float32))
            w.add_tensor(p + "ssm_dt.bias", rng.uniform(-4, -2, heads).astype(np.float32))
            w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(0, 2.5, (heads, 1))).astype(np.float32))
            w.add_tensor(p + "ssm_d", np.ones((heads, 1), np.float32))
            w.add_tensor(p + "ssm_norm.weight", np.ones((args.groups, d_inner // args.groups),
                                                        np.float32))
            w.add_tensor(p + "ssm_out.weight", rand(h, d_inner))
        w.add_tensor(p + "ffn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(args.ffn, h))
        w.add_tensor(p + "ffn_up.weight", rand(args.ffn, h))
        w.add_tensor(p + "ffn_down.weight", rand(h, args.ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
