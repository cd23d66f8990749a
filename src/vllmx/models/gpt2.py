"""GPT-2 (GPT2LMHeadModel). Against the Llama family: learned absolute position embeddings (wpe,
added to the token embeddings; no rope), Conv1D weights stored [in, out] (transposed at load),
one c_attn projection for [q; k; v], LayerNorms and projections with biases, an MLP without a gate
(gelu_new), lm_head tied to wte. scale_attn_weights and scale_attn_by_inverse_layer_idx set the
attention scale per layer. GGUF ("gpt2"): Conv1D weights stored [out, in] by llama.cpp's converter,
the attention scale always 1 / sqrt(head_dim) (llama.cpp's)."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import Linear, LMHeadLinear, vocab_parallel_embedding
from vllmx.layers.mlp import GeluMLP
from vllmx.layers.norm import LayerNorm
from vllmx.layers.rotary import RotaryEmbedding
from vllmx.models.llama import gguf_name_to_hf
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight
from vllmx.pages import release_file_pages

_LAYER_TENSORS = ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def conv1d_weight(w: Weight) -> Weight:
    """A Conv1D weight [in, out] as a Linear's [out, in] (a dense copy)."""
    data = np.ascontiguousarray(np.asarray(w.data).T)
    release_file_pages(w.data)
    return Weight(data, w.dtype, data.shape)


class GPT2Block:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], nope: RotaryEmbedding):
        p = f"transformer.h.{i}."
        eps = cfg["layer_norm_epsilon"]
        nh, d = cfg["num_attention_heads"], cfg["head_dim"]

        def weight(name):
            return conv1d_weight(w[name]) if cfg["conv1d"] else w[name]

        def linear(name):
            return Linear(weight(p + name + ".weight"), w[p + name + ".bias"])

        self.c_attn = linear("attn.c_attn")  # [q; k; v], heads in order within each
        self.c_proj = linear("attn.c_proj")
        scale = d ** -0.5 if cfg.get("scale_attn_weights", True) else 1.0
        if cfg.get("scale_attn_by_inverse_layer_idx"):
            scale /= float(i + 1)
        self.rope = nope
        self.attn = Attention(i, nh, nh, d, scale)
        self.mlp = GeluMLP(weight(p + "mlp.c_fc.weight"), w[p + "mlp.c_fc.bias"],
                           weight(p + "mlp.c_proj.weight"), w[p + "mlp.c_proj.bias"],
                           cfg["activation_function"], "GPT-2")
        self.ln_1 = LayerNorm(w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        self.ln_2 = LayerNorm(w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        """As the Llama layers: returns (MLP output, residual stream), the MLP output being added
        to the stream by the next norm. The first block gets (position embeddings, token
        embeddings), so that its norm adds the two."""
        x, residual = self.ln_1(h, residual)
        a = self.c_proj(self.attn.forward_qkv(self.c_attn(x), positions, self.rope, None, None,
                                              md))
        x, residual = self.ln_2(a, residual)
        return self.mlp(x), residual


class GPT2LMHeadModel:
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        gguf_arch = cfg.get("gguf_architecture")
        if gguf_arch is not None:  # the common names for GPT-2's
            weights = {gguf_name_to_hf(k, gguf_arch): v for k, v in weights.items()}
            cfg.update(n_embd=cfg["hidden_size"], n_layer=cfg["num_hidden_layers"],
                       n_head=cfg["num_attention_heads"],
                       n_positions=cfg["max_position_embeddings"])
        cfg["conv1d"] = gguf_arch is None
        # Checkpoints saved from GPT2Model (openai-community/gpt2) have no "transformer." prefix.
        weights = {k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k: v
                   for k, v in weights.items()}
        if cfg.get("add_cross_attention"):
            raise ValueError("GPT-2 with add_cross_attention is not supported (vllmx runs "
                             "decoder-only models)")
        # The names the workers read (KV cache sizing), from GPT-2's own.
        cfg["hidden_size"] = cfg["n_embd"]
        cfg["num_hidden_layers"] = cfg["n_layer"]
        cfg["num_attention_heads"] = cfg["num_key_value_heads"] = cfg["n_head"]
        cfg["head_dim"] = cfg["n_embd"] // cfg["n_head"]
        cfg["max_position_embeddings"] = cfg.get("n_positions") or 1024
        cfg.setdefault("layer_norm_epsilon", 1e-5)
        cfg["activation_function"] = cfg.get("activation_function") or "gelu_new"
        self.config = cfg
        self._check_weights(weights)

        self.wte = placement.upload_weight(weights["transformer.wte.weight"],
                                           "transformer.wte.weight")
        self.wpe = placement.upload_weight(weights["transformer.wpe.weight"],
                                           "transformer.wpe.weight")
        # No rope: the attention prologue runs with every angle 0 (q and k left exactly as they
        # are) over one pair of dims.
        nope = RotaryEmbedding(cfg["head_dim"], 2, cfg["max_position_embeddings"], 1e4, True,
                               num_positions=cfg.get("max_model_len")).identity()
        self.h = [GPT2Block(i, cfg, weights, nope) for i in range(cfg["num_hidden_layers"])]
        self.ln_f = LayerNorm(weights["transformer.ln_f.weight"], weights["transformer.ln_f.bias"],
                              cfg["layer_norm_epsilon"])
        self.lm_head = LMHeadLinear(weights.get("lm_head.weight", self.wte))
        self.vocab_size = self.lm_head.weight.shape[0]

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy"),
        Conv1D weights as stored ([in, out])."""
        h, v = cfg["n_embd"], cfg["vocab_size"]
        inner = cfg.get("n_inner") or 4 * h
        shapes = {"transformer.wte.weight": (v, h),
                  "transformer.wpe.weight": (cfg.get("n_positions") or 1024, h),
                  "transformer.ln_f.weight": (h,), "transformer.ln_f.bias": (h,)}
        if not cfg.get("tie_word_embeddings", True):
            shapes["lm_head.weight"] = (v, h)
        for i in range(cfg["n_layer"]):
            p = f"transformer.h.{i}."
            for name, k, n in (("attn.c_attn", h, 3 * h), ("attn.c_proj", h, h),
                               ("mlp.c_fc", h, inner), ("mlp.c_proj", inner, h)):
                shapes[f"{p}{name}.weight"], shapes[f"{p}{name}.bias"] = (k, n), (n,)
            for norm in ("ln_1", "ln_2"):
                shapes[f"{p}{norm}.weight"] = shapes[f"{p}{norm}.bias"] = (h,)
        return shapes

    def _check_weights(self, weights: dict[str, Weight]) -> None:
        needed = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                  "transformer.ln_f.bias"]
        for i in range(self.config["num_hidden_layers"]):
            needed += [f"transformer.h.{i}.{n}.{s}" for n in _LAYER_TENSORS
                       for s in ("weight", "bias")]
        require_tensors(weights, needed)

    def forward(self, input_ids: np.ndarray, positions: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        h = ops.embedding(positions, self.wpe)
        residual = vocab_parallel_embedding(input_ids, self.wte)
        for block in self.h:
            h, residual = block(positions, h, residual, md)
        h, _ = self.ln_f(h, residual)
        return h

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        return self.lm_head(hidden)
