"""Starcoder2 (Starcoder2ForCausalLM). Against the Llama family: LayerNorms with biases, biases
on every projection (use_bias), an MLP without a gate (c_fc, gelu_pytorch_tanh, c_proj), a
sliding window on every layer when the config has one, tied embeddings by default. GGUF
("starcoder2"): c_fc and c_proj are ffn_up and ffn_down."""

from __future__ import annotations

from vllmx.distributed.parallel_state import get_tp_group
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import MergedLinear, ParallelLMHead, RowParallelLinear
from vllmx.layers.mlp import GeluMLP
from vllmx.layers.norm import LayerNorm
from vllmx.layers.rotary import RotaryEmbedding, get_rope
from vllmx.models.decoder import DecoderLM
from vllmx.models.llama import gguf_name_to_hf
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight

_LAYER_TENSORS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                  "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.c_fc",
                  "mlp.c_proj")


class Starcoder2DecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope: RotaryEmbedding):
        p = f"model.layers.{i}."
        eps = cfg["norm_epsilon"]
        nq, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

        def norm(name):
            return LayerNorm(w[p + name + ".weight"], w[p + name + ".bias"], eps)

        qkv = [p + f"self_attn.{n}_proj" for n in "qkv"]
        self.qkv_proj = MergedLinear([w[n + ".weight"] for n in qkv],
                                     [w.get(n + ".bias") for n in qkv])
        self.o_proj = RowParallelLinear(w[p + "self_attn.o_proj.weight"],
                                        w.get(p + "self_attn.o_proj.bias"))
        self.rope = rope
        self.attn = Attention(i, nq, nkv, d, d ** -0.5, cfg["attn_sliding_window"])
        self.mlp = GeluMLP(w[p + "mlp.c_fc.weight"], w.get(p + "mlp.c_fc.bias"),
                           w[p + "mlp.c_proj.weight"], w.get(p + "mlp.c_proj.bias"),
                           cfg["hidden_act"], "Starcoder2")
        self.input_layernorm = norm("input_layernorm")
        self.post_attention_layernorm = norm("post_attention_layernorm")

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        """As the Llama layers: returns (MLP output, residual stream), the MLP output being added
        to the stream by the next norm."""
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        a = self.o_proj(self.attn.forward_qkv(self.qkv_proj(x), positions, self.rope, None, None,
                                              md))
        x, residual = self.post_attention_layernorm(a, residual)
        return self.mlp(x), residual


class Starcoder2ForCausalLM(DecoderLM):
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        if cfg.get("gguf_architecture") is not None:
            weights = {gguf_name_to_hf(k, cfg["gguf_architecture"]): v for k, v in weights.items()}
        cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        # (tensor parallelism's share keeps the whole model's head_dim, tp_shard.tp_config)
        cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        cfg.setdefault("norm_epsilon", 1e-5)
        cfg["hidden_act"] = cfg.get("hidden_act") or "gelu_pytorch_tanh"
        cfg["attn_sliding_window"] = int(cfg.get("sliding_window") or 0)
        self.config = cfg
        self._check_weights(weights)

        self.rope = get_rope(cfg, cfg["head_dim"])
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight")
        self.layers = [Starcoder2DecoderLayer(i, cfg, weights, self.rope)
                       for i in range(cfg["num_hidden_layers"])]
        self.norm = LayerNorm(weights["model.norm.weight"], weights["model.norm.bias"],
                              cfg["norm_epsilon"])
        self.lm_head = ParallelLMHead(weights.get("lm_head.weight", self.embed_tokens),
                                      cfg.get("vocab_size"))
        self.vocab_size = self.lm_head.vocab_size
        self.tp_group = get_tp_group()  # (under tensor parallelism: this rank's heads, rows)
        self.vocab_start = self.lm_head.vocab_start  # (embed_tokens holds the same rows)

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy")."""
        h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
        nq = cfg["num_attention_heads"]
        nkv, d = cfg.get("num_key_value_heads") or nq, h // nq
        bias = cfg.get("use_bias", True)
        shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
                  "model.norm.bias": (h,)}
        if not cfg.get("tie_word_embeddings", True):
            shapes["lm_head.weight"] = (v, h)
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            for name, out, k in (("self_attn.q_proj", nq * d, h), ("self_attn.k_proj", nkv * d, h),
                                 ("self_attn.v_proj", nkv * d, h), ("self_attn.o_proj", h, nq * d),
                                 ("mlp.c_fc", inter, h), ("mlp.c_proj", h, inter)):
                shapes[f"{p}{name}.weight"] = (out, k)
                if bias:
                    shapes[f"{p}{name}.bias"] = (out,)
            for norm in ("input_layernorm", "post_attention_layernorm"):
                shapes[f"{p}{norm}.weight"] = shapes[f"{p}{norm}.bias"] = (h,)
        return shapes

    def _check_weights(self, weights: dict[str, Weight]) -> None:
        needed = ["model.embed_tokens.weight", "model.norm.weight", "model.norm.bias"]
        for i in range(self.config["num_hidden_layers"]):
            needed += [f"model.layers.{i}.{n}.weight" for n in _LAYER_TENSORS]
            needed += [f"model.layers.{i}.{n}.bias" for n in _LAYER_TENSORS[:2]]
        require_tensors(weights, needed)
