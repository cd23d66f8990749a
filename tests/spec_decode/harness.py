"""The engine runs the speculative decoding tests compare: one LLM per run (the CPU unless told
otherwise), its outputs' token ids and scheduler stats, and the check that every KV block came
back."""

from __future__ import annotations

import gc

from tests.spec_decode.test_ngram import tokens


def checkpoints_with_mtp(root: str, families, write_mtp) -> dict:
    """(family, kind) -> a tiny checkpoint under root: kind "no_mtp" as transformers writes it
    (its models hold no MTP weights), "random" and "aligned" with write_mtp(path, aligned)'s
    MTP layer beside it."""
    import os
    import shutil

    from tests.models.tiny_checkpoints import make_checkpoint

    out = {}
    for family in families:
        base = out[family, "no_mtp"] = make_checkpoint(family, "float32", root)
        for kind in ("random", "aligned"):
            path = os.path.join(root, f"{family}-{kind}")
            shutil.copytree(base, path)
            write_mtp(path, aligned=kind == "aligned")
            out[family, kind] = path
    return out


def run(ckpt, ps, sps, spec=None, device="cpu", **kw):
    """(token ids per prompt, scheduler stats) of one engine on ckpt, speculating with spec."""
    from vllmx import LLM

    llm = LLM(ckpt, skip_tokenizer_init=True, device=device, speculative_config=spec, **kw)
    outs = tokens(llm.generate(ps, sps, use_tqdm=False))
    stats = llm.llm_engine.scheduler.make_stats()
    free = llm.llm_engine.scheduler.kv_cache_manager.num_free_blocks
    total = llm.llm_engine.config.cache_config.num_blocks
    del llm
    gc.collect()
    assert free == total
    return outs, stats


def check_greedy_unchanged(ckpt, spec, aligned: bool, **kw) -> None:
    """8 greedy requests of 1-40 tokens and 4 of 64: the tokens without speculation, drafts
    made, and for a drafter built to agree with the target (aligned) some accepted and some
    not (the long ones keep drafting through speculation's backoff, whose pauses end in probes).
    kw: the engines' other arguments (the GPU's)."""
    import numpy as np

    from tests.spec_decode.test_ngram import prompts
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    ps = prompts(rng, 8)
    ps += prompts(rng, 4)
    sps = [SamplingParams(temperature=0, max_tokens=int(rng.integers(1, 40)), ignore_eos=True)
           for _ in ps[:8]] + [SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)] * 4
    want, _ = run(ckpt, ps, sps, **kw)
    got, stats = run(ckpt, ps, sps, spec, **kw)
    assert got == want
    assert stats.spec_decode_num_drafts > 0
    if aligned:  # built to agree with the target often, not always
        assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens, (
            stats.spec_decode_num_accepted_tokens, stats.spec_decode_num_draft_tokens)


def check_abort_mid_verify(ckpt, spec) -> None:
    """Three greedy requests, r1 aborted while drafts wait for its next verify step: the others'
    tokens are those without speculation, r1's a prefix of its, and no KV block is left."""
    import numpy as np

    from tests.spec_decode.test_ngram import prompts
    from vllmx import LLM, SamplingParams

    rng = np.random.default_rng()
    ps = prompts(rng, 3)
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    want, _ = run(ckpt, ps, [sp] * 3)
    engine = LLM(ckpt, skip_tokenizer_init=True, device="cpu",
                 speculative_config=spec).llm_engine
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, sp)
    finals, steps = {}, 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o.outputs[0].token_ids
        steps += 1
        if steps == 4:  # r1 has drafts scheduled for its next verify step
            assert engine.scheduler.requests["r1"].spec_token_ids
            engine.abort_request(["r1"])
    assert finals["r0"] == want[0] and finals["r2"] == want[2]
    assert "r1" not in finals or finals["r1"] == want[1][:len(finals["r1"])]
    assert engine.scheduler.kv_cache_manager.usage == 0


