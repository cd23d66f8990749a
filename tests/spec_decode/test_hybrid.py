"""Speculative decoding of hybrid models (Gated DeltaNet / Mamba2 layers beside attention, whose
per-request state a rejected draft would leave advanced past it): a verify step's mixers also
save the state after each of a request's positions (spec_state_indices) and a step that rejects
drafts puts the state after the last accepted one back (worker/state_slots.py). Outputs are
exactly those without speculation: ngram on each hybrid family, greedy and seeded, batched ==
alone through chunked prefill and preemption, aborts; Qwen3-Next / Qwen3.5's own MTP layer
(mtp.*) drafting, random or built to agree with the target; a hybrid draft model is refused by
name."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint
from tests.spec_decode.harness import (
    check_abort_mid_verify,
    check_batched_equal_alone,
    check_greedy_unchanged,
    checkpoints_with_mtp,
    run,
)
from tests.spec_decode.test_ngram import prompts, seeded_greedy_penalized

pytest.importorskip("torch")

HYBRIDS = ("qwen3_next", "qwen3_5", "granite_moe_hybrid", "nemotron_h", "falcon_h1")
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("hybrid_spec"))
    return {f: make_checkpoint(f, "float32", root) for f in HYBRIDS}


def check_ngram(path: str, **kw) -> None:
    """Greedy, seeded and penalized requests batched: the same tokens with and without ngram
    speculation (kw: the engines' other arguments, the GPU's)."""
    rng = np.random.default_rng()
    ps = prompts(rng, 8)
    sps = seeded_greedy_penalized(rng, len(ps), 40)
    want, _ = run(path, ps, sps, **kw)
    got, stats = run(path, ps, sps, NGRAM, **kw)
    assert got == want
    assert stats.spec_decode_num_drafts > 0


def check_partial_acceptance(path: str, monkeypatch, **kw) -> None:
    """Drafts from an oracle that knows each request's greedy tokens and corrupts one in turn
    (the first, second, third, then none: a random wrong token), so that verify steps accept
    every count from none to all: each rejection puts the state after the last accepted
    position back, and the tokens stay those without speculation (a state left advanced past
    a rejected draft would change them). Corrupting each draft at random with p = 0.25 had left
    a position without a rejection in one CI run."""
    from vllmx import SamplingParams
    from vllmx.spec_decode.ngram_proposer import NgramProposer
    from vllmx.worker.state_slots import StateSlots

    rng = np.random.default_rng()
    ps = [{"prompt_token_ids": rng.integers(3, VOCAB, int(rng.integers(3, 20))).tolist()}
          for _ in range(6)]
    sps = [SamplingParams(temperature=0, max_tokens=int(rng.integers(10, 40)), ignore_eos=True)
           for _ in ps]
    want, _ = run(path, ps, sps, **kw)
    full = [p["prompt_token_ids"] + w for p, w in zip(ps, want)]

    turn = itertools.count()

    def oracle(self, seqs):
        out = {}
        for req_id, toks in seqs.items():
            seq = next(f for f in full if f[:len(toks)] == toks.tolist())
            d = list(seq[len(toks):len(toks) + 3])
            i = next(turn) % 4  # the draft to corrupt; 3: none
            if i < len(d):
                d[i] = (d[i] + int(rng.integers(1, VOCAB - 3))) % VOCAB
            out[req_id] = d
        return out

    rollback = StateSlots.rollback

    def counted(self, accepted):
        rolled.extend(m for _, m in accepted)
        rollback(self, accepted)

    rolled: list[int] = []
    monkeypatch.setattr(NgramProposer, "propose_batch", oracle)
    monkeypatch.setattr(StateSlots, "rollback", counted)
    got, stats = run(path, ps, sps, NGRAM, **kw)
    assert got == want
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens
    assert {0, 1, 2} <= set(rolled)  # rejected at every position a rollback can start from


@pytest.mark.parametrize("family", HYBRIDS)
def test_ngram_keeps_the_tokens(ckpts, family):
    check_ngram(ckpts[family])


@pytest.mark.parametrize("family", HYBRIDS)
def test_drafts_accepted_in_part_keep_the_tokens(ckpts, family, monkeypatch):
    check_partial_acceptance(ckpts[family], monkeypatch)


def _random_drafts(monkeypatch):
    """ngram's proposer replaced by one that drafts 3 random tokens for every request."""
    from vllmx.spec_decode.ngram_proposer import NgramProposer

    rng = np.random.default_rng()
    monkeypatch.setattr(NgramProposer, "propose_batch", lambda self, seqs: {
        r: rng.integers(3, VOCAB, 3).tolist() for r in seqs})


