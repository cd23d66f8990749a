"""The Llama family: Llama 2/3 (llama3 rope scaling), SmolLM2, Mistral, Qwen2 (qkv bias), Qwen3
(q/k norm), Granite (four multipliers), SmolLM3 (layers without rope), Phi-3 (fused qkv and
gate_up tensors, split at load), from safetensors or GGUF, and GLM-4 (norms on the attention and
MLP outputs too, fused gate_up, partial GPT-J rope). The differences are flags read from
the checkpoint: a bias tensor present, q/k norm weights present, tied embeddings when there is
no lm_head, and Granite's embedding, attention, residual and logits multipliers from its
config. Qwen3-MoE, Mixtral and GLM-4.5 (Glm4MoeForCausalLM: partial neox rope, q/k/v biases,
optional q/k norm) are the same decoder with a mixture-of-experts MLP in their sparse layers
(models/moe.py); GraniteMoe and GraniteMoeShared are Granite with one in every layer
(models/granitemoe.py); gpt-oss adds attention sinks and biased, clamped-SwiGLU experts
(models/gpt_oss.py)."""

from __future__ import annotations

from vllmx import ops
from vllmx.device import F32
from vllmx.distributed.parallel_state import get_pp_stage, get_tp_group
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.fused_moe import SparseMoeBlock
from vllmx.layers.linear import MergedLinear, ParallelLMHead, RowParallelLinear
from vllmx.layers.norm import RMSNorm
from vllmx.layers.rotary import RotaryEmbedding
from vllmx.models import gpt_oss, granitemoe, moe
from vllmx.models.decoder import DecoderLM
from vllmx.models.shapes import decoder_shapes, require_tensors
from vllmx.ops import Weight

