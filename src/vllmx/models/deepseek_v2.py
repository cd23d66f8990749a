"""DeepSeek V2 and V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM; Kimi K2 is V3's shape):
multi-head latent attention (layers/mla.py) with its compressed cache, the first
first_k_dense_replace layers a dense SwiGLU MLP and the others DeepSeek's MoE (grouped routing,
shared experts; models/moe.py). V2 routes on softmax scores (greedy or group_limited_greedy),
V3 on sigmoid scores steered by e_score_correction_bias (noaux_tc); both rotate interleaved
pairs (V3's rope_interleave) over the qk_rope_head_dim part of q and of the one shared k_pe, and
scale attention by YaRN's mscale^2 where the rope is YaRN with mscale_all_dim. A GGUF (llama.cpp's
deepseek2) runs as llama.cpp runs it where llama.cpp departs from transformers: expert groups
scored by their two best experts also under softmax (gguf_weights), and YaRN's scales as its
loader reads them (loader/gguf.py)."""

from __future__ import annotations

import math

import numpy as np

from vllmx.device import F32
from vllmx.distributed.parallel_state import get_pp_stage, get_tp_group
from vllmx.layers import placement
from vllmx.layers.attention import AttentionMetadata
from vllmx.layers.fused_moe import SwiGLUMLP
from vllmx.layers.linear import ParallelLMHead
from vllmx.layers.mla import MLAAttention
from vllmx.layers.norm import RMSNorm, pre_norm
from vllmx.layers.rotary import get_rope
from vllmx.models import moe
from vllmx.models.decoder import DecoderLM
from vllmx.models.llama import gguf_name_to_hf
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight


def _softmax_scale(cfg: dict) -> float:
    """qk_head_dim^-1/2, times mscale(factor, mscale_all_dim)^2 under YaRN (transformers' and
    vLLM's yarn_get_mscale)."""
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rope = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    kind = rope.get("rope_type", rope.get("type", "default"))
    m_all, factor = rope.get("mscale_all_dim"), rope.get("factor") or 1.0
    if kind != "default" and m_all and factor > 1:
        m = 0.1 * m_all * math.log(factor) + 1.0
        scale *= m * m
    return scale


class DeepseekV2DecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope, scale: float):
        p = f"model.layers.{i}."
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(w[p + "input_layernorm.weight"], eps)
        self.self_attn = MLAAttention(i, cfg, w, p + "self_attn.", rope, scale)
        self.post_attention_layernorm = RMSNorm(w[p + "post_attention_layernorm.weight"], eps)
        if cfg["sparse_layers"][i]:
            self.mlp = moe.sparse_block(cfg, w, i)
        else:
            self.mlp = SwiGLUMLP([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]],
                                 w[p + "mlp.down_proj.weight"])

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        h, residual = pre_norm(self.input_layernorm, h, residual)
        h = self.self_attn(positions, h, md)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


def gguf_weights(cfg: dict, weights: dict[str, Weight]) -> dict[str, Weight]:
    """A deepseek2 GGUF's tensors under the HF names (the name table in models/llama.py; the
    multi-token-prediction blocks past num_hidden_layers left out); a tensor vllmx would not
    read is refused by name. llama.cpp scores an expert group by its two best experts whether
    or not there is a choice bias (vLLM's grouped_topk: by its best one without): a zero bias
    where the file has none makes grouped_topk score groups as llama.cpp does."""
    n = cfg["num_hidden_layers"]
    out = {}
    for name, w in weights.items():
        parts = name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= n:
            continue
        hf = gguf_name_to_hf(name, "deepseek2")
        if hf == name:
            raise ValueError(f"GGUF deepseek2: tensor {name!r} is not supported")
        out[hf] = w
    if cfg["n_group"] > 1:
        zero = np.zeros(cfg["num_experts"], np.float32)
        for i in range(cfg["first_k_dense_replace"], n):
            out.setdefault(f"model.layers.{i}.mlp.gate.e_score_correction_bias",
                           Weight(zero, F32, zero.shape))
    return out