def check_drafts_against(ckpt, spec, make_reference, max_tokens: int = 12, **kw) -> None:
    """Every draft a hidden-state drafter proposes for three requests batched (after prefill
    chunks and verify steps, captured ones included), then for one whose prompt shares the
    first's first two blocks (a prefix-cache hit), is the reference's argmax over the request's
    tokens so far, and the logits of each draft agree with its: the drafter's KV, built pass by
    pass with rejected rows left out and chained rows rewritten, or taken from hit blocks, is
    the one a single pass over the sequence gives. make_reference() has drafts(prompt, sampled,
    k) -> (k drafts, their logits). kw: the engine's other arguments."""
    import numpy as np

    from vllmx import LLM, SamplingParams

    rng = np.random.default_rng()
    llm = LLM(ckpt, skip_tokenizer_init=True, device="cpu", speculative_config=spec,
              max_num_batched_tokens=64, **kw)
    runner = llm.llm_engine.model_runner
    proposer = runner.drafter
    calls, seen = [], []
    propose, compute_logits = proposer.propose_from_hidden, proposer.model.compute_logits

    def spy_logits(h):
        out = compute_logits(h)
        seen.append(np.array(out))
        return out

    def spy(t):
        seen.clear()
        drafts = propose(t)
        seqs = {r: list(runner.requests[r].token_ids) for r in drafts}
        calls.append((drafts, seqs, list(seen)))
        return drafts

    proposer.propose_from_hidden, proposer.model.compute_logits = spy, spy_logits
    ps = [{"prompt_token_ids": rng.integers(3, 500, n).tolist()}
          for n in (40, *rng.integers(5, 40, 2))]
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(ps, sp, use_tqdm=False)
    assert len(calls) > 3
    assert runner.decode_capture.steps, "no step replayed a capture"
    hit = ps[0]["prompt_token_ids"][:32] + rng.integers(3, 500, 9).tolist()
    llm.generate([{"prompt_token_ids": hit}], sp, use_tqdm=False)
    assert llm.llm_engine.scheduler.kv_cache_manager.prefix_cache_stats.hits > 0
    reference = make_reference()
    for drafts, seqs, logits in calls:
        for row, (r, got) in enumerate(drafts.items()):
            want, ref = reference.drafts(seqs[r][:-1], seqs[r][-1], len(got))
            np.testing.assert_allclose([lg[row] for lg in logits], ref, rtol=1e-4,
                                       atol=1e-4 * np.abs(ref).max())
            assert got == want


def check_batched_equal_alone(ckpt, spec) -> object:
    """Greedy and seeded requests (drafted) and penalized ones (not), prompts sharing prefixes
    (cache hits: a drafter's KV in the target's blocks comes with the hit blocks), chunked
    prefill with a small budget and a cache too small for all: each request's tokens batched
    are those it gets alone without speculation. Returns the batched run's stats."""
    import numpy as np

    from tests.spec_decode.test_ngram import prompts, seeded_greedy_penalized

    rng = np.random.default_rng()
    kw = {"max_num_seqs": 6, "max_num_batched_tokens": 40, "num_gpu_blocks_override": 16,
          "block_size": 16, "max_model_len": 192}
    ps = prompts(rng, 12)
    shared = rng.integers(3, 500, 40).tolist()
    ps += [{"prompt_token_ids": shared + p["prompt_token_ids"][:5]} for p in ps[:3]]
    # At least 30 new tokens each: six running requests then outgrow the 16 blocks (3 blocks
    # each at 34 tokens), where draws down to 8 had once let them all fit (no preemption).
    sps = seeded_greedy_penalized(rng, len(ps), 56, min_tokens=30)
    batched, stats = run(ckpt, ps, sps, spec, **kw)
    assert stats.num_preemptions > 0, "the cache was meant to be too small"
    alone = [run(ckpt, [p], [sp], **kw)[0][0] for p, sp in zip(ps, sps)]
    assert batched == alone
    return stats


def check_max_model_len(ckpt, spec) -> object:
    """Requests that end by max_model_len (48): their tokens are those without speculation,
    their drafts stop short of it, and the lookahead slots (clamped to it) hold the chained
    drafts' KV. Returns the speculating run's stats."""
    import numpy as np

    from vllmx import SamplingParams

    rng = np.random.default_rng()
    ps = [{"prompt_token_ids": rng.integers(3, 500, int(rng.integers(20, 44))).tolist()}
          for _ in range(6)]
    sps = [SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)] * len(ps)
    kw = {"max_model_len": 48, "block_size": 16}
    want, _ = run(ckpt, ps, sps, **kw)
    got, stats = run(ckpt, ps, sps, spec, **kw)
    assert got == want
    assert [len(p["prompt_token_ids"]) + len(t) for p, t in zip(ps, got)] == [48] * len(ps)
    return stats