# GGUF tensor names → HF names (per layer names use {i}).
GGUF_TO_HF = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_qkv": "model.layers.{i}.self_attn.qkv_proj",  # Phi-3's fused q/k/v
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
    "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm",
    "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
    # MoE (qwen3moe; Mixtral as llama): the router and the experts stacked [E, rows, cols].
    "blk.{i}.ffn_gate_inp": "model.layers.{i}.mlp.gate",
    "blk.{i}.ffn_gate_exps": "model.layers.{i}.mlp.experts.gate_proj",
    "blk.{i}.ffn_up_exps": "model.layers.{i}.mlp.experts.up_proj",
    "blk.{i}.ffn_down_exps": "model.layers.{i}.mlp.experts.down_proj",
}
# What one architecture's GGUF names besides (or other than) the table's.
GGUF_ARCH_TO_HF = {
    "olmo2": {"blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
              "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm"},
    "exaone4": {"blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
                "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm"},
    "phi3": {"blk.{i}.ffn_up": "model.layers.{i}.mlp.gate_up_proj"},  # [gate; up]
    "glm4": {"blk.{i}.post_attention_norm": "model.layers.{i}.post_self_attn_layernorm",
             "blk.{i}.post_ffw_norm": "model.layers.{i}.post_mlp_layernorm",
             "blk.{i}.ffn_up": "model.layers.{i}.mlp.gate_up_proj"},
    # The LayerNorm families (models/gpt_neox.py ... commandr.py); command-r and cohere2 need none.
    "gptneox": {"token_embd": "gpt_neox.embed_in", "output_norm": "gpt_neox.final_layer_norm",
                "output": "embed_out",
                "blk.{i}.attn_norm": "gpt_neox.layers.{i}.input_layernorm",
                "blk.{i}.attn_qkv": "gpt_neox.layers.{i}.attention.query_key_value",
                "blk.{i}.attn_output": "gpt_neox.layers.{i}.attention.dense",
                "blk.{i}.ffn_norm": "gpt_neox.layers.{i}.post_attention_layernorm",
                "blk.{i}.ffn_up": "gpt_neox.layers.{i}.mlp.dense_h_to_4h",
                "blk.{i}.ffn_down": "gpt_neox.layers.{i}.mlp.dense_4h_to_h"},
    # gpt-oss and GLM-4.5: the norm before the MLP is llama.cpp's post_attention_norm; gpt-oss's
    # sinks; GLM-4.5's choice bias (exp_probs_b.bias) and shared experts (mlp.shared_experts).
    "gpt-oss": {"blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
                "blk.{i}.attn_sinks": "model.layers.{i}.self_attn.sinks"},
    "glm4moe": {"blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
                "blk.{i}.exp_probs_b": "model.layers.{i}.mlp.gate.e_score_correction",
                "blk.{i}.ffn_gate_shexp": "model.layers.{i}.mlp.shared_experts.gate_proj",
                "blk.{i}.ffn_up_shexp": "model.layers.{i}.mlp.shared_experts.up_proj",
                "blk.{i}.ffn_down_shexp": "model.layers.{i}.mlp.shared_experts.down_proj"},
    # GraniteMoeShared's shared MLP (HF: shared_mlp.input_linear = [gate; up], output_linear)
    "granitemoe": {"blk.{i}.ffn_gate_shexp": "model.layers.{i}.shared_mlp.gate_proj",
                   "blk.{i}.ffn_up_shexp": "model.layers.{i}.shared_mlp.up_proj",
                   "blk.{i}.ffn_down_shexp": "model.layers.{i}.shared_mlp.down_proj"},
    # q/k norms stacked [heads, head_dim] (HF: one tensor a head, norms.{h})
    "stablelm": {"blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_layernorm",
                 "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_layernorm"},
    "starcoder2": {"blk.{i}.ffn_up": "model.layers.{i}.mlp.c_fc",
                   "blk.{i}.ffn_down": "model.layers.{i}.mlp.c_proj"},
    # attn_norm is ln_mlp where a file has attn_norm_2 (ln_attn); models/falcon.py renames it
    "falcon": {"token_embd": "transformer.word_embeddings", "output_norm": "transformer.ln_f",
               "output": "lm_head", "blk.{i}.attn_norm": "transformer.h.{i}.input_layernorm",
               "blk.{i}.attn_norm_2": "transformer.h.{i}.ln_attn",
               "blk.{i}.attn_qkv": "transformer.h.{i}.self_attention.query_key_value",
               "blk.{i}.attn_output": "transformer.h.{i}.self_attention.dense",
               "blk.{i}.ffn_up": "transformer.h.{i}.mlp.dense_h_to_4h",
               "blk.{i}.ffn_down": "transformer.h.{i}.mlp.dense_4h_to_h"},
    # DeepSeek V2/V3 (models/deepseek_v2.py). attn_k_b / attn_v_b are llama.cpp's split of
    # kv_b_proj (no HF name): W_UK transposed [heads, kv_lora_rank, qk_nope_head_dim] and W_UV
    # [heads, v_head_dim, kv_lora_rank]. exp_probs_b.bias is the router's choice bias.
    "deepseek2": {"blk.{i}.attn_q_a": "model.layers.{i}.self_attn.q_a_proj",
                  "blk.{i}.attn_q_a_norm": "model.layers.{i}.self_attn.q_a_layernorm",
                  "blk.{i}.attn_q_b": "model.layers.{i}.self_attn.q_b_proj",
                  "blk.{i}.attn_kv_a_mqa": "model.layers.{i}.self_attn.kv_a_proj_with_mqa",
                  "blk.{i}.attn_kv_a_norm": "model.layers.{i}.self_attn.kv_a_layernorm",
                  "blk.{i}.attn_kv_b": "model.layers.{i}.self_attn.kv_b_proj",
                  "blk.{i}.attn_k_b": "model.layers.{i}.self_attn.k_b_proj",
                  "blk.{i}.attn_v_b": "model.layers.{i}.self_attn.v_b_proj",
                  "blk.{i}.exp_probs_b.bias": "model.layers.{i}.mlp.gate.e_score_correction_bias",
                  "blk.{i}.ffn_gate_shexp": "model.layers.{i}.mlp.shared_experts.gate_proj",
                  "blk.{i}.ffn_up_shexp": "model.layers.{i}.mlp.shared_experts.up_proj",
                  "blk.{i}.ffn_down_shexp": "model.layers.{i}.mlp.shared_experts.down_proj"},
    "gpt2": {"token_embd": "transformer.wte", "position_embd": "transformer.wpe",
             "output_norm": "transformer.ln_f", "output": "lm_head",
             "blk.{i}.attn_norm": "transformer.h.{i}.ln_1",
             "blk.{i}.attn_qkv": "transformer.h.{i}.attn.c_attn",
             "blk.{i}.attn_output": "transformer.h.{i}.attn.c_proj",
             "blk.{i}.ffn_norm": "transformer.h.{i}.ln_2",
             "blk.{i}.ffn_up": "transformer.h.{i}.mlp.c_fc",
             "blk.{i}.ffn_down": "transformer.h.{i}.mlp.c_proj"},
}


