"""The dense families beyond Llama and Qwen3 on the GPU: token parity against transformers on the
same GPU (bf16: delta 0.5 nats; f32: delta 0.01) for the tiny checkpoints of
tests/models/tiny_checkpoints.py at head_dim 64 (the tensor-core attention path), prompts longer
than their sliding windows."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.models.parity import check_positions, log_softmax
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILIES = ["granite", "smollm3", "phi3", "olmo2", "olmo3"]
SIZES = {"hidden_size": 256, "intermediate_size": 512, "max_position_embeddings": 1024}
SEED = int.from_bytes(os.urandom(4), "little")  # fresh prompts each run, printed on failure


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gpu-families"))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype,delta", [("bfloat16", 0.5), ("float32", 0.01)])
def test_token_parity_vs_transformers_on_gpu(ckpt_dir, family, dtype, delta):
    from vllmx import LLM, SamplingParams

    path = make_checkpoint(family, "bfloat16", ckpt_dir, **SIZES)
    rng = np.random.default_rng(SEED)
    lens = rng.integers(3, 200, size=8)
    lens[0] = 300  # several KV blocks, past every window
    prompts = [rng.integers(3, VOCAB, size=int(n)).tolist() for n in lens]
    llm = LLM(path, skip_tokenizer_init=True, device="cuda", max_model_len=1024, dtype=dtype,
              kv_cache_memory_bytes=256 << 20)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    oracle = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), attn_implementation="sdpa").cuda().eval()
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        assert len(toks) == 32
        with torch.no_grad():
            logits = oracle(torch.tensor([prompt + toks], device="cuda")).logits[0]
        lp = log_softmax(logits.double().cpu().numpy())
        report = check_positions(lp[len(prompt) - 1:-1], toks, delta)
        assert report.failed == 0, f"{family} {dtype} (seed {SEED}, len {len(prompt)}): {report}"
