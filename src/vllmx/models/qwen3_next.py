"""Qwen3-Next and Qwen3.5 (Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM,
and the text part of Qwen3.5's ...ForConditionalGeneration checkpoints), hybrids: most layers
mix tokens with Gated DeltaNet
(layers/gated_deltanet.py: a recurrent state per request, no KV cache), every
full_attention_interval-th one with gated attention (the q projection also yields a per-head
output gate, sigmoid-applied after attention; q/k norms; rope over a quarter of each head). The
MLPs are Qwen's MoE with a gated shared expert (models/moe.py), or dense (Qwen3.5). The
RMSNorms scale by (1 + w), read here as w + 1; the mixer's output norm is a plain w gated by
silu(z). Qwen3.5's multimodal rope (mrope_section) gives a text token the same position in all
three sections, which is the plain rope used here. From GGUF (llama.cpp's qwen3next;
models/hybrid_gguf.py): the converter's w + 1 norms, regrouped qkv / z and A = -exp(A_log)
read back into the checkpoint's layout."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.distributed.parallel_state import get_pp_stage, get_tp_group
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.fused_moe import SwiGLUMLP
from vllmx.layers.gated_deltanet import GatedDeltaNet
from vllmx.layers.linear import (
    Linear,
    MergedLinear,
    ParallelLMHead,
    RowParallelLinear,
    take_rows,
)
from vllmx.layers.norm import RMSNorm, pre_norm
from vllmx.layers.rotary import get_rope
from vllmx.models import hybrid_gguf, moe
from vllmx.models.decoder import DecoderLM
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight


def offset_norm(w: Weight, eps: float) -> RMSNorm:
    """Qwen3-Next's RMSNorm, x / rms(x) * (1 + w)."""
    return RMSNorm(Weight.from_numpy(w.to_float32().reshape(-1) + np.float32(1.0)), eps)


class Qwen3NextGatedAttention:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope):
        p = f"model.layers.{i}.self_attn."
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        # q_proj's rows are per head [q (hd); gate (hd)].
        q_rows = (np.arange(nh)[:, None] * 2 * hd + np.arange(hd)).ravel()
        qw = w[p + "q_proj.weight"]
        bias = [w.get(p + f"{n}_proj.bias") for n in "qkv"]
        if any(b is not None for b in bias):
            raise ValueError(f"{p[:-1]}: attention_bias is not supported for Qwen3-Next")
        self.qkv_proj = MergedLinear([take_rows(qw, q_rows), w[p + "k_proj.weight"],
                                      w[p + "v_proj.weight"]], [None] * 3)
        self.gate_proj = Linear(take_rows(qw, q_rows + hd))
        self.o_proj = RowParallelLinear(w[p + "o_proj.weight"])
        eps = cfg["rms_norm_eps"]
        self.q_norm = offset_norm(w[p + "q_norm.weight"], eps)
        self.k_norm = offset_norm(w[p + "k_norm.weight"], eps)
        self.rope = rope
        self.attn = Attention(i, nh, nkv, hd, hd ** -0.5)

    def __call__(self, positions, x, md: AttentionMetadata):
        out = self.attn.forward_qkv(self.qkv_proj(x), positions, self.rope, self.q_norm,
                                    self.k_norm, md)
        ops.sigmoid_gate_(out, self.gate_proj(x))
        return self.o_proj(out)


class Qwen3NextDecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope):
        p = f"model.layers.{i}."
        eps = cfg["rms_norm_eps"]
        self.linear = cfg["layer_types"][i] == "linear_attention"
        self.mixer = (GatedDeltaNet(cfg, w, p + "linear_attn.") if self.linear
                      else Qwen3NextGatedAttention(i, cfg, w, rope))
        self.input_layernorm = offset_norm(w[p + "input_layernorm.weight"], eps)
        self.post_attention_layernorm = offset_norm(w[p + "post_attention_layernorm.weight"], eps)
        if cfg["sparse_layers"][i]:
            self.mlp = moe.sparse_block(cfg, w, i)
        else:
            self.mlp = SwiGLUMLP([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]],
                                 w[p + "mlp.down_proj.weight"])

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        h, residual = pre_norm(self.input_layernorm, h, residual)
        h = self.mixer(h, md) if self.linear else self.mixer(positions, h, md)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


