"""Granite-4 (GraniteMoeHybridForCausalLM), a hybrid: Mamba2 layers (layers/mamba2.py) and
attention layers per layer_types ("linear_attention" is a mamba layer here), attention without
rope unless position_embedding_type is "rope", Granite's four multipliers, and in every layer
GraniteMoe's experts beside the shared SwiGLU (models/granitemoe.py), or the shared MLP alone
when the config has no experts. From GGUF (llama.cpp's granitehybrid; names and layouts in
models/hybrid_gguf.py): Q/K rows permuted by the converter, hence GPT-J rope where rope is on,
and the shared / dense MLP's gate and up apart."""

from __future__ import annotations

from vllmx import ops
from vllmx.layers import placement
from vllmx.layers.attention import AttentionMetadata, SelfAttention
from vllmx.layers.fused_moe import SwiGLUMLP
from vllmx.layers.linear import LMHeadLinear
from vllmx.layers.mamba2 import Mamba2Mixer, time_step_limit
from vllmx.layers.norm import RMSNorm, pre_norm
from vllmx.layers.rotary import get_rope
from vllmx.models import granitemoe, hybrid_gguf, moe
from vllmx.models.decoder import DecoderLM
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight


class GraniteMoeHybridDecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope):
        p = f"model.layers.{i}."
        eps = cfg["rms_norm_eps"]
        self.mamba = cfg["layer_types"][i] == "linear_attention"
        if self.mamba:
            self.mixer = Mamba2Mixer(
                w, p + "mamba.", num_heads=cfg["mamba_n_heads"], head_dim=cfg["mamba_d_head"],
                state_size=cfg["mamba_d_state"], n_groups=cfg["mamba_n_groups"], eps=eps,
                dt_limit=cfg["dt_limit"])
        else:
            hd = cfg["head_dim"]
            self.mixer = SelfAttention(i, cfg, w, p + "self_attn.", rope,
                                       float(cfg.get("attention_multiplier") or hd ** -0.5))
        self.input_layernorm = RMSNorm(w[p + "input_layernorm.weight"], eps)
        self.post_attention_layernorm = RMSNorm(w[p + "post_attention_layernorm.weight"], eps)
        if cfg["num_experts"]:
            self.mlp = granitemoe.sparse_block(cfg, w, i)
        else:
            s = p + "shared_mlp."
            gate_up = ([s + "gate_up_proj.weight"] if s + "gate_up_proj.weight" in w
                       else [s + "gate_proj.weight", s + "up_proj.weight"])  # a GGUF's
            require_tensors(w, gate_up + [s + "down_proj.weight"])
            self.mlp = SwiGLUMLP([w[n] for n in gate_up], w[s + "down_proj.weight"])
        self.residual_multiplier = cfg["residual_multiplier"]

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        h, residual = pre_norm(self.input_layernorm, h, residual)
        h = self.mixer(h, md) if self.mamba else self.mixer(positions, h, md)
        if self.residual_multiplier != 1.0:
            ops.scale_(h, self.residual_multiplier)
        h, residual = self.post_attention_layernorm(h, residual)
        h = self.mlp(h)
        if self.residual_multiplier != 1.0:
            ops.scale_(h, self.residual_multiplier)
        return h, residual


def _config(cfg: dict) -> dict:
    cfg = dict(cfg)
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["linear_attention"] * n
    # older configs say "mamba" / "attention"
    types = ["linear_attention" if t in ("mamba", "linear_attention") else "full_attention"
             if t in ("attention", "full_attention") else t for t in types]
    unknown = set(types) - {"linear_attention", "full_attention"}
    if unknown:
        raise ValueError(f"GraniteMoeHybrid layer types {sorted(unknown)} are not supported")
    cfg["layer_types"] = types
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg.setdefault("rms_norm_eps", 1e-6)
    cfg["dt_limit"] = time_step_limit(cfg)
    if cfg.get("num_local_experts"):
        cfg = granitemoe.granite_moe_config(cfg)
    else:
        cfg["num_experts"] = 0
    cfg["residual_multiplier"] = float(cfg.get("residual_multiplier") or 1.0)
    cfg["num_kv_cache_layers"] = types.count("full_attention")
    return cfg