def test_batched_equal_alone_through_chunks_and_preemption(ckpts, monkeypatch):
    """Every step drafts (random drafts, nearly all rejected: a rollback a verify step), with
    chunked prefill and preemption (a preempted request's slot, and the slots its states were
    saved in, go to others)."""
    _random_drafts(monkeypatch)
    stats = check_batched_equal_alone(ckpts["qwen3_next"], NGRAM)
    assert stats.spec_decode_num_drafts > 0


def test_abort_mid_verify(ckpts, monkeypatch):
    _random_drafts(monkeypatch)
    check_abort_mid_verify(ckpts["granite_moe_hybrid"], NGRAM)


def test_eager_equals_taped(ckpts):
    """Verify steps replay CPU tapes (which read the rows' state slots in place): the same
    tokens as eager steps."""
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    ps = prompts(rng, 6)
    sps = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)] * len(ps)
    taped, _ = run(ckpts["nemotron_h"], ps, sps, NGRAM)
    eager, _ = run(ckpts["nemotron_h"], ps, sps, NGRAM, enforce_eager=True)
    assert taped == eager


def test_hybrid_draft_model_is_refused(ckpts):
    from vllmx import LLM

    with pytest.raises(ValueError, match="hybrid"):
        LLM(ckpts["qwen3_5"], skip_tokenizer_init=True, device="cpu",
            speculative_config={"method": "draft_model", "num_speculative_tokens": 2,
                                "model": ckpts["qwen3_5"]})


# ---- Qwen3-Next / Qwen3.5's own MTP layer ----

QWEN_MTP = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
SCALE = 0.02


def _write_qwen_mtp(path: str, aligned: bool, seed: int = 0) -> None:
    """mtp.*, which transformers' models do not hold, into a safetensors file of its own: a
    decoder layer shaped as the last full-attention one, random; with `aligned`, the target's
    mixers' and MLPs' outputs scaled down (its residual stream stays near the token's
    embedding, so its next token is nearly a function of the current one) and an MTP layer
    whose output is that embedding's norm read through the target's final norm and lm_head:
    its drafts are the target's tokens more often than not."""
    import json

    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(seed)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    full = max(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
    w = load_file(os.path.join(path, "model.safetensors"))
    h = w["model.norm.weight"].shape[0]
    out = {}
    for name, t in w.items():
        if name.startswith(f"model.layers.{full}."):
            out["mtp.layers.0." + name.split(".", 3)[3]] = (
                rng.standard_normal(t.shape) * t.std() + t.mean()).astype(np.float32)
    fc = rng.standard_normal((h, 2 * h)).astype(np.float32) / np.sqrt(h)
    if aligned:
        def damp(ws):
            return {n: t * SCALE if n.endswith(("o_proj.weight", "down_proj.weight",
                                                "out_proj.weight")) else t
                    for n, t in ws.items()}

        w, out = damp(w), damp(out)
        fc[:, :h] = np.eye(h)
        fc[:, h:] *= SCALE
        out["mtp.pre_fc_norm_embedding.weight"] = np.zeros(h, np.float32)  # (1 + w): 1
        out["mtp.norm.weight"] = w["model.norm.weight"].copy()
        save_file(w, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        out["mtp.pre_fc_norm_embedding.weight"] = rng.normal(0, 0.3, h).astype(np.float32)
        out["mtp.norm.weight"] = rng.normal(0, 0.3, h).astype(np.float32)
    out["mtp.pre_fc_norm_hidden.weight"] = rng.normal(0, 0.3, h).astype(np.float32)
    out["mtp.fc.weight"] = fc.astype(np.float32)
    save_file(out, os.path.join(path, "mtp.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def mtp_ckpts(tmp_path_factory) -> dict:
    return checkpoints_with_mtp(str(tmp_path_factory.mktemp("qwen_mtp")), QWEN_MTP,
                                _write_qwen_mtp)


MTP = {"method": "mtp", "num_speculative_tokens": 3}


@pytest.mark.parametrize("family", QWEN_MTP)
@pytest.mark.parametrize("kind", ["random", "aligned"])
def test_mtp_keeps_the_tokens(mtp_ckpts, family, kind):
    check_greedy_unchanged(mtp_ckpts[family, kind], MTP, kind == "aligned")


def test_mtp_batched_equal_alone(mtp_ckpts):
    stats = check_batched_equal_alone(mtp_ckpts["qwen3_5", "aligned"], MTP)
    assert stats.spec_decode_num_drafts > 0


def test_mtp_without_its_layer_is_refused(mtp_ckpts):
    from vllmx import LLM

    with pytest.raises(ValueError, match="no MTP layer"):
        LLM(mtp_ckpts["qwen3_next", "no_mtp"], skip_tokenizer_init=True, device="cpu",
            speculative_config=MTP)