_VISION_ARCHS = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")


def text_part(cfg: dict, weights):
    """A ...ForConditionalGeneration checkpoint's language model: its text_config, and its
    model.language_model.* tensors under the causal LM's names (the vision tower is not
    loaded; image inputs are not supported)."""
    cfg = dict(cfg)
    if not any(a in _VISION_ARCHS for a in cfg.get("architectures") or []):
        return cfg, weights
    text = {**cfg.get("text_config", {}), "architectures": cfg["architectures"]}
    for key in ("tie_word_embeddings", "max_model_len"):
        if key in cfg:
            text.setdefault(key, cfg[key])
    prefix = "model.language_model."
    renamed = {("model." + n[len(prefix):] if n.startswith(prefix) else n): w
               for n, w in weights.items() if not n.startswith("model.visual.")}
    return text, renamed


class Qwen3NextForCausalLM(DecoderLM):
    is_hybrid = True  # request state slots beside the KV cache (worker/model_runner.py)

    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg, weights = text_part(cfg, weights)
        if "gguf_architecture" in cfg:
            weights = hybrid_gguf.hf_weights(cfg, weights)
        cfg.setdefault("rms_norm_eps", 1e-6)
        cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        n = cfg["num_hidden_layers"]
        if not cfg.get("layer_types"):
            every = int(cfg.get("full_attention_interval") or 4)
            cfg["layer_types"] = ["full_attention" if (i + 1) % every == 0
                                  else "linear_attention" for i in range(n)]
        unknown = set(cfg["layer_types"]) - {"linear_attention", "full_attention"}
        if unknown:
            raise ValueError(f"Qwen3-Next layer_types {sorted(unknown)} are not supported")
        if cfg.get("num_experts"):
            if "Qwen3NextForCausalLM" not in (cfg.get("architectures") or []):
                cfg["norm_topk_prob"] = True  # Qwen3.5-MoE's router always renormalizes
            cfg = moe.moe_config(cfg)
        else:
            cfg["sparse_layers"] = [False] * n
        cfg["num_kv_cache_layers"] = cfg["layer_types"].count("full_attention")
        self.config = cfg
        self._check_weights(weights)
        rope = self._rope = get_rope(cfg, cfg["head_dim"])
        # Pipeline parallelism: this stage's layers (and their state slots), embed and lm_head
        # on the first.
        self.pp_stage = pp = get_pp_stage()
        first = pp is None or pp.is_first
        start, end = (0, n) if pp is None else pp.layers(n)
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight") if first else None
        self.layers = [Qwen3NextDecoderLayer(i, cfg, weights, rope) if start <= i < end else None
                       for i in range(n)]
        self.norm = offset_norm(weights["model.norm.weight"], cfg["rms_norm_eps"])
        self.lm_head = ParallelLMHead(weights.get("lm_head.weight", self.embed_tokens),
                                      cfg.get("vocab_size")) if first else None
        self.vocab_size = self.lm_head.vocab_size if first else int(cfg["vocab_size"])
        self.tp_group = get_tp_group()  # (under tensor parallelism: this rank's heads, rows)
        if self.lm_head is not None:  # (embed_tokens holds the same rows)
            self.vocab_start = self.lm_head.vocab_start

    def allocate_states(self, num_slots: int) -> None:
        for layer in self.layers:
            if layer is not None and layer.linear:
                layer.mixer.allocate_states(num_slots)

    def mtp_block(self, weights: dict[str, Weight], i: int) -> Qwen3NextDecoderLayer:
        """The multi-token-prediction layer (mtp.layers.0.*, models/mtp.py) as decoder layer
        i >= num_hidden_layers: gated full attention, the MoE block where the checkpoint has
        its router (else the dense MLP)."""
        cfg = self.config
        assert i == len(cfg["layer_types"]), "the MTP layer follows the last decoder layer"
        prefix = f"model.layers.{i}."
        renamed = {prefix + n[len("mtp.layers.0."):]: w for n, w in weights.items()
                   if n.startswith("mtp.layers.0.")}
        sparse = prefix + "mlp.gate.weight" in renamed
        cfg = {**cfg, "layer_types": [*cfg["layer_types"], "full_attention"],
               "sparse_layers": [*cfg["sparse_layers"], sparse]}
        return Qwen3NextDecoderLayer(i, cfg, renamed, self._rope)

    def _check_weights(self, weights) -> None:
        cfg = self.config
        needed = ["model.embed_tokens.weight", "model.norm.weight"]
        for i, kind in enumerate(cfg["layer_types"]):
            p = f"model.layers.{i}."
            needed += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
            if kind == "linear_attention":
                a = p + "linear_attn."
                split = a + "in_proj_qkv.weight" in weights  # Qwen3.5's four projections
                needed += [a + n for n in (
                    ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight",
                     "in_proj_a.weight") if split else ("in_proj_qkvz.weight",
                                                        "in_proj_ba.weight"))
                    + ("conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight")]
            else:
                needed += [p + f"self_attn.{n}.weight" for n in (
                    "q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
            needed += [p + "mlp.gate.weight"] if cfg["sparse_layers"][i] else [
                p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
        require_tensors(weights, needed)

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors of a Qwen3-Next / Qwen3.5 checkpoint of this config
        (load_format="dummy"; a ...ForConditionalGeneration config: its text part's)."""
        cfg, _ = text_part(cfg, {})
        qwen3_5 = "Qwen3NextForCausalLM" not in (cfg.get("architectures") or [])
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = cfg.get("head_dim") or h // nh
        hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        n = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or [
            "full_attention" if (i + 1) % int(cfg.get("full_attention_interval") or 4) == 0
            else "linear_attention" for i in range(n)]
        shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
        if not cfg.get("tie_word_embeddings"):
            shapes["lm_head.weight"] = (v, h)
        inter = cfg.get("intermediate_size")  # (none in Qwen3.5-MoE's: every layer sparse)
        for i, kind in enumerate(types):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] \
                = (h,)
            if kind == "linear_attention":
                a = p + "linear_attn."
                conv = 2 * hk * dk + hv * dv
                if qwen3_5:
                    shapes.update({a + "in_proj_qkv.weight": (conv, h),
                                   a + "in_proj_z.weight": (hv * dv, h),
                                   a + "in_proj_b.weight": (hv, h),
                                   a + "in_proj_a.weight": (hv, h)})
                else:
                    shapes.update({a + "in_proj_qkvz.weight": (conv + hv * dv, h),
                                   a + "in_proj_ba.weight": (2 * hv, h)})
                shapes.update({a + "conv1d.weight": (conv, 1, int(cfg["linear_conv_kernel_dim"])),
                               a + "A_log": (hv,), a + "dt_bias": (hv,),
                               a + "norm.weight": (dv,), a + "out_proj.weight": (h, hv * dv)})
            else:
                a = p + "self_attn."
                shapes.update({a + "q_proj.weight": (2 * nh * hd, h),
                               a + "k_proj.weight": (nkv * hd, h),
                               a + "v_proj.weight": (nkv * hd, h),
                               a + "o_proj.weight": (h, nh * hd),
                               a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)})
            if inter:
                shapes[p + "mlp.gate_proj.weight"] = shapes[p + "mlp.up_proj.weight"] = (inter, h)
                shapes[p + "mlp.down_proj.weight"] = (h, inter)
        if cfg.get("num_experts"):
            moe.moe_checkpoint_shapes({**cfg, "layer_types": types}, shapes)
        return shapes
