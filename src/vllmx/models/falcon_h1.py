"""Falcon-H1 (FalconH1ForCausalLM): every layer runs a Mamba2 mixer (layers/mamba2.py) and
attention side by side on the same normed input, their outputs summed into the residual, then
a SwiGLU MLP. Its muP multipliers are constants on projections' inputs and outputs, folded into
the matrices at load (f32): ssm_in_multiplier and the per-part ssm_multipliers (z, x, B, C,
dt) into in_proj, ssm_out_multiplier into out_proj, attention_in_multiplier into q/k/v and
key_multiplier into k, attention_out_multiplier into o_proj, mlp_multipliers into gate_proj
and down_proj; embedding_multiplier and lm_head_multiplier stay scalars. From GGUF (llama.cpp's
falcon-h1; models/hybrid_gguf.py) the multipliers come folded already, and the gated norm, where
the file has one, runs after the gate as llama.cpp runs it."""

from __future__ import annotations

import numpy as np

from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.fused_moe import SwiGLUMLP
from vllmx.layers.linear import Linear, LMHeadLinear, MergedLinear, scale_rows
from vllmx.layers.mamba2 import Mamba2Mixer, time_step_limit
from vllmx.layers.norm import ResidualAdd, RMSNorm, pre_norm
from vllmx.layers.rotary import get_rope
from vllmx.models import hybrid_gguf
from vllmx.models.decoder import DecoderLM
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight


def _multiplier(cfg: dict, key: str) -> float:
    return float(cfg.get(key) if cfg.get(key) is not None else 1.0)


class FalconH1DecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope):
        p = f"model.layers.{i}."
        eps = cfg["rms_norm_eps"]
        heads, hdim = cfg["mamba_n_heads"], cfg["mamba_d_head"]
        d_inner, gn = heads * hdim, cfg["mamba_n_groups"] * cfg["mamba_d_state"]
        m = p + "mamba."
        # in_proj's rows: z, x, B, C, dt, each part times its ssm_multiplier; the input times
        # ssm_in_multiplier
        zx_b_c_dt = [d_inner, d_inner, gn, gn, heads]
        mult = cfg.get("ssm_multipliers") or [1.0] * 5
        rows = np.concatenate([np.full(n, f) for n, f in zip(zx_b_c_dt, mult)])
        mw = dict(w)  # the mixer's view, its two projections folded
        mw[m + "in_proj.weight"] = scale_rows(w[m + "in_proj.weight"],
                                              rows * _multiplier(cfg, "ssm_in_multiplier"))
        if m + "in_proj.bias" in w:
            mw[m + "in_proj.bias"] = scale_rows(w[m + "in_proj.bias"], rows)
        out_scale = _multiplier(cfg, "ssm_out_multiplier")
        mw[m + "out_proj.weight"] = scale_rows(w[m + "out_proj.weight"], out_scale)
        if m + "out_proj.bias" in w:
            mw[m + "out_proj.bias"] = scale_rows(w[m + "out_proj.bias"], out_scale)
        self.mamba = Mamba2Mixer(
            mw, m, num_heads=heads, head_dim=hdim, state_size=cfg["mamba_d_state"],
            n_groups=cfg["mamba_n_groups"], eps=eps, dt_limit=cfg["dt_limit"],
            rms_norm=bool(cfg.get("mamba_rms_norm")),
            norm_before_gate=bool(cfg.get("mamba_norm_before_gate", True)))
        a = p + "self_attn."
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        into = _multiplier(cfg, "attention_in_multiplier")
        key = _multiplier(cfg, "key_multiplier")
        qkv = [scale_rows(w[a + "q_proj.weight"], into),
               scale_rows(w[a + "k_proj.weight"], into * key),
               scale_rows(w[a + "v_proj.weight"], into)]
        biases = [w.get(a + f"{n}_proj.bias") for n in "qkv"]
        if biases[1] is not None:
            biases[1] = scale_rows(biases[1], key)
        self.qkv_proj = MergedLinear(qkv, biases)
        attn_out = _multiplier(cfg, "attention_out_multiplier")
        ob = w.get(a + "o_proj.bias")
        self.o_proj = Linear(scale_rows(w[a + "o_proj.weight"], attn_out),
                             None if ob is None else scale_rows(ob, attn_out))
        self.rope = rope
        self.attn = Attention(i, nh, nkv, hd, hd ** -0.5)
        gate_m, down_m = cfg.get("mlp_multipliers") or (1.0, 1.0)
        f = p + "feed_forward."
        self.mlp = SwiGLUMLP([scale_rows(w[f + "gate_proj.weight"], gate_m),
                              w[f + "up_proj.weight"]],
                             scale_rows(w[f + "down_proj.weight"], down_m))
        self.input_layernorm = RMSNorm(w[p + "input_layernorm.weight"], eps)
        self.pre_ff_layernorm = RMSNorm(w[p + "pre_ff_layernorm.weight"], eps)
        self._add = ResidualAdd(cfg["hidden_size"])

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        h, residual = pre_norm(self.input_layernorm, h, residual)
        ssm = self.mamba(h, md)
        attn = self.o_proj(self.attn.forward_qkv(self.qkv_proj(h), positions, self.rope, None,
                                                 None, md))
        self._add(ssm, attn)  # attn += ssm
        h, residual = self.pre_ff_layernorm(attn, residual)
        return self.mlp(h), residual