def gguf_name_to_hf(name: str, arch: str | None = None) -> str:
    """The HF name of a GGUF tensor; the tables name a tensor without its suffix (.weight,
    .bias), or whole where the HF name has none (exp_probs_b.bias); unknown names stay."""
    parts = name.split(".")
    key, i = (("blk.{i}." + ".".join(parts[2:]), parts[1]) if parts[0] == "blk"
              else (name, ""))
    table = GGUF_ARCH_TO_HF.get(arch, {})
    hf = table.get(key) or GGUF_TO_HF.get(key)
    if hf is not None:
        return hf.format(i=i)
    base, _, suffix = key.rpartition(".")
    hf = table.get(base) or GGUF_TO_HF.get(base)
    return name if hf is None else hf.format(i=i) + "." + suffix


def rope_config(cfg: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope scaling or None) of a Hugging Face config (rope_scaling, or
    transformers' newer rope_parameters; Phi-3 keeps its original context apart)."""
    rope_scaling = cfg.get("rope_scaling") or (cfg.get("rope_parameters") or None)
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
        rope_scaling = None
    if rope_scaling and cfg.get("original_max_position_embeddings"):
        rope_scaling = {"original_max_position_embeddings":
                        cfg["original_max_position_embeddings"], **rope_scaling}
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 1e4)
    return float(theta), rope_scaling


class LlamaDecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope: RotaryEmbedding,
                 sliding_window: int, experts: SparseMoeBlock | None = None):
        p = f"model.layers.{i}."
        eps = cfg["rms_norm_eps"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]

        qkv = [p + f"self_attn.{n}_proj" for n in "qkv"]
        self.qkv_proj = MergedLinear([w[n + ".weight"] for n in qkv],
                                     [w.get(n + ".bias") for n in qkv])
        self.o_proj = RowParallelLinear(w[p + "self_attn.o_proj.weight"],
                                        w.get(p + "self_attn.o_proj.bias"))
        self.q_norm = self.k_norm = None
        if p + "self_attn.q_norm.weight" in w:  # Qwen3
            self.q_norm = RMSNorm(w[p + "self_attn.q_norm.weight"], eps)
            self.k_norm = RMSNorm(w[p + "self_attn.k_norm.weight"], eps)
        self.rope = rope
        self.attn = Attention(i, self.num_heads, self.num_kv_heads, self.head_dim,
                              cfg["attn_scale"], sliding_window)
        self.residual_multiplier = cfg["residual_multiplier"]
        self.experts = experts  # a sparse layer's MLP; else the dense SwiGLU below
        if experts is None:  # (biases: Llama's mlp_bias)
            self.gate_up_proj = MergedLinear(
                [w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]],
                [w.get(p + "mlp.gate_proj.bias"), w.get(p + "mlp.up_proj.bias")])
            self.down_proj = RowParallelLinear(w[p + "mlp.down_proj.weight"],
                                               w.get(p + "mlp.down_proj.bias"))
            self.act = mlp_act(cfg.get("hidden_act"))
        # (None: EAGLE-1's first draft layer, which takes its input un-normed; a target's layers
        # all have one: LlamaForCausalLM checks)
        self.input_layernorm = (RMSNorm(w[p + "input_layernorm.weight"], eps)
                                if p + "input_layernorm.weight" in w else None)
        self.post_attention_layernorm = RMSNorm(w[p + "post_attention_layernorm.weight"], eps)
        # GLM-4's sandwich norms: each branch output normed before the residual add.
        self.post_self_attn_layernorm = self.post_mlp_layernorm = None
        if p + "post_self_attn_layernorm.weight" in w:
            self.post_self_attn_layernorm = RMSNorm(w[p + "post_self_attn_layernorm.weight"], eps)
            self.post_mlp_layernorm = RMSNorm(w[p + "post_mlp_layernorm.weight"], eps)

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        # Each norm runs with the projection after it (one GEMV on the GPU at decode).
        qkv, residual = self.qkv_proj.norm_proj(h, residual, self.input_layernorm)
        return self.forward_qkv(positions, qkv, residual, md)

    def forward_qkv(self, positions, qkv, residual, md: AttentionMetadata):
        """The layer from its q/k/v projection on (EAGLE's first draft layers form that input
        their own way: models/llama_eagle*.py)."""
        h = self.o_proj(self.attn.forward_qkv(qkv, positions, self.rope, self.q_norm,
                                              self.k_norm, md))
        if self.residual_multiplier != 1.0:  # Granite: residual + branch * multiplier
            ops.scale_(h, self.residual_multiplier)
        if self.post_self_attn_layernorm is not None:  # the add happens in the next norm
            h = self.post_self_attn_layernorm(h)
        if self.experts is not None:
            h, residual = self.post_attention_layernorm(h, residual)
            h = self.experts(h)
        else:
            h, residual = self.gate_up_proj.norm_proj(h, residual, self.post_attention_layernorm,
                                                      act=self.act)
            h = self.down_proj(h)
        if self.residual_multiplier != 1.0:
            ops.scale_(h, self.residual_multiplier)
        if self.post_mlp_layernorm is not None:
            h = self.post_mlp_layernorm(h)
        return h, residual


