"""The tensors of a Hugging Face checkpoint, by name and shape, from its config alone (each model
class's checkpoint_shapes; load_format="dummy" makes them)."""

from __future__ import annotations

from collections.abc import Container, Iterable


def require_tensors(weights: Container[str], needed: Iterable[str]) -> None:
    """ValueError naming the needed tensors the checkpoint lacks (the first three, and how many)."""
    missing = [n for n in needed if n not in weights]
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")


def decoder_shapes(cfg: dict, layer_norms: tuple[str, ...], qk_norm: bool, qkv_bias: bool,
                   o_bias: bool, tied: bool) -> dict[str, tuple[int, ...]]:
    """The tensors of a Hugging Face decoder checkpoint (model.embed_tokens, model.layers.{i}.
    self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, the norms named, lm_head unless tied)."""
    h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    nq = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nq
    hd = cfg.get("head_dim") or h // nq
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h),
                                          "model.norm.weight": (h,)}
    if not tied:
        shapes["lm_head.weight"] = (v, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, rows in (("q", nq * hd), ("k", nkv * hd), ("v", nkv * hd)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (rows, h)
            if qkv_bias:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (h, nq * hd)
        if o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "mlp.gate_proj.weight"] = shapes[p + "mlp.up_proj.weight"] = (inter, h)
        shapes[p + "mlp.down_proj.weight"] = (h, inter)
        for norm in layer_norms:
            shapes[f"{p}{norm}.weight"] = (h,)
    return shapes
