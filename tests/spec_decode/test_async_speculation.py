"""Asynchronous scheduling with speculation: a step whose finish may propose drafts finishes
before the next step is scheduled (the drafts need its tokens on the host); while speculation's
backoff pauses every request of the batch, steps are launched ahead of the last one's tokens as
without speculation. Forced on here on the CPU (the GPU's default): the tokens are those of
synchronous steps without speculation, for drafts that never match (most steps launched
ahead), drafts accepted in part, and the hidden-state drafters (whose captured hidden states
are copied before a step launched ahead overwrites them)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint
from tests.spec_decode.harness import check_greedy_unchanged, run
from tests.spec_decode.test_ngram import prompts, seeded_greedy_penalized

pytest.importorskip("torch")

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
ASYNC = {"async_scheduling": True}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return make_checkpoint("llama", "float32", str(tmp_path_factory.mktemp("async-spec")))


def _count_launches(monkeypatch) -> dict:
    """Counts the steps launched while another was in flight (its tokens not yet taken)."""
    from vllmx.worker.model_runner import ModelRunner

    counts = {"ahead": 0, "steps": 0}
    launch = ModelRunner.execute_model

    def counted(self, so, non_block=False):
        counts["steps"] += 1
        counts["ahead"] += self._in_flight is not None and not self._in_flight.done
        return launch(self, so, non_block)

    monkeypatch.setattr(ModelRunner, "execute_model", counted)
    return counts


def test_paused_speculation_launches_ahead(llama, monkeypatch):
    from vllmx import SamplingParams
    from vllmx.spec_decode.ngram_proposer import NgramProposer

    rng = np.random.default_rng()
    monkeypatch.setattr(NgramProposer, "propose_batch", lambda self, seqs: {
        r: rng.integers(3, VOCAB, 3).tolist() for r in seqs})
    ps = [{"prompt_token_ids": rng.integers(3, VOCAB, 12).tolist()} for _ in range(3)]
    sps = [SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)] * 3
    want, _ = run(llama, ps, sps)
    counts = _count_launches(monkeypatch)
    got, stats = run(llama, ps, sps, {"method": "ngram", "num_speculative_tokens": 3}, **ASYNC)
    assert got == want
    assert stats.spec_decode_num_drafts > 0
    # ~120 steps, a few dozen of them verifying (or just before one): most launched ahead
    assert counts["ahead"] > counts["steps"] / 2, counts


def test_mixed_requests_keep_their_tokens(llama):
    rng = np.random.default_rng()
    ps = prompts(rng, 8)
    sps = seeded_greedy_penalized(rng, len(ps), 60)
    want, _ = run(llama, ps, sps)
    got, stats = run(llama, ps, sps, NGRAM, **ASYNC)
    assert got == want
    assert stats.spec_decode_num_drafts > 0


def test_drafts_accepted_in_part(tmp_path, monkeypatch):
    from tests.spec_decode.test_hybrid import check_partial_acceptance

    check_partial_acceptance(make_checkpoint("nemotron_h", "float32", str(tmp_path)),
                             monkeypatch, **ASYNC)


@pytest.mark.parametrize("kind", ["eagle3", "aligned"])
def test_hidden_state_drafters(kind, tmp_path_factory):
    from tests.spec_decode.eagle_checkpoints import make_eagle_checkpoints
    from tests.spec_decode.test_eagle import spec_cfg

    ckpts = make_eagle_checkpoints(str(tmp_path_factory.mktemp("eagle-async")))
    target, spec = spec_cfg(ckpts, kind)
    check_greedy_unchanged(target, spec, kind == "aligned", **ASYNC)


def test_stop_strings_finish_behind_the_next_step(smollm2_gguf):
    """A step with drafts is taken into the scheduler before the next is scheduled, and its
    outputs (detokenized, stop strings checked) are formed while that next step runs: a stop
    string then finishes a request the launched step still holds. Its text, tokens and stop
    reason are those of synchronous steps without speculation, and no KV block is lost."""
    from vllmx import LLM, SamplingParams

    texts = ["Repeat exactly: the cat sat on the mat, the cat sat on the mat, the dog ran.",
             "Print this list twice: apple, pear, plum, fig, kiwi, lime.",
             "Copy this sentence: green leaves fall slowly in the cold autumn wind.",
             "Write the numbers one two three four five six seven eight nine ten."]
    ps = [{"prompt": t} for t in texts]
    plain = LLM(smollm2_gguf, max_model_len=512)
    free = [o.outputs[0].text for o in plain.generate(
        ps, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)]
    # Each stop string a word from the middle of that prompt's free answer (or none).
    stops = [[w] if (w := t.split()[len(t.split()) // 2] if len(t.split()) > 4 else "") else []
             for t in free]
    sps = [SamplingParams(temperature=0, max_tokens=48, stop=s) for s in stops]

    def rows(outs):
        return [(o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason,
                 o.outputs[0].stop_reason) for o in outs]

    want = rows(plain.generate(ps, sps, use_tqdm=False))
    del plain
    assert sum(r[2] == "stop" and r[3] is not None for r in want) >= 2, want
    spec = LLM(smollm2_gguf, max_model_len=512, async_scheduling=True,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                   "prompt_lookup_min": 1})
    for batch in (ps, ps[:1], ps[1:2]):  # together, and one request alone
        n = len(batch)
        got = rows(spec.generate(batch, sps[:n] if n > 1 else
                                 [sps[ps.index(batch[0])]], use_tqdm=False))
        assert got == [want[ps.index(p)] for p in batch]
    st = spec.llm_engine.scheduler
    assert st.make_stats().spec_decode_num_drafts > 0
    assert st.kv_cache_manager.num_free_blocks == spec.llm_engine.config.cache_config.num_blocks
