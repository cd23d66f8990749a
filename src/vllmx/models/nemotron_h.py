"""Nemotron-H (NemotronHForCausalLM), a hybrid whose blocks each hold one mixer after one
RMSNorm, per layers_block_type (or the older hybrid_override_pattern: M mamba, * attention,
- MLP, E MoE): Mamba2 (layers/mamba2.py), attention without rope, an MLP without a gate
(up, relu^2, down), or the MoE (sigmoid routing steered by e_score_correction_bias over expert
groups, relu^2 experts without a gate, optionally in a latent space of moe_latent_size between
two projections, and a shared relu^2 expert on the block's input). From GGUF (llama.cpp's
nemotron_h, and nemotron_h_moe with experts; models/hybrid_gguf.py): the experts stacked, the
blocks' kinds from the per-layer KV heads and feed-forward lengths."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers import placement
from vllmx.layers.attention import AttentionMetadata, SelfAttention
from vllmx.layers.fused_moe import GroupedRouting, SparseMoeBlock
from vllmx.layers.linear import Linear, LMHeadLinear
from vllmx.layers.mamba2 import Mamba2Mixer, time_step_limit
from vllmx.layers.norm import ResidualAdd, RMSNorm, pre_norm
from vllmx.layers.rotary import get_rope
from vllmx.models import hybrid_gguf, moe
from vllmx.models.decoder import DecoderLM
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight

_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


class Relu2MLP:
    """down(relu(up x)^2), biases where the checkpoint has them."""

    def __init__(self, w: dict[str, Weight], p: str):
        self.up_proj = Linear(w[p + "up_proj.weight"], w.get(p + "up_proj.bias"))
        self.down_proj = Linear(w[p + "down_proj.weight"], w.get(p + "down_proj.bias"))

    def __call__(self, x):
        return self.down_proj(ops.relu2(self.up_proj(x)))


def _stacked(w: Weight) -> Weight:
    """A GGUF's stacked experts with their data [E, rows, row bytes] (a block type's come as
    [E * rows, row bytes]), as fused_experts takes them."""
    return Weight(np.asarray(w.data).reshape(w.shape[0], w.shape[1], -1), w.dtype, w.shape)


class NemotronHMoE:
    def __init__(self, cfg: dict, w: dict[str, Weight], p: str):
        e = cfg["n_routed_experts"]
        if p + "experts.up_proj.weight" in w:  # a GGUF's, stacked [E, rows, cols]
            w1, w2 = (_stacked(w[p + f"experts.{n}_proj.weight"]) for n in ("up", "down"))
        else:
            names = [p + f"experts.{j}.{n}_proj.weight" for j in range(e)
                     for n in ("up", "down")]
            require_tensors(w, names)
            ups, downs = [w[n] for n in names[0::2]], [w[n] for n in names[1::2]]
            w1 = Weight(moe.stack_experts(ups), ups[0].dtype, (e,) + tuple(ups[0].shape))
            w2 = Weight(moe.stack_experts(downs), downs[0].dtype, (e,) + tuple(downs[0].shape))
        require_tensors(w, [p + "gate.weight"])
        bias = w.get(p + "gate.e_score_correction_bias")
        routing = GroupedRouting(
            num_expert_group=int(cfg.get("n_group") or 1),
            topk_group=int(cfg.get("topk_group") or 1), scoring_func="sigmoid",
            routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
            e_score_correction_bias=None if bias is None else bias.to_float32().reshape(-1))
        self.experts = SparseMoeBlock(w[p + "gate.weight"], w1, w2, cfg["num_experts_per_tok"],
                                      bool(cfg.get("norm_topk_prob", True)), name=p[:-1],
                                      routing=routing, activation="relu2")
        self.fc1 = self.fc2 = None
        if cfg.get("moe_latent_size"):
            self.fc1 = Linear(w[p + "fc1_latent_proj.weight"], w.get(p + "fc1_latent_proj.bias"))
            self.fc2 = Linear(w[p + "fc2_latent_proj.weight"], w.get(p + "fc2_latent_proj.bias"))
        self.shared = Relu2MLP(w, p + "shared_experts.")
        self._add = ResidualAdd(cfg["hidden_size"])

    def __call__(self, x):
        routed = self.experts(x if self.fc1 is None else self.fc1(x))
        if self.fc2 is not None:
            routed = self.fc2(routed)
        shared = self.shared(x)
        self._add(routed, shared)  # shared += routed
        return shared


class NemotronHBlock:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope):
        p = f"backbone.layers.{i}.mixer."
        self.kind = cfg["layer_types"][i]
        self.mamba = self.kind == "linear_attention"
        self.norm = RMSNorm(w[f"backbone.layers.{i}.norm.weight"], cfg["layer_norm_epsilon"])
        if self.mamba:
            self.mixer = Mamba2Mixer(
                w, p, num_heads=cfg["mamba_num_heads"], head_dim=cfg["mamba_head_dim"],
                state_size=cfg["ssm_state_size"], n_groups=cfg["n_groups"],
                eps=cfg["layer_norm_epsilon"], dt_limit=cfg["dt_limit"])
        elif self.kind == "full_attention":
            self.mixer = SelfAttention(i, cfg, w, p, rope, cfg["head_dim"] ** -0.5)
        elif self.kind == "moe":
            self.mixer = NemotronHMoE(cfg, w, p)
        else:
            self.mixer = Relu2MLP(w, p)

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        h, residual = pre_norm(self.norm, h, residual)
        if self.mamba:
            return self.mixer(h, md), residual
        if self.kind == "full_attention":
            return self.mixer(positions, h, md), residual
        return self.mixer(h), residual


def _config(cfg: dict) -> dict:
    cfg = dict(cfg)
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if not types and cfg.get("hybrid_override_pattern"):
        types = [_PATTERN.get(c, c) for c in cfg["hybrid_override_pattern"]]
    types = [{"mamba": "linear_attention", "attention": "full_attention"}.get(t, t)
             for t in types or []]
    unknown = set(types) - set(_PATTERN.values())
    if not types or unknown:
        raise ValueError(f"Nemotron-H block types {sorted(unknown) or 'missing'} are not "
                         f"supported (mamba, attention, mlp, moe)")
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if cfg.get(key, want) != want:
            raise ValueError(f"Nemotron-H with {key} {cfg[key]!r} is not supported ({want})")
    cfg["layer_types"] = types
    cfg["num_hidden_layers"] = len(types)
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg["layer_norm_epsilon"] = float(cfg.get("layer_norm_epsilon") or 1e-5)
    cfg["dt_limit"] = time_step_limit(cfg)
    cfg["num_kv_cache_layers"] = types.count("full_attention")
    return cfg


class NemotronHForCausalLM(DecoderLM):
    is_hybrid = True  # request state slots beside the KV cache (worker/model_runner.py)

    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = _config(cfg)
        if "gguf_architecture" in cfg:
            weights = hybrid_gguf.hf_weights(cfg, weights)
        self.config = cfg
        require_tensors(weights, ["backbone.embeddings.weight", "backbone.norm_f.weight"])
        rope = get_rope(cfg, cfg["head_dim"]).identity()  # Nemotron-H's attention has no rope
        self.embed_tokens = placement.upload_weight(weights["backbone.embeddings.weight"],
                                                    "backbone.embeddings.weight")
        self.layers = [NemotronHBlock(i, cfg, weights, rope)
                       for i in range(len(cfg["layer_types"]))]
        self.norm = RMSNorm(weights["backbone.norm_f.weight"], cfg["layer_norm_epsilon"])
        self.lm_head = LMHeadLinear(weights.get("lm_head.weight", self.embed_tokens))
        self.vocab_size = self.lm_head.weight.shape[0]

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors of a Nemotron-H checkpoint of this config (load_format="dummy")."""
        cfg = _config(cfg)
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        heads = cfg["mamba_num_heads"]
        d_inner = heads * cfg["mamba_head_dim"]
        conv = d_inner + 2 * cfg["n_groups"] * cfg["ssm_state_size"]
        shapes = {"backbone.embeddings.weight": (v, h), "backbone.norm_f.weight": (h,)}
        if not cfg.get("tie_word_embeddings"):
            shapes["lm_head.weight"] = (v, h)

        def linear(name: str, rows: int, cols: int, bias: bool) -> None:
            shapes[name + ".weight"] = (rows, cols)
            if bias:
                shapes[name + ".bias"] = (rows,)

        mlp_bias, e = bool(cfg.get("mlp_bias")), int(cfg.get("n_routed_experts") or 0)
        latent = cfg.get("moe_latent_size") or h
        for i, kind in enumerate(cfg["layer_types"]):
            p = f"backbone.layers.{i}."
            shapes[p + "norm.weight"] = (h,)
            m = p + "mixer."
            if kind == "linear_attention":
                linear(m + "in_proj", d_inner + conv + heads, h, bool(cfg.get("use_bias")))
                shapes[m + "conv1d.weight"] = (conv, 1, int(cfg["conv_kernel"]))
                if cfg.get("use_conv_bias", True):
                    shapes[m + "conv1d.bias"] = (conv,)
                shapes[m + "A_log"] = shapes[m + "D"] = shapes[m + "dt_bias"] = (heads,)
                shapes[m + "norm.weight"] = (d_inner,)
                linear(m + "out_proj", h, d_inner, bool(cfg.get("use_bias")))
            elif kind == "full_attention":
                bias = bool(cfg.get("attention_bias"))
                linear(m + "q_proj", nh * hd, h, bias)
                linear(m + "k_proj", nkv * hd, h, bias)
                linear(m + "v_proj", nkv * hd, h, bias)
                linear(m + "o_proj", h, nh * hd, bias)
            elif kind == "mlp":
                linear(m + "up_proj", cfg["intermediate_size"], h, mlp_bias)
                linear(m + "down_proj", h, cfg["intermediate_size"], mlp_bias)
            else:
                shapes[m + "gate.weight"] = (e, h)
                shapes[m + "gate.e_score_correction_bias"] = (e,)
                inter = cfg["moe_intermediate_size"]
                for j in range(e):
                    shapes[m + f"experts.{j}.up_proj.weight"] = (inter, latent)
                    shapes[m + f"experts.{j}.down_proj.weight"] = (latent, inter)
                shared = cfg["moe_shared_expert_intermediate_size"]
                linear(m + "shared_experts.up_proj", shared, h, mlp_bias)
                linear(m + "shared_experts.down_proj", h, shared, mlp_bias)
                if cfg.get("moe_latent_size"):
                    linear(m + "fc1_latent_proj", latent, h, mlp_bias)
                    linear(m + "fc2_latent_proj", h, latent, mlp_bias)
        return shapes

    def allocate_states(self, num_slots: int) -> None:
        for layer in self.layers:
            if layer.mamba:
                layer.mixer.allocate_states(num_slots)
