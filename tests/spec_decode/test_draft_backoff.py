"""Speculation's backoff (worker/step_state.py DraftBackoff): a request whose drafts are all
rejected in MISSES verify steps in a row stops drafting for a pause that doubles while the
probes after it fail, and drafts every step again once one is accepted; with drafts that
never match, an engine verifies drafts in few of its steps and its tokens stay those without
speculation."""

from __future__ import annotations

import numpy as np

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint
from tests.spec_decode.harness import run
from vllmx.worker.step_state import DraftBackoff


def test_pauses_double_while_probes_fail_and_reset_on_an_accepted_draft():
    b = DraftBackoff()
    plan = []
    for _ in range(60):
        drafts = b.drafts_now()
        plan.append(drafts)
        if drafts:
            b.update(0)  # every draft rejected
    verified = [i for i, d in enumerate(plan) if d]
    assert verified[:DraftBackoff.MISSES] == list(range(DraftBackoff.MISSES))
    gaps = np.diff(verified[DraftBackoff.MISSES - 1:]) - 1  # the pauses between probes
    assert gaps.tolist()[:4] == [2, 4, 8, 16]
    b.update(1)  # a draft accepted: drafting every step again
    b.skip = 0
    assert all(b.drafts_now() for _ in range(10))
    for _ in range(DraftBackoff.MISSES):
        b.update(0)
    assert not b.drafts_now()  # the pause restarts at 2
    assert not b.drafts_now()
    assert b.drafts_now()


def test_probes_after_a_pause_verify_one_draft():
    b = DraftBackoff()
    assert b.max_drafts(4) == 4
    b.update(0)  # a miss alone: k drafts still (copy runs resume after one)
    assert b.max_drafts(4) == 4
    for _ in range(DraftBackoff.MISSES - 1):
        b.update(0)
    assert b.max_drafts(4) == 1  # paused: the probe after it verifies one draft
    b.update(0)
    assert b.max_drafts(4) == 1
    b.update(1)  # accepted: k again
    assert b.max_drafts(4) == 4


def test_drafts_that_never_match_are_mostly_not_verified(tmp_path, monkeypatch):
    from vllmx import SamplingParams
    from vllmx.spec_decode.ngram_proposer import NgramProposer

    rng = np.random.default_rng()
    monkeypatch.setattr(NgramProposer, "propose_batch", lambda self, seqs: {
        r: rng.integers(3, VOCAB, 3).tolist() for r in seqs})
    path = make_checkpoint("llama", "float32", str(tmp_path))
    ps = [{"prompt_token_ids": rng.integers(3, VOCAB, 12).tolist()} for _ in range(3)]
    sps = [SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)] * 3
    want, _ = run(path, ps, sps)
    got, stats = run(path, ps, sps, {"method": "ngram", "num_speculative_tokens": 3})
    assert got == want
    # 3 requests x 120 tokens, nearly one verify step a token: drafted in a few dozen at most,
    # 3 drafts in each request's first MISSES verify steps, one in each probe after (unless a
    # random draft happened to match, which starts a request over).
    assert 3 * DraftBackoff.MISSES <= stats.spec_decode_num_drafts <= 60
    if stats.spec_decode_num_accepted_tokens == 0:
        assert (stats.spec_decode_num_draft_tokens
                == stats.spec_decode_num_drafts + 2 * 3 * DraftBackoff.MISSES)
