"""What the quantized-checkpoint tests share: the tiny random Llama each format quantizes, and
the quantization_config written into a saved checkpoint's config.json."""

from __future__ import annotations

import json
import os

from tests.models.test_llama_family_parity import SEED

VOCAB = 512


def tiny_llama(dtype, hidden: int = 128, intermediate: int = 192, head_dim: int = 32):
    """A 2-layer Llama (4 heads, 2 KV heads), weights times 4 so that its logits spread and
    quantization moves tokens, in dtype (a torch dtype)."""
    import torch
    import transformers as tf

    torch.manual_seed(SEED % 2**31)
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=head_dim, max_position_embeddings=512)
    model = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    # .to(dtype) rounds the rotary buffers (inv_freq) too, which from_pretrained and vllmx keep
    # in f32: an oracle of rounded frequencies was 4e-3 off in its logits (one fp8 seed's token
    # 0.0105 nats), so they go back to f32.
    rotary = {n: b for n, b in model.named_buffers() if n.endswith("inv_freq")}
    model = model.to(dtype)
    for name, buf in rotary.items():
        owner, attr = name.rsplit(".", 1)
        setattr(model.get_submodule(owner), attr, buf)
    return model


def set_quantization_config(path: str, quant: dict | None, **extra) -> None:
    """config.json's quantization_config set to quant (None: removed), extra keys merged in."""
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if quant is None:
        cfg.pop("quantization_config", None)
    else:
        cfg["quantization_config"] = {**quant, **extra}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


def assert_token_parity(path: str, oracle, what: str) -> None:
    """vllmx's greedy tokens for the checkpoint at path pass TESTING.md's f32 rule against the
    transformers model `oracle` (f32 arithmetic on the format's dequantized weights); an f32 KV
    cache, as the oracle keeps."""
    import numpy as np
    import torch

    from tests.models.parity import RouterTies, check_positions, log_softmax, position_deltas
    from tests.models.test_llama_family_parity import DELTA, random_prompts
    from vllmx import LLM, SamplingParams

    prompts = [[t % VOCAB for t in p] for p in random_prompts(np.random.default_rng(SEED))]
    llm = LLM(path, skip_tokenizer_init=True, kv_cache_dtype="float32")
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        with torch.no_grad(), RouterTies(oracle) as ties:  # (a MoE's near-ties)
            lp = log_softmax(oracle(torch.tensor([prompt + toks])).logits[0].double().numpy())
        deltas = position_deltas(ties, len(prompt) - 1, len(toks), DELTA)
        report = check_positions(lp[len(prompt) - 1:-1], toks, deltas)
        assert report.failed == 0, f"{what} (seed {SEED}): {report}"
