"""The post-norm decoders: OLMo 2 and OLMo 3 (Olmo2ForCausalLM, Olmo3ForCausalLM; GGUF "olmo2",
which holds both) and EXAONE 4 (Exaone4ForCausalLM). Against the Llama family: norms after
attention and after the MLP, each on its branch before the residual add (no pre-norms). OLMo
RMS-norms q and k over the whole projection width (all heads together); OLMo 3 adds
sliding-window layers per its layer_types, with rope scaling on the full-attention layers only.
EXAONE 4 norms q and k per head, as Qwen3, and its full-attention layers take no rope (NoPE)
when it has sliding ones."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.distributed.parallel_state import get_tp_group
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import (
    MergedLinear,
    ParallelLMHead,
    RowParallelLinear,
    vocab_parallel_embedding,
)
from vllmx.layers.norm import ResidualAdd, RMSNorm
from vllmx.layers.rotary import RotaryEmbedding
from vllmx.models.llama import gguf_name_to_hf
from vllmx.models.shapes import decoder_shapes, require_tensors
from vllmx.ops import Weight

_LAYER_TENSORS = (
    "post_attention_layernorm", "post_feedforward_layernorm", "self_attn.q_proj",
    "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
    "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def rope_parameters(cfg: dict) -> dict[str, dict]:
    """Rope theta and scaling per layer type: transformers 5's per-type rope_parameters, else
    one set (rope_parameters, or the older rope_theta / rope_scaling), which OLMo 3 (also as
    GGUF: olmo2 with a window) scales on its full layers only."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        return {t: dict(params.get(t) or {}) for t in ("full_attention", "sliding_attention")}
    one = {**(cfg.get("rope_scaling") or {}), **params}
    one["rope_theta"] = cfg.get("rope_theta") or params.get("rope_theta") or 1e4
    olmo3 = ("Olmo3ForCausalLM" in (cfg.get("architectures") or [])
             or bool(cfg.get("gguf_architecture") == "olmo2" and cfg.get("sliding_window")))
    return {"full_attention": one,
            "sliding_attention": {"rope_theta": one["rope_theta"]} if olmo3 else one}


def _rope(cfg: dict, params: dict, freq_factors: Weight | None) -> RotaryEmbedding:
    """freq_factors: a GGUF's rope_freqs (llama3 scaling as llama.cpp stores it)."""
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return RotaryEmbedding(cfg["head_dim"], cfg["head_dim"],
                           int(cfg.get("max_position_embeddings") or 2048),
                           float(params.get("rope_theta") or 1e4), True, scaling,
                           None if freq_factors is None else
                           freq_factors.to_float32().reshape(-1),
                           num_positions=cfg.get("max_model_len"))


def exaone4_layer_types(pattern: int | str, n: int) -> list[str]:
    """EXAONE 4's sliding_window_pattern: every pattern-th layer global, or a string of L (local)
    and G (global) repeated from layer 0, the last layer global either way."""
    if isinstance(pattern, str):
        types = ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention"
                 for i in range(n)]
    else:
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    return types[:-1] + ["full_attention"]


class Olmo2DecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope: RotaryEmbedding,
                 sliding_window: int):
        p = f"model.layers.{i}."
        eps = cfg["rms_norm_eps"]
        nq, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.head_dim = d
        self.qkv_sizes = [nq * d, nkv * d, nkv * d]
        self.qk_norm_per_head = cfg["qk_norm_per_head"]
        qkv = [p + f"self_attn.{n}_proj" for n in "qkv"]
        self.qkv_proj = MergedLinear([w[n + ".weight"] for n in qkv],
                                     [w.get(n + ".bias") for n in qkv])
        self.o_proj = RowParallelLinear(w[p + "self_attn.o_proj.weight"],
                                        w.get(p + "self_attn.o_proj.bias"))
        self.q_norm = RMSNorm(w[p + "self_attn.q_norm.weight"], eps)  # [nq * d] or [d]
        self.k_norm = RMSNorm(w[p + "self_attn.k_norm.weight"], eps)  # [nkv * d] or [d]
        # Tensor parallelism: OLMo's norms span every head (whole weights), so a rank gathers
        # the ranks' q / k, norms them whole and keeps its columns (vLLM does the same).
        self.tp_group = get_tp_group()
        if (self.tp_group is not None and not self.qk_norm_per_head
                and w[p + "self_attn.k_norm.weight"].shape[0] != nkv * d * self.tp_group.world_size):
            raise ValueError(f"OLMo with {nkv} kv heads a rank cannot norm k over the whole "
                             f"width at tensor_parallel_size={self.tp_group.world_size}: its kv "
                             f"heads must split evenly")
        self.rope = rope
        self.attn = Attention(i, nq, nkv, d, d ** -0.5, sliding_window)
        self.gate_up_proj = MergedLinear([w[p + "mlp.gate_proj.weight"],
                                          w[p + "mlp.up_proj.weight"]], [None, None])
        self.down_proj = RowParallelLinear(w[p + "mlp.down_proj.weight"])
        self.post_attention_layernorm = RMSNorm(w[p + "post_attention_layernorm.weight"], eps)
        self.post_feedforward_layernorm = RMSNorm(w[p + "post_feedforward_layernorm.weight"],
                                                  eps)

    def __call__(self, positions, h, md: AttentionMetadata, add):
        """h (the residual stream) in, updated in place: h += norm(attn(h)); h += norm(mlp(h))."""
        if self.qk_norm_per_head:  # the fused prologue: per-head norms, rope, cache write
            a = self.attn.forward_qkv(self.qkv_proj(h), positions, self.rope, self.q_norm,
                                      self.k_norm, md)
        else:
            q, k, v = ops.split_columns(self.qkv_proj(h), self.qkv_sizes)
            a = self.attn.forward(self._norm_whole(q, self.q_norm),
                                  self._norm_whole(k, self.k_norm), v, positions, self.rope, md)
        add(self.post_attention_layernorm(self.o_proj(a)), h)
        m = self.down_proj(self.gate_up_proj.act_and_mul(h, "silu"))
        add(self.post_feedforward_layernorm(m), h)
        return h

    def _norm_whole(self, x, norm: RMSNorm):
        """norm over the whole width: this rank's columns of norm(every rank's x side by side)."""
        g = self.tp_group
        if g is None:
            return norm(x)
        n = x.shape[1]
        return ops.split_columns(norm(g.all_gather(x, n * g.world_size, n)),
                                 [n] * g.world_size)[g.rank]


