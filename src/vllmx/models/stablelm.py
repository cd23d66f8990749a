"""StableLM (StableLmForCausalLM: StableLM 2, StableLM 3B 4E1T). Against the Llama family:
LayerNorms with biases, rope over the first partial_rotary_factor of each head (neox style), q/k/v
biases when use_qkv_bias, and two switches: qk_layernorm (a LayerNorm without bias on each q and k
head, each head its own weight, before rope) and use_parallel_residual (attention and MLP both
read the one input_layernorm's output and join the residual together; no
post_attention_layernorm). GGUF ("stablelm"): the q/k norms stacked [heads, head_dim], and both
switches read from the tensors present, as llama.cpp does."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import Linear, LMHeadLinear, MergedLinear
from vllmx.layers.norm import LayerNorm, ResidualAdd
from vllmx.layers.rotary import RotaryEmbedding, get_rope
from vllmx.models.decoder import DecoderLM
from vllmx.models.llama import gguf_name_to_hf
from vllmx.models.shapes import decoder_shapes, require_tensors
from vllmx.ops import Weight

_LAYER_TENSORS = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def per_head_norm(w: dict[str, Weight], prefix: str, num_heads: int, eps: float) -> LayerNorm:
    """StableLM's LayerNormPerHead (prefix.norms.{h}.weight, no bias; a GGUF's prefix.weight
    stacked already) as one LayerNorm over [heads, head_dim] weights."""
    if prefix + ".weight" in w:
        return LayerNorm(w[prefix + ".weight"], None, eps)
    stacked = np.stack([w[f"{prefix}.norms.{h}.weight"].to_float32().reshape(-1)
                        for h in range(num_heads)])
    return LayerNorm(Weight.from_numpy(stacked), None, eps)


class StableLmDecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope: RotaryEmbedding,
                 add: ResidualAdd):
        p = f"model.layers.{i}."
        eps = cfg["layer_norm_eps"]
        nq, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.qkv_sizes = [nq * d, nkv * d, nkv * d]
        qkv = [p + f"self_attn.{n}_proj" for n in "qkv"]
        self.qkv_proj = MergedLinear([w[n + ".weight"] for n in qkv],
                                     [w.get(n + ".bias") for n in qkv])
        self.o_proj = Linear(w[p + "self_attn.o_proj.weight"])
        self.q_layernorm = self.k_layernorm = None
        if cfg["qk_layernorm"]:
            self.q_layernorm = per_head_norm(w, p + "self_attn.q_layernorm", nq, eps)
            self.k_layernorm = per_head_norm(w, p + "self_attn.k_layernorm", nkv, eps)
        self.rope = rope
        self.attn = Attention(i, nq, nkv, d, d ** -0.5)
        self.gate_up_proj = MergedLinear([w[p + "mlp.gate_proj.weight"],
                                          w[p + "mlp.up_proj.weight"]], [None, None])
        self.down_proj = Linear(w[p + "mlp.down_proj.weight"])
        self.input_layernorm = LayerNorm(w[p + "input_layernorm.weight"],
                                         w[p + "input_layernorm.bias"], eps)
        self.post_attention_layernorm = None
        if not cfg["use_parallel_residual"]:
            self.post_attention_layernorm = LayerNorm(w[p + "post_attention_layernorm.weight"],
                                                      w[p + "post_attention_layernorm.bias"], eps)
        self.add = add

    def mlp(self, x):
        return self.down_proj(self.gate_up_proj.act_and_mul(x, "silu"))

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        """As the Llama layers: returns (branch output, residual stream), the branch output being
        added to the stream by the next norm."""
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        qkv = self.qkv_proj(x)
        if self.q_layernorm is not None:  # per-head LayerNorms, then rope
            q, k, v = ops.split_columns(qkv, self.qkv_sizes)
            a = self.attn.forward(self.q_layernorm(q), self.k_layernorm(k), v, positions,
                                  self.rope, md)
        else:
            a = self.attn.forward_qkv(qkv, positions, self.rope, None, None, md)
        a = self.o_proj(a)
        if self.post_attention_layernorm is None:  # parallel: h + attn(ln(h)) + mlp(ln(h))
            m = self.mlp(x)
            self.add(a, residual)
            return m, residual
        x, residual = self.post_attention_layernorm(a, residual)
        return self.mlp(x), residual


class StableLmForCausalLM(DecoderLM):
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        gguf_arch = cfg.get("gguf_architecture")
        if gguf_arch is not None:
            weights = {gguf_name_to_hf(k, gguf_arch): v for k, v in weights.items()}
            cfg["qk_layernorm"] = "model.layers.0.self_attn.q_layernorm.weight" in weights
            cfg["use_parallel_residual"] = ("model.layers.0.post_attention_layernorm.weight"
                                            not in weights)
        cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
        cfg.setdefault("layer_norm_eps", 1e-5)
        cfg["qk_layernorm"] = bool(cfg.get("qk_layernorm"))
        cfg["use_parallel_residual"] = bool(cfg.get("use_parallel_residual"))
        act = cfg.get("hidden_act") or "silu"
        if act != "silu":
            raise ValueError(f"StableLM with hidden_act {act!r} is not supported")
        rope = dict(cfg.get("rope_parameters") or {})
        rope.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        cfg["rope_parameters"] = rope
        self.config = cfg
        self._check_weights(weights)

        self.rope = get_rope(cfg, cfg["head_dim"])
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight")
        self._add = ResidualAdd(cfg["hidden_size"])
        self.layers = [StableLmDecoderLayer(i, cfg, weights, self.rope, self._add)
                       for i in range(cfg["num_hidden_layers"])]
        self.norm = LayerNorm(weights["model.norm.weight"], weights["model.norm.bias"],
                              cfg["layer_norm_eps"])
        self.lm_head = LMHeadLinear(weights.get("lm_head.weight", self.embed_tokens))
        self.vocab_size = self.lm_head.weight.shape[0]

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy"):
        LayerNorm biases, q/k/v biases (use_qkv_bias), per-head q/k norms (qk_layernorm), no
        post_attention_layernorm with parallel residual."""
        parallel = bool(cfg.get("use_parallel_residual"))
        norms = ("input_layernorm",) + (() if parallel else ("post_attention_layernorm",))
        shapes = decoder_shapes(cfg, norms, qk_norm=False, qkv_bias=bool(cfg.get("use_qkv_bias")),
                                o_bias=False, tied=bool(cfg.get("tie_word_embeddings")))
        shapes["model.norm.bias"] = shapes["model.norm.weight"]
        nq = cfg["num_attention_heads"]
        nkv, d = cfg.get("num_key_value_heads") or nq, cfg["hidden_size"] // nq
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            for norm in norms:
                shapes[f"{p}{norm}.bias"] = shapes[f"{p}{norm}.weight"]
            if cfg.get("qk_layernorm"):
                for name, heads in (("q_layernorm", nq), ("k_layernorm", nkv)):
                    for h in range(heads):
                        shapes[f"{p}self_attn.{name}.norms.{h}.weight"] = (d,)
        return shapes

    def _check_weights(self, weights: dict[str, Weight]) -> None:
        needed = ["model.embed_tokens.weight", "model.norm.weight", "model.norm.bias"]
        for i in range(self.config["num_hidden_layers"]):
            p = f"model.layers.{i}."
            needed += [f"{p}{n}.weight" for n in _LAYER_TENSORS] + [f"{p}input_layernorm.bias"]
            if not self.config["use_parallel_residual"]:
                needed += [f"{p}post_attention_layernorm.{s}" for s in ("weight", "bias")]
            if self.config["qk_layernorm"]:
                for name, heads in (("q_layernorm", self.config["num_attention_heads"]),
                                    ("k_layernorm", self.config["num_key_value_heads"])):
                    needed += ([f"{p}self_attn.{name}.weight"] if "gguf_architecture" in self.config
                               else [f"{p}self_attn.{name}.norms.{h}.weight" for h in range(heads)])
        require_tensors(weights, needed)
