"""Speculative decoding with prompt lookup (method "ngram"): the proposer, the config's
checks, and the engine rule that speculation changes no token — greedy output with drafts is
the output without them, batched or alone, through chunked prefill, preemption, stops,
max_tokens, logprobs and aborts — while drafts do get accepted."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint
from vllmx.config import SpeculativeConfig
from vllmx.spec_decode.ngram_proposer import NgramProposer

pytest.importorskip("torch")

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
         "prompt_lookup_max": 3}


def proposer(k=3, lo=2, hi=3) -> NgramProposer:
    return NgramProposer(SpeculativeConfig.from_dict(
        {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
         "prompt_lookup_max": hi}))


def naive_propose(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The definition, spelled out: the longest n-gram (hi down to lo) ending the sequence
    that occurred before; the k tokens after its latest earlier occurrence."""
    n = len(tokens)
    for size in range(hi, lo - 1, -1):
        if size >= n:
            continue
        suffix = tokens[n - size:]
        for start in range(n - size - 1, -1, -1):
            if tokens[start:start + size] == suffix:
                return tokens[start + size:start + size + k]
    return []


def test_proposer_matches_the_definition():
    rng = np.random.default_rng()
    p = proposer(k=4, lo=2, hi=4)
    hits = 0
    for _ in range(400):
        n = int(rng.integers(1, 60))
        toks = rng.integers(0, int(rng.integers(2, 6)), n).tolist()  # small alphabets repeat
        got = p.propose(np.array(toks, np.int32))
        assert got == naive_propose(toks, 4, 2, 4), toks
        hits += bool(got)
    assert hits > 100


def test_proposer_prefers_the_longest_ngram():
    p = proposer(k=2, lo=1, hi=3)
    # "7 8 9" occurred once (followed by 1 2); "8 9" more recently (followed by 5 5)
    toks = np.array([7, 8, 9, 1, 2, 4, 8, 9, 5, 5, 7, 8, 9], np.int32)
    assert p.propose(toks) == [1, 2]
    assert proposer(k=2, lo=1, hi=2).propose(toks) == [5, 5]
    assert p.propose(np.array([1, 2, 3], np.int32)) == []  # nothing repeats


@pytest.mark.parametrize("cfg,msg", [
    ({"num_speculative_tokens": 2}, "needs a 'method'"),
    ({"method": "medusa", "num_speculative_tokens": 2}, "does not run yet"),
    ({"method": "magic", "num_speculative_tokens": 2}, "not a speculative method"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "keys ['model']"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
      "prompt_lookup_max": 2}, "above prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, ">= 1"),
    ("{not json", "not valid JSON"),
])
def test_config_errors_name_the_problem(cfg, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        SpeculativeConfig.from_dict(cfg)


def test_config_lookup_defaults():
    c = SpeculativeConfig.from_dict('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3,
                                     "prompt_lookup_max": 4})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (4, 4)


def test_serve_flag_reaches_the_engine_args():
    from vllmx.cli.serve import add_serve_parser, engine_args_from

    top = argparse.ArgumentParser()
    parser = add_serve_parser(top.add_subparsers())
    args = parser.parse_args(["m", "--speculative-config", '{"method": "ngram", '
                              '"num_speculative_tokens": 3}'])
    cfg = engine_args_from(args).create_engine_config()
    assert cfg.speculative_config.num_speculative_tokens == 3
    assert cfg.scheduler_config.async_scheduling is None  # the engine decides (the GPU: on)
    for flag, value in (("--async-scheduling", True), ("--no-async-scheduling", False)):
        cfg = engine_args_from(parser.parse_args(["m", flag])).create_engine_config()
        assert cfg.scheduler_config.async_scheduling is value


# ---- the engine ----

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return make_checkpoint("qwen3", "float32", str(tmp_path_factory.mktemp("spec")))