# transformers' hidden_act for the gated MLP -> the act_and_mul op's activation.
_MLP_ACTS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
             "gelu_new": "gelu_tanh"}


def mlp_act(hidden_act: str | None) -> str:
    """The gated MLP's activation from config.json's hidden_act (None: silu), or a ValueError
    naming one that is not run (it would otherwise be silently run as silu)."""
    act = _MLP_ACTS.get(hidden_act or "silu")
    if act is None:
        raise ValueError(f"hidden_act {hidden_act!r} is not supported for this architecture "
                         f"(supported: {', '.join(_MLP_ACTS)})")
    return act


def split_rows(w: Weight, sizes: list[int]) -> list[Weight]:
    """Row blocks of a fused weight, as views of its data (no copy)."""
    out, start = [], 0
    for n in sizes:
        out.append(Weight(w.data[start:start + n], w.dtype, (n, w.shape[1])))
        start += n
    return out


# Phi-3 stores q/k/v as one qkv_proj and gate/up as one gate_up_proj (GLM-4 gate/up only).
_PHI3_FUSED = (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
               ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")))


def unfuse_phi3(weights: dict[str, Weight], cfg: dict) -> dict[str, Weight]:
    """The Llama names for Phi-3's and GLM-4's fused tensors (views into them)."""
    hd, nq, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    sizes = {"self_attn.qkv_proj": [nq * hd, nkv * hd, nkv * hd],
             "mlp.gate_up_proj": [cfg["intermediate_size"]] * 2}
    out = dict(weights)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for fused, parts in _PHI3_FUSED:
            w = out.pop(p + fused + ".weight", None)
            if w is not None:
                out.update({p + n + ".weight": v
                            for n, v in zip(parts, split_rows(w, sizes[fused]))})
    return out


# llama.cpp's archs whose GGUF Q/K rows are Meta's interleaved pairs, permuted from Hugging
# Face's rotate-half rows by its converter (LlamaModel): a PEFT adapter's q/k B rows need the
# same permutation on them (lora/model_manager.py).
GGUF_PERMUTED_QK = ("llama", "mistral", "granite", "granitemoe", "smollm3")
# llama.cpp's archs whose rope rotates interleaved pairs (GPT-J style): those, and GLM-4's own.
_GGUF_GPTJ_ROPE = (*GGUF_PERMUTED_QK, "glm4")


class LlamaForCausalLM(DecoderLM):
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        gguf_arch = cfg.get("gguf_architecture")
        is_gguf = gguf_arch is not None
        if is_gguf:
            fused = [k for k in weights if ".ffn_gate_up_exps." in k]
            if fused:  # the llama.cpp vllmx is checked against reads them for none of these
                raise ValueError(f"GGUF tensor {fused[0]!r}: gate and up experts fused in one "
                                 f"tensor (convert_hf_to_gguf.py --fuse-gate-up-exps) are not "
                                 f"supported; convert without that flag")
            weights = {gguf_name_to_hf(k, gguf_arch): v for k, v in weights.items()}
        cfg.setdefault("head_dim", None)
        if not cfg["head_dim"]:
            cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
        cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        cfg.setdefault("rms_norm_eps", 1e-6)
        archs = cfg.get("architectures") or []
        phi3 = "Phi3ForCausalLM" in archs or gguf_arch == "phi3"
        granite_moe = granitemoe.is_granite_moe(cfg)
        granite = "GraniteForCausalLM" in archs or gguf_arch == "granite" or granite_moe
        smollm3 = "SmolLM3ForCausalLM" in archs or gguf_arch == "smollm3"
        glm4 = "Glm4ForCausalLM" in archs or gguf_arch == "glm4"
        if glm4:
            weights = unfuse_phi3(weights, cfg)
        if phi3:
            weights = unfuse_phi3(weights, cfg)
            if "rope_factors_long.weight" in weights:
                raise ValueError("Phi-3 GGUF with rope_factors_long (longrope scaling) is not "
                                 "supported yet")
        sparse = [False] * cfg["num_hidden_layers"]
        sparse_block = moe.sparse_block
        oss = gpt_oss.is_gpt_oss(cfg)
        if oss:
            cfg = gpt_oss.gpt_oss_config(cfg)
            sparse, sparse_block = cfg["sparse_layers"], gpt_oss.sparse_block
            weights = moe.RenamedWeights(weights, gpt_oss.gpt_oss_name)
        elif granite_moe:
            cfg = granitemoe.granite_moe_config(cfg)
            sparse, sparse_block = cfg["sparse_layers"], granitemoe.sparse_block
            if not is_gguf:
                weights = moe.RenamedWeights(weights, granitemoe.granite_moe_name)
        elif moe.is_moe(cfg):
            cfg = moe.moe_config(cfg)
            sparse = cfg["sparse_layers"]
            if "MixtralForCausalLM" in archs:
                weights = moe.RenamedWeights(weights, moe.mixtral_name)
        window = cfg.get("sliding_window")
        use_window = ("MistralForCausalLM" in archs or phi3 or "MixtralForCausalLM" in archs
                      or cfg.get("use_sliding_window") or gguf_arch == "mistral")
        cfg["attn_sliding_window"] = int(window) if (window and use_window) else 0
        # Granite's multipliers; the others' neutral values.
        cfg["attn_scale"] = (float(cfg.get("attention_multiplier") or cfg["head_dim"] ** -0.5)
                             if granite else cfg["head_dim"] ** -0.5)
        cfg["residual_multiplier"] = float(cfg.get("residual_multiplier") or 1.0) if granite else 1.0
        self.embedding_multiplier = (float(cfg.get("embedding_multiplier") or 1.0) if granite
                                     else 1.0)
        self.logits_scaling = float(cfg.get("logits_scaling") or 1.0) if granite else 1.0
        self.config = cfg
        self._check_weights(weights, sparse)

        head_dim = cfg["head_dim"]
        partial = (cfg.get("partial_rotary_factor")
                   or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0)
        rotary_dim = int(head_dim * partial)
        is_neox = gguf_arch not in _GGUF_GPTJ_ROPE and not glm4
        freq_factors = weights.get("rope_freqs.weight")
        theta, rope_scaling = rope_config(cfg)
        self.rope = RotaryEmbedding(
            head_dim, rotary_dim, int(cfg.get("max_position_embeddings") or 2048), theta,
            is_neox, rope_scaling,
            None if freq_factors is None else freq_factors.to_float32().reshape(-1),
            num_positions=cfg.get("max_model_len"))
        # Pipeline parallelism: this stage's layers (the others None, their tensors never
        # read); the first stage embeds and holds lm_head (rank 0 computes the logits).
        self.pp_stage = pp = get_pp_stage()
        first = pp is None or pp.is_first
        start, end = (0, cfg["num_hidden_layers"]) if pp is None else pp.layers(
            cfg["num_hidden_layers"])
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight") if first else None
        # SmolLM3's no_rope_layers: 1 where a layer uses rope, 0 where it has none (NoPE); a
        # GGUF has no key for them (llama.cpp: every 4th layer).
        use_rope = cfg.get("no_rope_layers") if smollm3 else None
        if smollm3 and use_rope is None:
            every = int(cfg.get("no_rope_layer_interval") or 4)
            use_rope = [int((i + 1) % every != 0) for i in range(cfg["num_hidden_layers"])]
        nope = self.rope.identity() if use_rope and not all(use_rope) else None
        # Which layers slide: config.json's layer_types where it has them (Qwen2's
        # max_window_layers, SmolLM3's NoPE layers), else every layer when a window applies.
        types = cfg.get("layer_types")
        self.layers = [
            LlamaDecoderLayer(i, cfg, weights, self.rope if use_rope is None or use_rope[i]
                              else nope,
                              cfg["attn_sliding_window"] if types is None
                              or types[i] == "sliding_attention" else 0,
                              sparse_block(cfg, weights, i) if sparse[i] else None)
            if start <= i < end else None for i in range(cfg["num_hidden_layers"])]
        if oss:
            for i, layer in enumerate(self.layers):
                layer.attn.sinks = placement.upload_vector(gpt_oss.attention_sinks(weights, i),
                                                           F32)  # (where attention runs)
        self.norm = RMSNorm(weights["model.norm.weight"], cfg["rms_norm_eps"])
        self.lm_head = ParallelLMHead(weights.get("lm_head.weight", self.embed_tokens),
                                      cfg.get("vocab_size")) if first else None
        self.vocab_size = self.lm_head.vocab_size if first else int(cfg["vocab_size"])
        self.tp_group = get_tp_group()
        if self.lm_head is not None:  # (embed_tokens holds the same rows)
            self.vocab_start = self.lm_head.vocab_start

    def mtp_block(self, weights: dict[str, Weight], i: int) -> LlamaDecoderLayer:
        """Decoder layer i >= num_hidden_layers: GLM-4.5's multi-token-prediction layer
        (models/mtp.py), sparse by the MoE rule extended to its index, full attention."""
        cfg = moe.moe_config({**self.config, "num_hidden_layers": i + 1})
        experts = moe.sparse_block(cfg, weights, i) if cfg["sparse_layers"][i] else None
        return LlamaDecoderLayer(i, cfg, weights, self.rope, 0, experts)

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy"):
        q/k/v biases for Qwen2 (and attention_bias), q/k norms for Qwen3 and Qwen3-MoE, Phi-3's
        and GLM-4's fused tensors, GLM-4's sandwich norms (and no o_proj bias), routers and
        experts in MoE layers (GraniteMoe's stacked, with its shared MLP)."""
        archs = cfg.get("architectures") or []
        glm4 = "Glm4ForCausalLM" in archs
        glm4_moe = "Glm4MoeForCausalLM" in archs  # biases on q/k/v only, q/k norm optional
        norms = ("input_layernorm", "post_attention_layernorm")
        shapes = decoder_shapes(
            cfg, norms + (("post_self_attn_layernorm", "post_mlp_layernorm") if glm4 else ()),
            qk_norm=("Qwen3ForCausalLM" in archs or "Qwen3MoeForCausalLM" in archs
                     or (glm4_moe and bool(cfg.get("use_qk_norm")))),
            qkv_bias=("Qwen2ForCausalLM" in archs or bool(cfg.get("attention_bias"))
                      or ("Qwen2MoeForCausalLM" in archs and cfg.get("qkv_bias", True))),
            o_bias=bool(cfg.get("attention_bias")) and not (glm4 or glm4_moe),
            tied=bool(cfg.get("tie_word_embeddings")))
        if "Phi3ForCausalLM" in archs or glm4:
            for i in range(cfg["num_hidden_layers"]):
                p = f"model.layers.{i}."
                for fused, parts in _PHI3_FUSED[1 if glm4 else 0:]:
                    rows = [shapes.pop(f"{p}{n}.weight") for n in parts]
                    shapes[f"{p}{fused}.weight"] = (sum(r[0] for r in rows), rows[0][1])
        if gpt_oss.is_gpt_oss(cfg):
            gpt_oss.gpt_oss_checkpoint_shapes(cfg, shapes)
        elif granitemoe.is_granite_moe(cfg):
            granitemoe.granite_moe_checkpoint_shapes(cfg, shapes)
        elif moe.is_moe(cfg):
            moe.moe_checkpoint_shapes(cfg, shapes)
        return shapes

    def _check_weights(self, weights: dict[str, Weight], sparse: list[bool]) -> None:
        needed = ["model.embed_tokens.weight", "model.norm.weight"]
        for i in range(self.config["num_hidden_layers"]):
            needed += [f"model.layers.{i}.{n}.weight" for n in (
                "input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")]
            needed += [f"model.layers.{i}.{n}.weight" for n in (
                ("mlp.gate",) if sparse[i] else ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))]
        require_tensors(weights, needed)