class DeepseekV2ForCausalLM(DecoderLM):
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = moe.moe_config(dict(cfg))
        if cfg.get("gguf_architecture") is not None:
            weights = gguf_weights(cfg, weights)
        cfg.setdefault("rms_norm_eps", 1e-6)
        # V3's multi-token-prediction layers (num_nextn_predict_layers, stored past the last
        # layer) are a drafter's (models/mtp.py, speculative method mtp; mtp_block below);
        # decoding here does not read them.
        interleave = cfg.get("rope_interleave", True)
        dr, r = cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]
        # The KV cache the workers allocate: one head of the latent row, one buffer for K and V.
        cfg["num_key_value_heads"], cfg["head_dim"], cfg["use_mla"] = 1, dr + r, True
        self.config = cfg
        self._check_weights(weights)
        # (kept: the multi-token-prediction layer attends as the others do)
        self.rope = rope = get_rope(cfg, dr + r, is_neox_style=not interleave, rotary_dim=dr)
        self.attn_scale = scale = _softmax_scale(cfg)
        # Tensor parallelism: this rank's heads and vocabulary rows (distributed/tp_shard.py);
        # pipeline parallelism: this stage's layers, embed and lm_head on the first.
        self.tp_group, self.pp_stage = get_tp_group(), get_pp_stage()
        pp, n = self.pp_stage, cfg["num_hidden_layers"]
        first = pp is None or pp.is_first
        start, end = (0, n) if pp is None else pp.layers(n)
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight") if first else None
        self.layers = [DeepseekV2DecoderLayer(i, cfg, weights, rope, scale)
                       if start <= i < end else None for i in range(n)]
        # Whole prompts' prefill on decompressed keys and values (layers/mla.py; the runner
        # marks such steps).
        self.mla_decompressed_prefill = any(
            layer is not None and layer.self_attn.kv_b_proj is not None for layer in self.layers)
        self.norm = RMSNorm(weights["model.norm.weight"], cfg["rms_norm_eps"])
        self.lm_head = ParallelLMHead(weights.get("lm_head.weight", self.embed_tokens),
                                      cfg.get("vocab_size")) if first else None
        self.vocab_size = self.lm_head.vocab_size if first else int(cfg["vocab_size"])
        if self.lm_head is not None:  # (embed_tokens holds the same rows)
            self.vocab_start = self.lm_head.vocab_start

    def mtp_block(self, weights: dict[str, Weight], i: int) -> DeepseekV2DecoderLayer:
        """Decoder layer i >= num_hidden_layers, the multi-token-prediction layer's (the MoE
        rule, first_k_dense_replace and moe_layer_freq, extended to its index)."""
        cfg = moe.moe_config({**self.config, "num_hidden_layers": i + 1})
        return DeepseekV2DecoderLayer(i, cfg, weights, self.rope, self.attn_scale)

    def _check_weights(self, weights) -> None:
        cfg = self.config
        needed = ["model.embed_tokens.weight", "model.norm.weight"]
        q = (("q_a_proj", "q_a_layernorm", "q_b_proj") if cfg.get("q_lora_rank")
             else ("q_proj",))
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            kv_b = (("kv_b_proj",) if f"{p}self_attn.kv_b_proj.weight" in weights
                    else ("k_b_proj", "v_b_proj"))  # llama.cpp's split of it
            needed += [f"{p}self_attn.{n}.weight" for n in q + kv_b + (
                "kv_a_proj_with_mqa", "kv_a_layernorm", "o_proj")]
            needed += [f"{p}{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")]
            needed += [f"{p}mlp.{n}.weight" for n in (
                ("gate",) if cfg["sparse_layers"][i] else ("gate_proj", "up_proj", "down_proj"))]
        require_tensors(weights, needed)

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors of a DeepSeek V2/V3 checkpoint of this config (load_format="dummy")."""
        m = moe.moe_config(cfg)
        h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
        nh, dn, dr = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
        dv, r, qr = cfg["v_head_dim"], cfg["kv_lora_rank"], cfg.get("q_lora_rank")
        shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
        if not cfg.get("tie_word_embeddings"):
            shapes["lm_head.weight"] = (v, h)
        for i in range(cfg["num_hidden_layers"]):
            a = f"model.layers.{i}.self_attn."
            if qr:
                shapes.update({a + "q_a_proj.weight": (qr, h), a + "q_a_layernorm.weight": (qr,),
                               a + "q_b_proj.weight": (nh * (dn + dr), qr)})
            else:
                shapes[a + "q_proj.weight"] = (nh * (dn + dr), h)
            shapes.update({a + "kv_a_proj_with_mqa.weight": (r + dr, h),
                           a + "kv_a_layernorm.weight": (r,),
                           a + "kv_b_proj.weight": (nh * (dn + dv), r),
                           a + "o_proj.weight": (h, nh * dv)})
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] \
                = (h,)
            shapes[p + "mlp.gate_proj.weight"] = shapes[p + "mlp.up_proj.weight"] = (inter, h)
            shapes[p + "mlp.down_proj.weight"] = (h, inter)
        moe.moe_checkpoint_shapes(m, shapes)
        return shapes