def llm_pair(model_dir, **kw):
    """Two engines on one checkpoint, without and with speculation. f32 activations (on the
    GPU the batch-invariant reference: a verify step's several rows per request must give the
    logits a decode step gives) and a fixed KV cache size (two engines share a GPU, where a
    memory share would give the second one nothing)."""
    from vllmx import LLM

    kw = {"dtype": "float32", **kw}
    if "num_gpu_blocks_override" not in kw:
        kw["kv_cache_memory_bytes"] = 64 << 20
    base = LLM(model_dir, skip_tokenizer_init=True, **kw)
    spec = LLM(model_dir, skip_tokenizer_init=True, speculative_config=NGRAM, **kw)
    return base, spec


def prompts(rng, n):
    # Repeated phrases: drafts from the prompt, and tiny random models loop on their own.
    return [{"prompt_token_ids": rng.integers(3, VOCAB, int(rng.integers(4, 14))).tolist()
             * int(rng.integers(1, 4))} for _ in range(n)]


def seeded_greedy_penalized(rng, n: int, max_tokens: int, min_tokens: int = 8) -> list:
    """n SamplingParams in turn seeded random, greedy and greedy with a repetition penalty
    (drafted, drafted, not drafted), max_tokens drawn in [min_tokens, max_tokens)."""
    from vllmx import SamplingParams

    sps = []
    for i in range(n):
        m = int(rng.integers(min_tokens, max_tokens))
        if i % 3 == 0:
            sps.append(SamplingParams(temperature=0.8, seed=i, max_tokens=m, ignore_eos=True))
        elif i % 3 == 1:
            sps.append(SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
        else:
            sps.append(SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=m,
                                      ignore_eos=True))
    return sps


def tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_greedy_output_is_unchanged_and_drafts_are_accepted(model_dir):
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    base, spec = llm_pair(model_dir, max_num_seqs=8)
    ps = prompts(rng, 8)
    sp = [SamplingParams(temperature=0, max_tokens=int(rng.integers(1, 50)), ignore_eos=True)
          for _ in ps]
    want = tokens(base.generate(ps, sp))
    assert tokens(spec.generate(ps, sp)) == want
    assert [len(t) for t in want] == [p.max_tokens for p in sp]
    stats = spec.llm_engine.scheduler.make_stats()
    assert stats.spec_decode_num_drafts > 0
    if spec.llm_engine.device == "cpu":  # verify steps ran as tapes, keyed (requests, tokens)
        assert any(isinstance(key, tuple) for key in
                   spec.llm_engine.model_runner.decode_capture.steps)
    assert 0 < stats.spec_decode_num_accepted_tokens <= stats.spec_decode_num_draft_tokens


def test_batched_equal_alone_through_chunks_and_preemption(model_dir):
    """Greedy requests (drafted), seeded random and penalized ones (not drafted) batched with
    chunked prefill and a cache too small for all: each gets its tokens without speculation,
    run alone."""

    rng = np.random.default_rng()
    kw = dict(max_num_seqs=6, max_num_batched_tokens=48, num_gpu_blocks_override=12,
              block_size=16, max_model_len=192)
    base, spec = llm_pair(model_dir, **kw)
    ps = prompts(rng, 14)
    sps = seeded_greedy_penalized(rng, len(ps), 60)
    batched = tokens(spec.generate(ps, sps))
    assert spec.llm_engine.scheduler.num_preemptions > 0, "the cache was meant to be too small"
    assert spec.llm_engine.scheduler.make_stats().spec_decode_num_accepted_tokens > 0
    for i, (p, sp) in enumerate(zip(ps, sps)):
        assert tokens(base.generate([p], sp)) == [batched[i]], f"request {i}"
    assert spec.llm_engine.scheduler.kv_cache_manager.num_free_blocks == 12


def test_stops_and_max_tokens_inside_accepted_drafts(model_dir):
    """A stop token or max_tokens that falls among a step's accepted drafts ends the output
    there, as without speculation."""
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    base, spec = llm_pair(model_dir)
    ps = prompts(rng, 6)
    long = tokens(base.generate(ps, SamplingParams(temperature=0, max_tokens=40,
                                                   ignore_eos=True)))
    for p, out in zip(ps, long):
        stop = out[int(rng.integers(5, 40))]  # a token it emits, likely inside a repeat
        for sp in (SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop]),
                   SamplingParams(temperature=0, max_tokens=int(rng.integers(2, 40)),
                                  ignore_eos=True)):
            a, b = base.generate([p], sp)[0].outputs[0], spec.generate([p], sp)[0].outputs[0]
            assert (b.token_ids, b.finish_reason, b.stop_reason) == \
                (a.token_ids, a.finish_reason, a.stop_reason)


