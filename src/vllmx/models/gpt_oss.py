"""gpt-oss (GptOssForCausalLM) as the Llama decoder (llama.py) with what sets it apart: q/k/v/o
biases, sliding and full layers alternating per layer_types, attention sinks (one learned
logit a head in every row's softmax, paged_attention's sinks) and a mixture-of-experts MLP in
every layer. The router has a bias and takes the top k of its logits, then a softmax over
those k (topk_softmax renormalized: the same weights); the experts have biases and the clamped
SwiGLU (fused_experts' swigluoai). transformers stores the experts transposed (x @ W:
gate_up_proj [E, H, 2 I], down_proj [E, I, H]) with the gate and up columns interleaved; at
load they become fused_experts' w13 [E, 2 I, H] = [gate; up] rows and w2 [E, H, I].

llama.cpp's gpt-oss GGUFs (arch gpt-oss) hold the experts as its converter splits them: gate and
up apart (ffn_gate_exps / ffn_up_exps [E, I, H], de-interleaved, each with a bias [E, I]),
ffn_down_exps [E, H, I]; its swiglu_oai is the same clamped SwiGLU (alpha 1.702, limit 7), its
router the same top-k softmax. No key says which layers slide: llama.cpp slides the even ones,
as transformers' layer_types do."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from vllmx.layers.fused_moe import SparseMoeBlock
from vllmx.models import moe
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight

GPT_OSS_ARCHS = ("GptOssForCausalLM",)
GGUF_ARCH = "gpt-oss"
# fused_experts' swigluoai constants (vLLM's swigluoai_and_mul); a config with others is refused.
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0
MXFP4 = int(GGMLQuantizationType.MXFP4)  # GGML's id, vllmx's dtype id for the block type


def is_gpt_oss(cfg: dict) -> bool:
    return (any(a in GPT_OSS_ARCHS for a in cfg.get("architectures") or [])
            or cfg.get("gguf_architecture") == GGUF_ARCH)


def gpt_oss_config(cfg: dict) -> dict:
    """moe.moe_config's fields (every layer sparse, the top-k weights renormalized), the window
    on the layers layer_types marks sliding."""
    alpha, limit = cfg.get("swiglu_alpha", SWIGLU_ALPHA), cfg.get("swiglu_limit", SWIGLU_LIMIT)
    if (alpha, limit) != (SWIGLU_ALPHA, SWIGLU_LIMIT):
        raise ValueError(f"gpt-oss with swiglu_alpha = {alpha}, swiglu_limit = {limit} is not "
                         f"supported (the experts' kernel runs {SWIGLU_ALPHA}, {SWIGLU_LIMIT})")
    out = moe.moe_config({**cfg, "norm_topk_prob": True})
    out["use_sliding_window"] = True  # only where layer_types says sliding_attention
    if "gguf_architecture" in cfg:  # llama.cpp's set_swa_pattern(2)
        out["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                              for i in range(cfg["num_hidden_layers"])]
    return out


def gpt_oss_name(name: str) -> str:
    """The router under the name llama.py checks sparse layers for (mlp.gate)."""
    return name.replace(".mlp.router.", ".mlp.gate.")


def _transposed(w: Weight, rows: np.ndarray | None = None) -> np.ndarray:
    """[E, a, b] stored as x @ W -> [E, b, a] as y = W x rows, optionally reordered."""
    data = np.asarray(w.data).reshape(w.shape).transpose(0, 2, 1)
    return np.ascontiguousarray(data if rows is None else data[:, rows])


def mxfp4_blocks(blocks: Weight, scales: Weight, rows: np.ndarray | None = None) -> Weight:
    """A checkpoint's MXFP4 tensor (blocks u8 [E, R, G, 16]: value 2j the low nibble of byte j,
    2j + 1 its high one; scales u8 [E, R, G], E8M0) as GGUF MXFP4 rows [E, R, G * 17] (the
    scale byte, then value j in byte j's low nibble and value j + 16 in its high one), rows
    optionally reordered. Both scale a code of the same E2M1 table by 2^(scale - 127)."""
    b = np.asarray(blocks.data).reshape(blocks.shape)
    s = np.asarray(scales.data).reshape(scales.shape)
    if rows is not None:
        b, s = b[:, rows], s[:, rows]
    codes = np.empty(b.shape[:-1] + (32,), np.uint8)
    codes[..., 0::2], codes[..., 1::2] = b & 0x0F, b >> 4
    out = np.empty(b.shape[:-1] + (17,), np.uint8)
    out[..., 0] = s
    out[..., 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    e, r, g = s.shape
    return Weight(out.reshape(e, r, g * 17), MXFP4, (e, r, g * 32))


def _experts(weights, p: str, i: int, order: np.ndarray) -> tuple[Weight, Weight]:
    """(w13 [E, 2 I, H] = [gate; up], w2 [E, H, I]) from dense transposed tensors or MXFP4
    blocks (already one row per output)."""
    if p + "experts.gate_up_proj_blocks" in weights:
        names = [p + "experts." + n for n in ("gate_up_proj_blocks", "gate_up_proj_scales",
                                              "down_proj_blocks", "down_proj_scales")]
        require_tensors(weights, names)
        gu_b, gu_s, d_b, d_s = (weights[n] for n in names)
        return mxfp4_blocks(gu_b, gu_s, order), mxfp4_blocks(d_b, d_s)
    names = [p + "experts.gate_up_proj", p + "experts.down_proj"]
    require_tensors(weights, names)
    gate_up, down = (weights[n] for n in names)
    if gate_up.dtype != down.dtype:
        raise ValueError(f"layer {i}: gate_up_proj and down_proj must share a dtype, got "
                         f"{gate_up.dtype} and {down.dtype}")
    e, h, two_i = gate_up.shape
    return (Weight(_transposed(gate_up, order), gate_up.dtype, (e, two_i, h)),
            Weight(_transposed(down), down.dtype, (e, h, two_i // 2)))


def _gguf_experts(cfg: dict, weights, i: int) -> tuple[Weight, Weight, np.ndarray, np.ndarray]:
    """(w13, w2, w13 bias [E, 2 I], w2 bias [E, H]) from a GGUF's ffn_{gate,up,down}_exps."""
    p = f"model.layers.{i}.mlp.experts."
    names = [p + n + s for s in (".weight", ".bias") for n in ("gate_proj", "up_proj",
                                                               "down_proj")]
    require_tensors(weights, names)
    gate_b, up_b, down_b = (weights[n].to_float32() for n in names[3:])
    w13, w2 = moe.expert_weights(weights, cfg, i)
    return w13, w2, np.concatenate([gate_b, up_b], axis=1), down_b


def sparse_block(cfg: dict, weights, i: int) -> SparseMoeBlock:
    """Layer i's experts and router, converted to fused_experts' layout."""
    p = f"model.layers.{i}.mlp."
    require_tensors(weights, [p + "gate.weight", p + "gate.bias"])
    if p + "experts.gate_proj.weight" in weights:  # a GGUF's, already [gate; up] apart
        w13, w2, w13_bias, w2_bias = _gguf_experts(cfg, weights, i)
    else:
        names = [p + "experts.gate_up_proj_bias", p + "experts.down_proj_bias"]
        require_tensors(weights, names)
        gate_up_bias, down_bias = (weights[n] for n in names)
        # Interleaved gate / up (gate 0, 2, 4 ..., up 1, 3, 5 ...) -> [gate; up] rows.
        two_i = gate_up_bias.shape[1]
        order = np.concatenate([np.arange(0, two_i, 2), np.arange(1, two_i, 2)])
        w13, w2 = _experts(weights, p, i, order)
        w13_bias, w2_bias = gate_up_bias.to_float32()[:, order], down_bias.to_float32()
    return SparseMoeBlock(weights[p + "gate.weight"], w13, w2, cfg["num_experts_per_tok"], True,
                          name=p[:-1], gate_bias=weights[p + "gate.bias"],
                          w13_bias=np.ascontiguousarray(w13_bias, dtype=np.float32),
                          w2_bias=np.ascontiguousarray(w2_bias, dtype=np.float32),
                          activation="swigluoai")


def attention_sinks(weights, i: int) -> np.ndarray:
    name = f"model.layers.{i}.self_attn.sinks"
    w = weights[name] if name in weights else weights[name + ".weight"]  # a GGUF's attn_sinks
    return np.ascontiguousarray(w.to_float32(), dtype=np.float32).reshape(-1)


def gpt_oss_checkpoint_shapes(cfg: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """Replaces each layer's dense MLP tensors by gpt-oss's router and stacked experts, adds
    the attention sinks."""
    cfg = gpt_oss_config(cfg)
    h, inter, n = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name in ("gate_proj", "up_proj", "down_proj"):
            del shapes[f"{p}mlp.{name}.weight"]
        shapes.update({p + "mlp.router.weight": (n, h), p + "mlp.router.bias": (n,),
                       p + "mlp.experts.gate_up_proj": (n, h, 2 * inter),
                       p + "mlp.experts.gate_up_proj_bias": (n, 2 * inter),
                       p + "mlp.experts.down_proj": (n, inter, h),
                       p + "mlp.experts.down_proj_bias": (n, h),
                       p + "self_attn.sinks": (cfg["num_attention_heads"],)})
