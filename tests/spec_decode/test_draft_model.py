"""draft_model speculation (vLLM's method): a smaller model with the target's vocabulary drafts
greedily, the target verifies. Outputs are exactly those without speculation whatever the draft
(the target itself: every draft accepted; another model: some), batched == alone through
chunked prefill (the draft's catch-up chunked too) and preemption, seeded sampling, aborts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint
from tests.spec_decode.harness import run
from tests.spec_decode.test_ngram import prompts, seeded_greedy_penalized

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("draft"))
    return {f: make_checkpoint(f, "float32", root) for f in ("qwen3", "llama")}


def spec_cfg(model: str, k: int = 4) -> dict:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k}


@pytest.mark.parametrize("draft", ["qwen3", "llama"])
def test_greedy_output_is_unchanged(ckpts, draft):
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    ps = prompts(rng, 8)
    sps = [SamplingParams(temperature=0, max_tokens=int(rng.integers(1, 40)), ignore_eos=True)
           for _ in ps]
    want, _ = run(ckpts["qwen3"], ps, sps)
    got, stats = run(ckpts["qwen3"], ps, sps, spec_cfg(ckpts[draft]))
    assert got == want
    assert stats.spec_decode_num_drafts > 0
    rate = stats.spec_decode_num_accepted_tokens / stats.spec_decode_num_draft_tokens
    if draft == "qwen3":  # the target drafting for itself: its greedy drafts are its tokens
        assert rate == 1.0
    else:
        assert rate < 1.0


def test_self_drafts_accepted_through_a_chunked_catch_up(ckpts):
    """The target drafting for itself with a token budget below the prompts' lengths: the
    draft's catch-up runs in several launched steps and its k - 1 decode steps follow them
    back to back, each taking its input id where the step before sampled it; any draft fed
    the wrong token would be rejected, and every one is accepted."""
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    ps = [{"prompt_token_ids": rng.integers(3, VOCAB, int(rng.integers(20, 40))).tolist()}
          for _ in range(10)]  # (each longer than the budget: its first catch-up in chunks)
    sps = [SamplingParams(temperature=0, max_tokens=int(rng.integers(8, 40)), ignore_eos=True)
           for _ in ps]
    kw = dict(max_num_seqs=6, max_num_batched_tokens=16, block_size=16, max_model_len=192)
    want, _ = run(ckpts["qwen3"], ps, sps, **kw)
    got, stats = run(ckpts["qwen3"], ps, sps, spec_cfg(ckpts["qwen3"], 3), **kw)
    assert got == want
    assert 0 < stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens


def test_batched_equal_alone_through_chunks_and_preemption(ckpts):
    """Greedy and seeded requests (drafted) and penalized ones (not), chunked prefill with a
    small budget (the draft's catch-up chunked too) and a target cache too small for all."""

    rng = np.random.default_rng()
    kw = dict(max_num_seqs=6, max_num_batched_tokens=40, num_gpu_blocks_override=12,
              block_size=16, max_model_len=192)
    ps = prompts(rng, 12)
    sps = seeded_greedy_penalized(rng, len(ps), 50)
    batched, stats = run(ckpts["qwen3"], ps, sps, spec_cfg(ckpts["qwen3"], 3), **kw)
    assert stats.num_preemptions > 0, "the cache was meant to be too small"
    assert stats.spec_decode_num_accepted_tokens > 0
    alone = [run(ckpts["qwen3"], [p], [sp], **kw)[0][0] for p, sp in zip(ps, sps)]
    assert batched == alone


def test_draft_config_errors(ckpts, tmp_path):
    from vllmx import LLM
    from vllmx.config import SpeculativeConfig

    with pytest.raises(ValueError, match="needs 'model'"):
        SpeculativeConfig.from_dict({"method": "draft_model", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig.from_dict({"method": "draft_model", "num_speculative_tokens": 2,
                                     "model": "m", "prompt_lookup_min": 2})
    other = make_checkpoint("llama", "float32", str(tmp_path), vocab_size=VOCAB + 64)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(ckpts["qwen3"], skip_tokenizer_init=True, device="cpu",
            speculative_config=spec_cfg(other))