class GraniteMoeHybridForCausalLM(DecoderLM):
    is_hybrid = True  # request state slots beside the KV cache (worker/model_runner.py)

    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = _config(cfg)
        gguf = "gguf_architecture" in cfg
        if gguf:
            weights = hybrid_gguf.hf_weights(cfg, weights)
        weights = moe.RenamedWeights(weights, granitemoe.granite_moe_name)
        self.config = cfg
        require_tensors(weights, ["model.embed_tokens.weight", "model.norm.weight"])
        rope = get_rope(cfg, cfg["head_dim"], is_neox_style=not gguf)
        if cfg.get("position_embedding_type") != "rope":
            rope = rope.identity()  # no rope: the attention layers see no positions
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight")
        self.layers = [GraniteMoeHybridDecoderLayer(i, cfg, weights, rope)
                       for i in range(cfg["num_hidden_layers"])]
        self.norm = RMSNorm(weights["model.norm.weight"], cfg["rms_norm_eps"])
        self.lm_head = LMHeadLinear(weights.get("lm_head.weight", self.embed_tokens))
        self.vocab_size = self.lm_head.weight.shape[0]
        self.embedding_multiplier = float(cfg.get("embedding_multiplier") or 1.0)
        self.logits_scaling = float(cfg.get("logits_scaling") or 1.0)

    def allocate_states(self, num_slots: int) -> None:
        for layer in self.layers:
            if layer.mamba:
                layer.mixer.allocate_states(num_slots)

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors of a GraniteMoeHybrid checkpoint of this config (load_format="dummy")."""
        cfg = _config(cfg)
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        heads, hdim = cfg["mamba_n_heads"], cfg["mamba_d_head"]
        d_inner = heads * hdim
        conv = d_inner + 2 * cfg["mamba_n_groups"] * cfg["mamba_d_state"]
        shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
        if not cfg.get("tie_word_embeddings"):
            shapes["lm_head.weight"] = (v, h)
        shared, e = cfg["shared_intermediate_size"], cfg["num_experts"]
        for i, kind in enumerate(cfg["layer_types"]):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] \
                = (h,)
            if kind == "linear_attention":
                m = p + "mamba."
                shapes.update({m + "in_proj.weight": (d_inner + conv + heads, h),
                               m + "conv1d.weight": (conv, 1, int(cfg["mamba_d_conv"])),
                               m + "A_log": (heads,), m + "D": (heads,), m + "dt_bias": (heads,),
                               m + "norm.weight": (d_inner,), m + "out_proj.weight": (h, d_inner)})
                if cfg.get("mamba_conv_bias", True):
                    shapes[m + "conv1d.bias"] = (conv,)
                if cfg.get("mamba_proj_bias"):
                    shapes[m + "in_proj.bias"] = (d_inner + conv + heads,)
                    shapes[m + "out_proj.bias"] = (h,)
            else:
                a = p + "self_attn."
                shapes.update({a + "q_proj.weight": (nh * hd, h),
                               a + "k_proj.weight": (nkv * hd, h),
                               a + "v_proj.weight": (nkv * hd, h),
                               a + "o_proj.weight": (h, nh * hd)})
                if cfg.get("attention_bias"):
                    shapes.update({a + "q_proj.bias": (nh * hd,), a + "k_proj.bias": (nkv * hd,),
                                   a + "v_proj.bias": (nkv * hd,), a + "o_proj.bias": (h,)})
            shapes[p + "shared_mlp.input_linear.weight"] = (2 * shared, h)
            shapes[p + "shared_mlp.output_linear.weight"] = (h, shared)
            if e:
                inter = cfg["moe_intermediate_size"]
                shapes[p + "block_sparse_moe.router.layer.weight"] = (e, h)
                shapes[p + "block_sparse_moe.input_linear.weight"] = (e, 2 * inter, h)
                shapes[p + "block_sparse_moe.output_linear.weight"] = (e, h, inter)
        return shapes
