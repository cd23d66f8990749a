"""Each supported family's tiny transformers config (2 layers, hidden 64, a 512-token
vocabulary): the shapes and options the parity tests run, from which tiny_checkpoints.py writes
random checkpoints and GGUF files."""

from __future__ import annotations

VOCAB = 512


def family_configs(**sizes):
    """Each family's tiny config; sizes overrides the common sizes (the GPU tests' larger
    heads)."""
    import transformers as tf

    common = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 160,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2, **sizes}
    rot = common["hidden_size"] // common["num_attention_heads"] // 4  # longrope's factors
    mha = {k: v for k, v in common.items() if k != "num_key_value_heads"}  # GPT-NeoX's heads
    # The Qwen3-Next / Qwen3.5 hybrids: 8 experts top-2 beside a shared expert, and Gated
    # DeltaNet mixers of 2 key heads for 4 value heads (key and value head sizes given).
    hybrid_moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 48}

    def gated_deltanet(key_dim: int, value_dim: int) -> dict:
        return {"linear_num_value_heads": 4, "linear_num_key_heads": 2,
                "linear_key_head_dim": key_dim, "linear_value_head_dim": value_dim,
                "linear_conv_kernel_dim": 4, "pad_token_id": 0}

    # GPT-2's names for the common sizes; weights 4x wider than its default init, else its tiny
    # attention scores are so flat that the attention scale hardly moves the logits.
    gpt2 = {"vocab_size": common["vocab_size"], "n_embd": common["hidden_size"],
            "n_layer": common["num_hidden_layers"], "n_head": common["num_attention_heads"],
            "n_inner": common["intermediate_size"],
            "n_positions": common["max_position_embeddings"], "initializer_range": 0.08,
            "bos_token_id": 1, "eos_token_id": 2}
    # DeepSeek's attention sizes (kv_lora_rank, the rope and nope parts of a head) and MoE.
    mla = {**mha, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
           "v_head_dim": 24, "pad_token_id": 0}
    deepseek_moe = {"n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
                    "n_shared_experts": 1, "first_k_dense_replace": 1}
    expert_size = sizes.get("intermediate_size", 64)  # GraniteMoe's intermediate_size
    granite = {"embedding_multiplier": 3.0, "attention_multiplier": 0.05,
               "residual_multiplier": 0.4, "logits_scaling": 2.5}
    # Nemotron-H's sizes (its checkpoints name them otherwise)
    nemotron_h = {
        "vocab_size": VOCAB, "hidden_size": common["hidden_size"], "intermediate_size": 96,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 4,
        "mamba_head_dim": common["hidden_size"] // 2, "ssm_state_size": 16, "n_groups": 2,
        "conv_kernel": 4, "expand": 2, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 48, "n_group": 2,
        "topk_group": 1, "routed_scaling_factor": 1.5,
        "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"] * 2,
        "max_position_embeddings": 512, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    falcon = {"vocab_size": common["vocab_size"], "hidden_size": common["hidden_size"],
              "ffn_hidden_size": common["intermediate_size"],
              "num_hidden_layers": common["num_hidden_layers"],
              "num_attention_heads": common["num_attention_heads"],
              "max_position_embeddings": common["max_position_embeddings"],
              "bos_token_id": 1, "eos_token_id": 2}
    return {
        "llama": tf.LlamaConfig(**common),
        # Llama's gated-MLP options: biases on gate/up/down and an activation other than silu
        "llama_mlp_bias_gelu": tf.LlamaConfig(**common, mlp_bias=True, hidden_act="gelu"),
        "llama_gelu_tanh": tf.LlamaConfig(**common, hidden_act="gelu_pytorch_tanh"),
        "llama3": tf.LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}),
        "mistral": tf.MistralConfig(**common, sliding_window=24),
        "qwen2": tf.Qwen2Config(**common),
        "qwen3": tf.Qwen3Config(**{**common, "head_dim": 32}, tie_word_embeddings=True),
        "granite": tf.GraniteConfig(**common, **granite, tie_word_embeddings=True),
        "phi3": tf.Phi3Config(**common, sliding_window=24, pad_token_id=0),
        # Phi-3.5 / Phi-4-mini style: longrope (the short factors below 256 positions, the
        # attention factor from 1024 / 256) over half of each head.
        "phi3_longrope": tf.Phi3Config(**{**common, "max_position_embeddings": 1024},
                                       original_max_position_embeddings=256,
                                       partial_rotary_factor=0.5, pad_token_id=0,
                                       rope_parameters={
                                           "rope_type": "longrope", "rope_theta": 1e4,
                                           "short_factor": [1 + i / 2 for i in range(rot)],
                                           "long_factor": [2.0 ** (i + 1) for i in range(rot)]}),
        # head_dim 32 with GLM-4's default partial_rotary_factor 0.5; qkv bias by default.
        "glm4": tf.Glm4Config(**{**common, "head_dim": 32}, pad_token_id=0),
        # 3 layers, the middle one without rope; a window narrower than the longest prompt
        # on the NoPE layer only (the layer_types transformers derives).
        "olmo2": tf.Olmo2Config(**common, pad_token_id=0),
        # 4 layers, 3 sliding (window narrower than the longest prompt), the full one NoPE;
        # llama3 rope scaling as EXAONE 4 ships.
        "exaone4": tf.Exaone4Config(**{**common, "num_hidden_layers": 4}, sliding_window=24,
                                    sliding_window_pattern=4, rope_parameters={
                                        "rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64},
                                    pad_token_id=0),
        # What an exaone4 GGUF can say with windows: llama.cpp slides 3 of every 4 layers of a
        # 64-layer model only (EXAONE 4.0 32B's shape); the full layers NoPE.
        "exaone4_gguf": tf.Exaone4Config(**{**common, "num_hidden_layers": 64},
                                         sliding_window=24, sliding_window_pattern=4,
                                         rope_parameters={
                                             "rope_type": "llama3", "rope_theta": 1e6,
                                             "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64},
                                         pad_token_id=0),
        "olmo2_bias": tf.Olmo2Config(**common, attention_bias=True, pad_token_id=0),
        # 4 layers, sliding / full as transformers derives them (3 of 4 sliding), a window
        # narrower than the longest prompt, YaRN on the full layer only (as OLMo 3 ships).
        "olmo3": tf.Olmo3Config(**{**common, "num_hidden_layers": 4}, sliding_window=24,
                                rope_parameters={
                                    "full_attention": {"rope_type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 128,
                                                       "rope_theta": 5e5},
                                    "sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 5e5}},
                                pad_token_id=0),
        "smollm3": tf.SmolLM3Config(**{**common, "num_hidden_layers": 3},
                                    no_rope_layers=[1, 0, 1], use_sliding_window=True,
                                    sliding_window=24, tie_word_embeddings=True, pad_token_id=0),
        # What a smollm3 GGUF can say (llama.cpp: every 4th layer without rope, no window).
        "smollm3_gguf": tf.SmolLM3Config(**{**common, "num_hidden_layers": 4},
                                         tie_word_embeddings=True, pad_token_id=0),
        # 3 layers, the middle one dense (mlp_only_layers); 8 experts, top-2, renormalized.
        "qwen3_moe": tf.Qwen3MoeConfig(**{**common, "num_hidden_layers": 3, "head_dim": 32},
                                       num_experts=8, num_experts_per_tok=2,
                                       moe_intermediate_size=64, norm_topk_prob=True,
                                       mlp_only_layers=[1]),
        "mixtral": tf.MixtralConfig(**common, num_local_experts=8, num_experts_per_tok=2),
        # Granite's four multipliers over 3 sparse layers of 8 experts (top-2), intermediate_size
        # being the experts'; tied embeddings, as Granite 3.x MoE ships.
        "granite_moe": tf.GraniteMoeConfig(**{**common, "num_hidden_layers": 3,
                                              "intermediate_size": expert_size},
                                           num_local_experts=8, num_experts_per_tok=2,
                                           tie_word_embeddings=True, **granite),
        # 10 experts (top-3) and the shared SwiGLU MLP every token takes.
        "granite_moe_shared": tf.GraniteMoeSharedConfig(**{**common,
                                                           "intermediate_size": expert_size},
                                                        num_local_experts=10,
                                                        num_experts_per_tok=3,
                                                        shared_intermediate_size=96, **granite),
        # Parallel residual (the default), rope over a quarter of each head, as Pythia ships
        # (in the older config keys rotary_pct / rotary_emb_base).
        "gpt_neox": tf.GPTNeoXConfig(**mha, rotary_pct=0.25, rotary_emb_base=10000,
                                     pad_token_id=0),
        # Sequential residual, gelu_fast (GPT-NeoX-20B's), rope over half of each head.
        "gpt_neox_seq": tf.GPTNeoXConfig(**mha, use_parallel_residual=False,
                                         hidden_act="gelu_fast", rotary_pct=0.5, pad_token_id=0),
        # Per-head q/k LayerNorms and q/k/v biases (StableLM 2 12B's), rope over a quarter of
        # each head, sequential residual.
        "stablelm": tf.StableLmConfig(**common, qk_layernorm=True, use_qkv_bias=True,
                                      partial_rotary_factor=0.25, pad_token_id=0),
        # Parallel residual (one norm for attention and MLP), rope over half of each head.
        "stablelm_parallel": tf.StableLmConfig(**common, use_parallel_residual=True,
                                               partial_rotary_factor=0.5, pad_token_id=0),
        # A window narrower than the longest prompt; biases everywhere; tied embeddings.
        "starcoder2": tf.Starcoder2Config(**common, sliding_window=24, pad_token_id=0),
        # What a starcoder2 GGUF can say: llama.cpp applies no window.
        "starcoder2_gguf": tf.Starcoder2Config(**common, sliding_window=None, pad_token_id=0),
        "gpt2": tf.GPT2Config(**gpt2),
        # The attention scale divided by the layer number too.
        "gpt2_scaled": tf.GPT2Config(**gpt2, scale_attn_by_inverse_layer_idx=True),
        # Per-head q/k LayerNorms (Command R+'s), a logit scale (0.0625 as shipped would leave
        # a tiny model's logits nearly flat).
        "cohere": tf.CohereConfig(**common, use_qk_norm=True, logit_scale=0.5),
        "cohere_bias": tf.CohereConfig(**common, attention_bias=True, logit_scale=0.25),
        # What a command-r GGUF can say: llama.cpp reads q/k norms at 64 layers only (Command
        # R+'s), and no attention biases.
        "cohere_gguf": tf.CohereConfig(**common, logit_scale=0.5),
        # Sliding and full layers alternating (sliding_window_pattern 2, as transformers reads
        # it into layer_types), the full ones without rope; a window narrower than the longest
        # prompt.
        "cohere2": tf.Cohere2Config(**common, sliding_window=24, sliding_window_pattern=2,
                                    logit_scale=0.5),
        # What a cohere2 GGUF can say: llama.cpp makes every 4th layer full.
        "cohere2_gguf": tf.Cohere2Config(**{**common, "num_hidden_layers": 4}, sliding_window=24,
                                         logit_scale=0.5),
        # Falcon-40B's layout: new_decoder_architecture, 2 kv groups in query_key_value, two
        # norms (ln_attn, ln_mlp), no biases.
        "falcon": tf.FalconConfig(**falcon, new_decoder_architecture=True, num_kv_heads=2),
        # Falcon2-11B's: the new architecture with one norm (num_ln_in_parallel_attn 1), its
        # rope base.
        "falcon_one_norm": tf.FalconConfig(**falcon, new_decoder_architecture=True, num_kv_heads=2,
                                           num_ln_in_parallel_attn=1,
                                           rope_parameters={"rope_type": "default",
                                                            "rope_theta": 500042.0}),
        # Falcon-7B's: multi-query (one kv head), parallel attention; with biases.
        "falcon_mq": tf.FalconConfig(**falcon, multi_query=True, bias=True),
        # Neither: a kv head per q head, attention then MLP (parallel_attn False), biases.
        "falcon_seq": tf.FalconConfig(**falcon, multi_query=False, parallel_attn=False,
                                      bias=True, activation="gelu_pytorch_tanh"),
        # What a falcon GGUF can say: no biases (llama.cpp loads none), parallel attention.
        "falcon_mq_gguf": tf.FalconConfig(**falcon, multi_query=True),
        # What a qwen3moe GGUF can say: every layer sparse, top-k renormalized (llama.cpp).
        "qwen3_moe_gguf": tf.Qwen3MoeConfig(**{**common, "head_dim": 32}, num_experts=8,
                                            num_experts_per_tok=3, moe_intermediate_size=64,
                                            norm_topk_prob=True),
        # MLA (a query latent, v_head_dim != qk_nope_head_dim), 16 experts in 4 groups of
        # which the best 2 compete (noaux_tc: sigmoid scores and a random choice bias), top-4,
        # a shared expert, a dense first layer, routed_scaling_factor.
        "deepseek_v3": tf.DeepseekV3Config(**{**mla, "num_hidden_layers": 3},
                                           q_lora_rank=48, **deepseek_moe, n_group=4,
                                           topk_group=2, norm_topk_prob=True,
                                           routed_scaling_factor=2.5),
        # gpt-oss: sliding and full layers alternating (a window narrower than the longer
        # prompts), attention sinks, q/k/v/o biases, 8 experts top-2 with biases and the
        # clamped SwiGLU, its YaRN rope (factor 32, untruncated ramp).
        "gpt_oss": tf.GptOssConfig(**{**common, "num_hidden_layers": 3, "head_dim": 16,
                                      "intermediate_size": 64}, num_local_experts=8,
                                   num_experts_per_tok=2, sliding_window=24, pad_token_id=0),
        # Qwen3-Next: 3 Gated DeltaNet layers and a gated-attention one (twice), 2 key heads
        # for 4 value heads, dk != dv; 8 experts top-2 with a gated shared expert, one dense
        # layer (mlp_only_layers).
        "qwen3_next": tf.Qwen3NextConfig(
            **{**common, "num_hidden_layers": 8, "head_dim": 16}, **hybrid_moe,
            mlp_only_layers=[2], **gated_deltanet(16, 12)),
        # What a qwen3next GGUF holds: every layer sparse (llama.cpp has no dense MLP there),
        # value heads as wide as key heads (llama.cpp sizes both by ssm.state_size).
        "qwen3_next_gguf": tf.Qwen3NextConfig(
            **{**common, "num_hidden_layers": 8, "head_dim": 16}, **hybrid_moe,
            **gated_deltanet(16, 16)),
        # What a qwen35 / qwen35moe GGUF holds (value heads as wide as key heads, as for
        # qwen3next), heads of a whole Q8_0 block (the file's tiled value heads move in blocks).
        "qwen3_5_gguf": tf.Qwen3_5TextConfig(
            **{**common, "num_hidden_layers": 4, "head_dim": 16}, **gated_deltanet(32, 32)),
        "qwen3_5_moe_gguf": tf.Qwen3_5MoeTextConfig(
            **{**common, "num_hidden_layers": 4, "head_dim": 16}, **hybrid_moe,
            **gated_deltanet(32, 32)),
        # Qwen3.5: the same hybrid, its mixer's projections apart; dense and MoE.
        "qwen3_5": tf.Qwen3_5TextConfig(
            **{**common, "num_hidden_layers": 4, "head_dim": 16}, **gated_deltanet(16, 12)),
        "qwen3_5_moe": tf.Qwen3_5MoeTextConfig(
            **{**common, "num_hidden_layers": 4, "head_dim": 16}, **hybrid_moe,
            **gated_deltanet(16, 12)),
        # Granite-4: Mamba2 layers (4 heads of hidden / 2, state 16, 2 groups) around an attention one
        # without rope, GraniteMoe's experts beside the shared MLP, Granite's multipliers.
        "granite_moe_hybrid": tf.GraniteMoeHybridConfig(
            **{**common, "num_hidden_layers": 4, "intermediate_size": 32}, num_local_experts=8,
            num_experts_per_tok=2, shared_intermediate_size=48, mamba_n_heads=4,
            mamba_d_head=common["hidden_size"] // 2, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4,
            mamba_expand=2, layer_types=["mamba", "attention", "mamba", "mamba"],
            embedding_multiplier=3.0, attention_multiplier=0.05, residual_multiplier=0.4,
            logits_scaling=2.5, pad_token_id=0),
        # Granite-4's dense variant with rope: no experts, the shared MLP alone.
        "granite_hybrid_dense": tf.GraniteMoeHybridConfig(
            **{**common, "num_hidden_layers": 3, "intermediate_size": 32}, num_local_experts=0,
            shared_intermediate_size=96, mamba_n_heads=2, mamba_d_head=common["hidden_size"],
            mamba_d_state=16,
            mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
            layer_types=["mamba", "attention", "mamba"], position_embedding_type="rope",
            pad_token_id=0),
        # What a gpt-oss GGUF can say: llama.cpp's YaRN rounds the ramp's ends to whole
        # dimensions (transformers' truncate, which gpt-oss turns off).
        "gpt_oss_gguf": tf.GptOssConfig(**{**common, "num_hidden_layers": 3, "head_dim": 16,
                                           "intermediate_size": 64}, num_local_experts=8,
                                        num_experts_per_tok=2, sliding_window=24, pad_token_id=0,
                                        rope_parameters={
                                            "rope_type": "yarn", "rope_theta": 150000.0,
                                            "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                            "original_max_position_embeddings": 4096,
                                            "truncate": True}),
        # Qwen2-MoE: q/k/v biases, 8 experts top-2 (not renormalized), a gated shared expert,
        # every other layer sparse.
        "qwen2_moe": tf.Qwen2MoeConfig(**{**common, "num_hidden_layers": 4}, num_experts=8,
                                       num_experts_per_tok=2, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=48, decoder_sparse_step=2,
                                       pad_token_id=0),
        # Nemotron-H: one mixer a block (mamba, MoE, attention, MLP, twice), Mamba2 with 2
        # groups, attention without rope, relu^2 MLP and experts (8, top-2, sigmoid routing over
        # 2 groups with a random choice bias) beside a shared relu^2 expert.
        "nemotron_h": tf.NemotronHConfig(**nemotron_h),
        # What a Nemotron-H GGUF can hold (llama.cpp takes every block with a feed-forward
        # length for a MoE one in nemotron_h_moe and for an MLP in nemotron_h): MoE blocks and
        # no MLP ones, or the reverse.
        "nemotron_h_moe_gguf": tf.NemotronHConfig(**{**nemotron_h, "layers_block_type": [
            "linear_attention", "moe", "full_attention", "moe", "linear_attention", "moe"]}),
        "nemotron_h_dense": tf.NemotronHConfig(**{**nemotron_h, "layers_block_type": [
            "linear_attention", "mlp", "full_attention", "mlp", "linear_attention", "mlp"]}),
        # Falcon-H1: Mamba2 (2 groups, the gated norm before the gate) beside attention in
        # every layer, every muP multiplier away from 1.
        "falcon_h1": tf.FalconH1Config(
            **{**common, "num_hidden_layers": 3, "head_dim": 16}, mamba_n_heads=4,
            mamba_d_head=common["hidden_size"] // 2, mamba_d_ssm=2 * common["hidden_size"],
            mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_rms_norm=True,
            embedding_multiplier=2.0, lm_head_multiplier=0.5, attention_in_multiplier=0.7,
            attention_out_multiplier=1.3, key_multiplier=0.8, ssm_in_multiplier=1.2,
            ssm_out_multiplier=0.6, ssm_multipliers=[0.5, 1.5, 0.8, 1.25, 0.9],
            mlp_multipliers=[1.4, 0.7], pad_token_id=0),
        # ... with the gated norm after the gate (Mamba2's order; the one llama.cpp runs, and
        # what a falcon-h1 GGUF can hold: no key says where the norm is).
        "falcon_h1_gguf": tf.FalconH1Config(
            **{**common, "num_hidden_layers": 3, "head_dim": 16}, mamba_n_heads=4,
            mamba_d_head=common["hidden_size"] // 2, mamba_d_ssm=2 * common["hidden_size"],
            mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_rms_norm=True,
            mamba_norm_before_gate=False, embedding_multiplier=2.0, lm_head_multiplier=0.5,
            attention_in_multiplier=0.7, attention_out_multiplier=1.3, key_multiplier=0.8,
            ssm_in_multiplier=1.2, ssm_out_multiplier=0.6,
            ssm_multipliers=[0.5, 1.5, 0.8, 1.25, 0.9], mlp_multipliers=[1.4, 0.7],
            pad_token_id=0),
        # ... and without the mixer's norm (the output only gated by silu(z)).
        "falcon_h1_no_norm": tf.FalconH1Config(
            **{**common, "num_hidden_layers": 2, "head_dim": 16}, mamba_n_heads=2,
            mamba_d_head=common["hidden_size"], mamba_d_ssm=2 * common["hidden_size"],
            mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_rms_norm=False,
            pad_token_id=0),
        # V3's YaRN context extension: mscale != mscale_all_dim scales cos/sin by their
        # ratio, and the softmax by mscale_all_dim's square.
        "deepseek_v3_yarn": tf.DeepseekV3Config(
            **{**mla, "num_hidden_layers": 2}, q_lora_rank=48, **deepseek_moe, n_group=4,
            topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 128, "mscale": 1.0,
                             "mscale_all_dim": 0.5, "beta_fast": 32, "beta_slow": 1}),
        # V2-Lite's MLA (no query latent); softmax routing over the best 2 of 4 groups
        # (group_limited_greedy), not renormalized, scaled.
        "deepseek_v2": tf.DeepseekV2Config(**{**mla, "num_hidden_layers": 3}, q_lora_rank=None,
                                           **deepseek_moe, n_group=4, topk_group=2,
                                           topk_method="group_limited_greedy",
                                           norm_topk_prob=False, routed_scaling_factor=2.0),
        # V2-Lite's routing as it ships: softmax over all experts (greedy, one group), not
        # renormalized, unscaled; what a deepseek2 GGUF and transformers agree on for V2.
        "deepseek_v2_lite": tf.DeepseekV2Config(**{**mla, "num_hidden_layers": 3},
                                                q_lora_rank=None, **deepseek_moe, n_group=1,
                                                topk_group=1, topk_method="greedy",
                                                norm_topk_prob=False, routed_scaling_factor=1.0),
        # GLM-4.5: GQA with q/k/v biases and q/k norms, neox rope over half of each head,
        # DeepSeek V3's routing in one group (a choice bias), a shared expert.
        "glm4_moe": tf.Glm4MoeConfig(**{**common, "num_hidden_layers": 3, "head_dim": 32},
                                     **deepseek_moe, n_group=1, topk_group=1,
                                     norm_topk_prob=True, routed_scaling_factor=2.5,
                                     attention_bias=True, use_qk_norm=True, pad_token_id=0),
    }