def test_logprobs_of_accepted_drafts(model_dir):
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    base, spec = llm_pair(model_dir)
    ps = prompts(rng, 4)
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2)
    for a, b in zip(base.generate(ps, sp), spec.generate(ps, sp)):
        a, b = a.outputs[0], b.outputs[0]
        assert a.token_ids == b.token_ids and len(b.logprobs) == len(b.token_ids)
        for x, y in zip(a.logprobs, b.logprobs):
            assert list(x) == list(y)
            np.testing.assert_allclose([v.logprob for v in x.values()],
                                       [v.logprob for v in y.values()], atol=1e-4)
        assert b.cumulative_logprob == pytest.approx(a.cumulative_logprob, abs=1e-3)
    assert spec.llm_engine.scheduler.make_stats().spec_decode_num_accepted_tokens > 0


def test_abort_between_verify_steps(model_dir):
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    base, spec = llm_pair(model_dir)
    ps = prompts(rng, 3)
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = tokens(base.generate(ps, sp))
    engine = spec.llm_engine
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, sp)
    finals = {}
    steps = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o.outputs[0].token_ids
        steps += 1
        if steps == 4:
            engine.abort_request(["r1"])
    assert finals["r0"] == want[0] and finals["r2"] == want[2]
    assert "r1" not in finals or finals["r1"] == want[1][:len(finals["r1"])]
    assert engine.scheduler.kv_cache_manager.usage == 0


def test_advance_rng_state_is_the_samplers_own_stream():
    """A verify step's row j starts j draws into the request's stream: the host's transition
    must be the sampler's (one draw per random row)."""
    from vllmx import ops
    from vllmx.layers.sampler import advance_rng_states, seed_rng_state

    rng = np.random.default_rng()
    logits = rng.standard_normal((1, 50)).astype(np.float32)
    one = lambda v: np.array([v], np.float32)
    for seed in rng.integers(0, 2**63, 20).tolist():
        state = seed_rng_state(seed)
        native = state[None].copy()
        for n in range(1, 6):
            ops.sample(logits, one(0.9), np.zeros(1, np.int32), one(1.0), one(0.0), native)
            assert native[0].tolist() == advance_rng_states(state, n).tolist()


def test_seeded_sampling_gives_the_same_tokens_with_speculation(model_dir):
    """Each row of a verify step is sampled with the draw it gets without speculation, so a
    seeded request's tokens do not change, whatever the drafts (the rejection rule for
    single-token proposals: accepted with probability p(draft), else a draw from p without
    it) — over many seeds and settings, batched."""
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    base, spec = llm_pair(model_dir, max_num_seqs=16)
    ps = prompts(rng, 16)
    sps = [SamplingParams(temperature=float(rng.choice([0.3, 0.8, 1.2])),
                          top_k=int(rng.choice([0, 5])), top_p=float(rng.choice([1.0, 0.9])),
                          seed=int(rng.integers(0, 2**31)), max_tokens=40, ignore_eos=True)
           for _ in ps]
    assert tokens(spec.generate(ps, sps)) == tokens(base.generate(ps, sps))
    stats = spec.llm_engine.scheduler.make_stats()
    assert stats.spec_decode_num_accepted_tokens > 0
    assert stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


def test_requests_running_into_max_model_len(model_dir):
    """A request whose drafts are accepted up to max_model_len: a step that accepts every
    draft also samples one more token, so the drafts stop one short of it (with one more, the
    runner's token row overflowed)."""
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    base, spec = llm_pair(model_dir, max_model_len=64, block_size=16)
    ps = prompts(rng, 8)
    sp = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    got = tokens(spec.generate(ps, sp))
    assert got == tokens(base.generate(ps, sp))
    assert [len(p["prompt_token_ids"]) + len(t) for p, t in zip(ps, got)] == [64] * len(ps)
    assert spec.llm_engine.scheduler.make_stats().spec_decode_num_accepted_tokens > 0