class FalconH1ForCausalLM(DecoderLM):
    is_hybrid = True  # request state slots beside the KV cache (worker/model_runner.py)

    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        cfg.setdefault("rms_norm_eps", 1e-5)
        cfg["dt_limit"] = time_step_limit(cfg)
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Falcon-H1 with hidden_act {cfg['hidden_act']!r} is not supported")
        if "gguf_architecture" in cfg:
            weights = hybrid_gguf.hf_weights(cfg, weights)
            cfg["mamba_rms_norm"] = "model.layers.0.mamba.norm.weight" in weights
        self.config = cfg
        require_tensors(weights, ["model.embed_tokens.weight", "model.final_layernorm.weight"])
        rope = get_rope(cfg, cfg["head_dim"])
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight")
        self.layers = [FalconH1DecoderLayer(i, cfg, weights, rope)
                       for i in range(cfg["num_hidden_layers"])]
        self.norm = RMSNorm(weights["model.final_layernorm.weight"], cfg["rms_norm_eps"])
        self.lm_head = LMHeadLinear(weights.get("lm_head.weight", self.embed_tokens))
        self.vocab_size = self.lm_head.weight.shape[0]
        self.embedding_multiplier = _multiplier(cfg, "embedding_multiplier")
        self.logits_scaling = 1.0 / _multiplier(cfg, "lm_head_multiplier")

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors of a Falcon-H1 checkpoint of this config (load_format="dummy")."""
        h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
        nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = cfg.get("head_dim") or h // nh
        heads, hdim = cfg["mamba_n_heads"], cfg["mamba_d_head"]
        d_inner = heads * hdim
        conv = d_inner + 2 * cfg["mamba_n_groups"] * cfg["mamba_d_state"]
        shapes = {"model.embed_tokens.weight": (v, h), "model.final_layernorm.weight": (h,)}
        if not cfg.get("tie_word_embeddings"):
            shapes["lm_head.weight"] = (v, h)
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            m, a, f = p + "mamba.", p + "self_attn.", p + "feed_forward."
            shapes.update({
                p + "input_layernorm.weight": (h,), p + "pre_ff_layernorm.weight": (h,),
                m + "in_proj.weight": (d_inner + conv + heads, h),
                m + "conv1d.weight": (conv, 1, int(cfg["mamba_d_conv"])),
                m + "A_log": (heads,), m + "D": (heads,), m + "dt_bias": (heads,),
                m + "out_proj.weight": (h, d_inner),
                a + "q_proj.weight": (nh * hd, h), a + "k_proj.weight": (nkv * hd, h),
                a + "v_proj.weight": (nkv * hd, h), a + "o_proj.weight": (h, nh * hd),
                f + "gate_proj.weight": (inter, h), f + "up_proj.weight": (inter, h),
                f + "down_proj.weight": (h, inter)})
            if cfg.get("mamba_conv_bias", True):
                shapes[m + "conv1d.bias"] = (conv,)
            if cfg.get("mamba_rms_norm"):
                shapes[m + "norm.weight"] = (d_inner,)
            if cfg.get("mamba_proj_bias"):
                shapes[m + "in_proj.bias"] = (d_inner + conv + heads,)
            if cfg.get("projectors_bias"):
                shapes[m + "out_proj.bias"] = (h,)
            if cfg.get("attention_bias"):
                shapes.update({a + "q_proj.bias": (nh * hd,), a + "k_proj.bias": (nkv * hd,),
                               a + "v_proj.bias": (nkv * hd,), a + "o_proj.bias": (h,)})
        return shapes

    def allocate_states(self, num_slots: int) -> None:
        for layer in self.layers:
            layer.mamba.allocate_states(num_slots)
