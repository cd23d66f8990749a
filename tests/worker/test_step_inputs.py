"""The attention metadata a step hands the model: max_query_len is the step's longest query, as
vLLM's is (the GPU's attention plan picks its long prompts' prefill kernel by it), and 1 for a
decode-only step (whose prefill kernels are then skipped)."""

from __future__ import annotations

import pytest

from tests.models.tiny_checkpoints import make_checkpoint
from vllmx import ops

pytest.importorskip("torch")


def test_max_query_len_is_the_steps_longest_query(tmp_path, monkeypatch):
    from vllmx import LLM, SamplingParams

    seen = []  # (rows of the step, max_query_len) per attention call
    attend = ops.paged_attention

    def recording(q, *args):
        seen.append((q.shape[0], args[-2]))
        return attend(q, *args)

    monkeypatch.setattr(ops, "paged_attention", recording)
    llm = LLM(make_checkpoint("qwen3", "float32", str(tmp_path)), skip_tokenizer_init=True,
              max_num_batched_tokens=256, enforce_eager=True)
    lengths = [5, 13, 9]
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in lengths]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    prefill = [s for s in seen if s[0] == sum(lengths)]
    assert prefill and all(m == max(lengths) for _, m in prefill), seen
    decode = [s for s in seen if s[0] == len(lengths)]
    assert decode and all(m == 1 for _, m in decode), seen
