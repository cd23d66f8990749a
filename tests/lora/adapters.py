"""Tiny PEFT LoRA adapters over the tiny Llama checkpoint, made by `peft` itself."""

from __future__ import annotations

import os

# name -> PEFT LoraConfig arguments: every supported target, attention only with rsLoRA, and
# the MLP with o_proj at the largest rank the tests allow.
ADAPTERS = {
    "all": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"]},
    "qv": {"r": 4, "lora_alpha": 8, "use_rslora": True, "target_modules": ["q_proj", "v_proj"]},
    "mlp": {"r": 16, "lora_alpha": 8, "target_modules": ["o_proj", "gate_proj", "up_proj",
                                                         "down_proj"]},
}


def make_adapter(base_path: str, out_dir: str, name: str, seed: int = 0, **overrides) -> str:
    """A PEFT adapter with random A and B (init_lora_weights=False), so that it changes the
    tokens; B widened so that its effect is not lost among the base weights."""
    import peft
    import torch
    import transformers

    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    cfg = peft.LoraConfig(**{**ADAPTERS.get(name, {}), **overrides}, init_lora_weights=False)
    model = peft.get_peft_model(base, cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(4.0)
    path = os.path.join(out_dir, f"lora-{name}-{seed}")
    model.save_pretrained(path)
    return path


def peft_model(base_path: str, adapter_path: str):
    """transformers + peft with the adapter: the oracle."""
    import peft
    import torch
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    return peft.PeftModel.from_pretrained(base, adapter_path).eval()


def check_against_peft(outs, base_toks, prompts, base_path: str, adapter_path: str, delta: float,
                       what: str, oracle=None) -> None:
    """vllmx's greedy outputs through an adapter, position by position against transformers +
    peft (TESTING.md's token parity, delta; oracle: that model, if already made); the adapter
    must change some prompt's tokens (base_toks: the base model's)."""
    import torch

    from tests.models.parity import check_positions, log_softmax

    oracle = oracle or peft_model(base_path, adapter_path)
    changed = 0
    for p, out, b in zip(prompts, outs, base_toks):
        toks = out.outputs[0].token_ids
        changed += toks != b
        with torch.no_grad():
            logits = oracle(torch.tensor([p + toks])).logits[0].double().numpy()
        report = check_positions(log_softmax(logits)[len(p) - 1:-1], toks, delta)
        assert report.failed == 0, f"{what} (len {len(p)}): {report}"
    assert changed, f"{what}: the adapter changed no prompt's tokens: the test proves nothing"
