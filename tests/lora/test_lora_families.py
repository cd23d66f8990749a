"""LoRA beyond the Llama family: Gemma 3 (sandwich-normed layers, gelu-tanh MLP, sliding and
global layers), OLMo 2 (post-norms, q/k norms over whole projections), StableLM (partial
rotary, LayerNorm) and Cohere (parallel attention and MLP): a PEFT adapter on every projection
against transformers + peft (TESTING.md's token parity, f32, delta 0.01), and a batch mixing
it with the base model giving each request the tokens it gets alone."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.lora.adapters import check_against_peft, make_adapter
from tests.models.tiny_checkpoints import VOCAB

pytest.importorskip("torch")
pytest.importorskip("peft")

SEED = int.from_bytes(os.urandom(4), "little")


@pytest.mark.parametrize("family", ["gemma3", "olmo2", "exaone4", "stablelm", "cohere", "cohere2"])
def test_parity_with_peft_and_mixed_batch(tmp_path, family):
    from tests.models import test_gemma3_parity, tiny_checkpoints
    from vllmx import LLM, SamplingParams
    from vllmx.lora.request import LoRARequest

    base = (test_gemma3_parity.make_checkpoint("mixed", "float32", str(tmp_path))
            if family == "gemma3" else
            tiny_checkpoints.make_checkpoint(family, "float32", str(tmp_path)))
    path = make_adapter(base, str(tmp_path), "all", seed=0)
    lora = LoRARequest("all", 1, path)
    llm = LLM(base, skip_tokenizer_init=True, kv_cache_dtype="float32", enable_lora=True,
              max_lora_rank=16, enable_prefix_caching=False)
    rng = np.random.default_rng(SEED)
    ps = [rng.integers(3, VOCAB, size=k).tolist() for k in rng.integers(3, 40, size=6)]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    base_outs = llm.generate([{"prompt_token_ids": p} for p in ps], sp)
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], sp, lora_request=lora)
    check_against_peft(outs, [o.outputs[0].token_ids for o in base_outs], ps, base, path, 0.01,
                       f"{family} (seed {SEED})")
    mixed = llm.generate([{"prompt_token_ids": p} for p in ps], sp,
                         lora_request=[lora if i % 2 else None for i in range(len(ps))])
    want = [(outs if i % 2 else base_outs)[i].outputs[0].token_ids for i in range(len(ps))]
    assert [o.outputs[0].token_ids for o in mixed] == want