class Olmo2ForCausalLM:
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        if "gguf_architecture" in cfg:
            arch = cfg["gguf_architecture"]
            weights = {gguf_name_to_hf(k, arch): v for k, v in weights.items()}
        cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        cfg.setdefault("rms_norm_eps", 1e-6)
        exaone4 = ("Exaone4ForCausalLM" in (cfg.get("architectures") or [])
                   or cfg.get("gguf_architecture") == "exaone4")
        name = "EXAONE 4" if exaone4 else "OLMo"
        cfg["qk_norm_per_head"] = exaone4
        act = cfg.get("hidden_act") or "silu"
        if act != "silu":
            raise ValueError(f"{name} with hidden_act {act!r} is not supported")
        if cfg.get("clip_qkv"):
            raise ValueError("OLMo with clip_qkv is not supported")
        n = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or ["full_attention"] * n
        if exaone4 and not cfg.get("layer_types") and cfg.get("sliding_window"):
            types = exaone4_layer_types(cfg.get("sliding_window_pattern") or 4, n)
        if "gguf_architecture" in cfg:
            # llama.cpp: olmo2 with a window (OLMo 3) slides 3 of every 4 layers, exaone4 only
            # at 64 layers (the 32B; window 4096 unless the file says), none otherwise.
            slides = (bool(cfg.get("sliding_window")) if cfg["gguf_architecture"] == "olmo2"
                      else n == 64)
            if slides:
                cfg["sliding_window"] = cfg.get("sliding_window") or 4096
            else:
                cfg["sliding_window"] = None
            types = ["sliding_attention" if slides and i % 4 < 3 else "full_attention"
                     for i in range(n)]
        if len(types) != n:
            raise ValueError(f"layer_types has {len(types)} entries for {n} layers")
        self.config = cfg
        self._check_weights(weights)

        ropes = {t: _rope(cfg, p, weights.get("rope_freqs.weight"))
                 for t, p in rope_parameters(cfg).items()}
        window = int(cfg.get("sliding_window") or 0)
        if exaone4 and window and "sliding_attention" in types:  # hybrid: global layers NoPE
            ropes["full_attention"] = ropes["full_attention"].identity()
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight")
        self.layers = [
            Olmo2DecoderLayer(i, cfg, weights, ropes[t], window if t == "sliding_attention" else 0)
            for i, t in enumerate(types)]
        self.norm = RMSNorm(weights["model.norm.weight"], cfg["rms_norm_eps"])
        self._add = ResidualAdd(cfg["hidden_size"])  # residual += x (x is overwritten)
        self.lm_head = ParallelLMHead(weights.get("lm_head.weight", self.embed_tokens),
                                      cfg.get("vocab_size"))
        self.vocab_size = self.lm_head.vocab_size
        # (under tensor parallelism: this rank's heads, and the vocabulary rows lm_head's)
        self.tp_group, self.vocab_start = get_tp_group(), self.lm_head.vocab_start

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy"):
        q/k norms over the whole projection width (OLMo) or one head (EXAONE 4)."""
        shapes = decoder_shapes(
            cfg, ("post_attention_layernorm", "post_feedforward_layernorm"), qk_norm=False,
            qkv_bias=bool(cfg.get("attention_bias")), o_bias=bool(cfg.get("attention_bias")),
            tied=bool(cfg.get("tie_word_embeddings")))
        nq = cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads") or nq
        hd = cfg.get("head_dim") or cfg["hidden_size"] // nq
        per_head = "Exaone4ForCausalLM" in (cfg.get("architectures") or [])
        for i in range(cfg["num_hidden_layers"]):
            shapes[f"model.layers.{i}.self_attn.q_norm.weight"] = (hd if per_head else nq * hd,)
            shapes[f"model.layers.{i}.self_attn.k_norm.weight"] = (hd if per_head else nkv * hd,)
        return shapes

    def _check_weights(self, weights: dict[str, Weight]) -> None:
        needed = ["model.embed_tokens.weight", "model.norm.weight"]
        for i in range(self.config["num_hidden_layers"]):
            needed += [f"model.layers.{i}.{n}.weight" for n in _LAYER_TENSORS]
        require_tensors(weights, needed)

    def forward(self, input_ids: np.ndarray, positions: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        h = vocab_parallel_embedding(input_ids, self.embed_tokens, self.tp_group,
                                     self.vocab_start)
        for layer in self.layers:
            h = layer(positions, h, md, self._add)
        return self.norm(h)

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        return self.lm_head(hidden)
