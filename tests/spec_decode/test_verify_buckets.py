"""The GPU's verify buckets (worker/decode_capture.py) run on the CPU: every verify step padded
to the smallest of the GPU's bucket sizes s with room for it, s requests x (k + 1) rows (the
padding requests a row each, the last one the rows left), gives exactly the tokens without
speculation, eager (what a graph records) and from tapes; dense, MoE and hybrid (whose padding
requests take the scratch state slot), with drafts accepted in part. The CPU itself keeps
unpadded (requests, rows) tapes; this is the GPU's path without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny_checkpoints import make_checkpoint
from tests.spec_decode.harness import run
from tests.spec_decode.test_hybrid import NGRAM, check_partial_acceptance
from tests.spec_decode.test_ngram import prompts, seeded_greedy_penalized

pytest.importorskip("torch")

FAMILIES = ("qwen3", "qwen3_moe", "qwen3_next")
# Verify buckets of 1..16 requests at k = 3 (64 rows), so that a verify step of the tests' 8
# requests always has a bucket with room for a padding request (with buckets up to 8 a step of
# all 8 with drafts missing had none and ran unpadded: 6 of 150 seeds never padded a step).
MAX_ROWS = 64


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("verify_buckets"))
    return {f: make_checkpoint(f, "float32", root) for f in FAMILIES}


@pytest.fixture
def buckets(monkeypatch) -> list:
    """Engines built with the GPU's bucket sizes and verify buckets; the (size, rows,
    requests, rows used) of every verify step run in one."""
    from vllmx.worker.decode_capture import DecodeCapture, cudagraph_capture_sizes
    from vllmx.worker.model_runner import ModelRunner

    init, verify_bucket = ModelRunner.__init__, DecodeCapture.verify_bucket
    used: list = []

    def gpu_buckets(self, *args, **kw):
        init(self, *args, **kw)
        if kw.get("num_speculative_tokens"):
            dc = self.decode_capture
            dc.sizes = cudagraph_capture_sizes(dc.sizes[-1])
            dc.set_verify_buckets(kw["num_speculative_tokens"], MAX_ROWS)

    def spied(self, nb, t):
        size = verify_bucket(self, nb, t)
        if size is not None:
            used.append((size, size * self.verify_len, nb, t))
        return size

    monkeypatch.setattr(ModelRunner, "__init__", gpu_buckets)
    monkeypatch.setattr(DecodeCapture, "verify_bucket", spied)
    return used


def test_bucket_choice():
    from vllmx.worker.decode_capture import DecodeCapture

    dc = DecodeCapture([1, 2, 4, 8, 16])
    dc.set_verify_buckets(3, 40)
    assert dc.verify_sizes == [1, 2, 4, 8]
    assert dc.verify_bucket(1, 4) == 1  # one request, all 3 drafts: no padding
    assert dc.verify_bucket(1, 2) == 2  # fewer: a padding request takes the rows left
    assert dc.verify_bucket(3, 9) == 4
    assert dc.verify_bucket(4, 16) == 4
    assert dc.verify_bucket(4, 15) == 8
    assert dc.verify_bucket(8, 32) == 8
    assert dc.verify_bucket(8, 31) is None  # no bigger bucket: unpadded
    assert dc.verify_bucket(9, 12) is None
    with pytest.raises(RuntimeError, match="before any step is captured"):
        dc.steps[1] = object()
        dc.set_verify_buckets(3, 40)


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "taped"])
@pytest.mark.parametrize("family", FAMILIES)
def test_padded_verify_steps_keep_the_tokens(ckpts, family, eager, buckets):
    rng = np.random.default_rng()
    ps = prompts(rng, 8)
    sps = seeded_greedy_penalized(rng, len(ps), 40)
    want, _ = run(ckpts[family], ps, sps, enforce_eager=eager)
    got, stats = run(ckpts[family], ps, sps, NGRAM, enforce_eager=eager)
    assert got == want
    assert stats.spec_decode_num_drafts > 0
    assert any(size > nb for size, _, nb, _ in buckets), buckets  # padding requests ran


def test_padded_verify_steps_accepting_in_part(ckpts, buckets, monkeypatch):
    """Every count of drafts accepted (a hybrid's state rolled back from each) in padded
    buckets."""
    check_partial_acceptance(ckpts["qwen3_next"], monkeypatch, enforce_eager=True)
    assert buckets
