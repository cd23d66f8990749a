"""A hybrid GGUF of a chosen shape with random weights, for benchmarking a Mamba2 + attention
model on the CPU against llama.cpp on the same file (no hub here, so no real Granite-4 GGUF):
llama.cpp's granitehybrid layout (Granite-4.0-H's dense variant: mamba layers with every
--attn-every-th one attention without rope, a SwiGLU MLP in every layer, Granite's four
multipliers), SmolLM2's tokenizer copied from the default model so both engines tokenize the
benchmark's text, weights drawn at 1/sqrt(fan-in) in F16 (A = -exp(A_log) and D in F32 as the
converter leaves them), then llama.cpp's own quantizer to the type asked (Q8_0 by default).

--arch qwen35: a small dense Qwen3.5 instead (hidden 1024, 24 layers, every 4th gated
attention of 8 / 2 heads of 256, the others Gated DeltaNet with 16 key and 16 value heads of
128, MLP 3584): transformers' own random Qwen3.5 with SmolLM2's vocabulary,
written in llama.cpp's qwen35 layout by the tests' converter (tests/models/hybrid_gguf.py,
checked against llama.cpp there), then quantized by llama.cpp.

    python bench/hybrid_gguf.py [--layers 24 --hidden 768 ...] [--ftype Q8_0] \
        --out ~/.cache/vllmx/models/hybrid-bench.Q8_0.gguf
    python bench/hybrid_gguf.py --arch qwen35 --ftype Q4_K_M \
        --out ~/.cache/vllmx/models/qwen35-bench.Q4_K_M.gguf
    python bench/cpu_vs_llamacpp.py --model ~/.cache/vllmx/models/hybrid-bench.Q8_0.gguf
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from moe_gguf import copy_tokenizer, quantize


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["granitehybrid", "qwen35"], default="granitehybrid")
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


def write_qwen35(args, path: str, tokenizer_src: str) -> None:
    """A random small Qwen3.5 (the shape above; --layers, --seed apply) as an F32 GGUF."""
    import sys
    import tempfile

    import torch
    import transformers

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import gguf

    from tests.models.hybrid_gguf import write_hybrid_gguf

    vocab = len(gguf.GGUFReader(tokenizer_src).fields["tokenizer.ggml.tokens"].contents())
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=1024, intermediate_size=3584, num_hidden_layers=args.layers,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # (transformers zero-initializes the (1 + w) norms' w: give them some)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.1)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        write_hybrid_gguf(d, "qwen3_5_gguf", path,
                          tokenizer=lambda w: copy_tokenizer(w, tokenizer_src))


def main() -> None:
    args = parse_args()
    from vllmx.loader.model_source import DEFAULT_MODEL, resolve_model

    out = os.path.expanduser(args.out)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    f16 = out + ".f16.tmp"
    (write_qwen35 if args.arch == "qwen35" else write_f16)(args, f16, resolve_model(DEFAULT_MODEL))
    try:
        quantize(f16, out, args.ftype)
    finally:
        os.remove(f16)
    print(f"wrote {out} ({os.path.getsize(out) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
