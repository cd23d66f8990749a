"""LoRA adapters on the CPU against transformers + peft (TESTING.md's token parity, f32,
delta 0.01), and the engine's rule: a batch mixing adapters and the base model (chunked
prefill too) gives each request the tokens it gets alone."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.lora.adapters import ADAPTERS, check_against_peft, make_adapter, peft_model
from tests.models.parity import prompt_logits_rel_error
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

NUM_PROMPTS, MAX_TOKENS, DELTA = 8, 32, 0.01
SEED = int.from_bytes(os.urandom(4), "little")


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lora"))
    base = make_checkpoint("llama", "float32", out)
    return base, {name: make_adapter(base, out, name, seed=i)
                  for i, name in enumerate(ADAPTERS)}


def lora_requests(adapters: dict[str, str]):
    from vllmx.lora.request import LoRARequest

    return {name: LoRARequest(name, i + 1, path) for i, (name, path) in
            enumerate(adapters.items())}


def prompts(rng, n=NUM_PROMPTS) -> list[list[int]]:
    return [rng.integers(3, VOCAB, size=k).tolist() for k in rng.integers(3, 40, size=n)]


def greedy(max_tokens=MAX_TOKENS):
    from vllmx import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def test_parity_with_peft(lora_setup):
    from vllmx import LLM

    base, adapters = lora_setup
    reqs = lora_requests(adapters)
    llm = LLM(base, skip_tokenizer_init=True, kv_cache_dtype="float32", enable_lora=True,
              max_loras=3, max_lora_rank=16)
    ps = prompts(np.random.default_rng(SEED))
    base_toks = [o.outputs[0].token_ids for o in
                 llm.generate([{"prompt_token_ids": p} for p in ps], greedy())]
    for name, path in adapters.items():
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], greedy(),
                            lora_request=reqs[name])
        check_against_peft(outs, base_toks, ps, base, path, DELTA, f"adapter {name} (seed {SEED})")
        oracle = peft_model(base, path)
        # Prompt logits within 1e-3 relative of the oracle's (TESTING.md), the adapter set
        # for every row as the model runner sets it for a step.
        lora = reqs[name]
        for p in ps[:3]:
            llm.llm_engine.lora_manager.set_active_loras(np.full(len(p), lora.lora_int_id),
                                                         {lora.lora_int_id: lora})
            with torch.no_grad():
                ref = oracle(torch.tensor([p])).logits[0].double().numpy()
            rel = prompt_logits_rel_error(llm, p, ref)
            assert rel < 1e-3, f"adapter {name} prompt logits rel. error {rel:.3g} ({SEED})"


@pytest.mark.parametrize("max_num_batched_tokens", [8192, 24])
def test_mixed_batch_equals_alone(lora_setup, max_num_batched_tokens):
    from vllmx import LLM

    base, adapters = lora_setup
    reqs = [None] + list(lora_requests(adapters).values())
    llm = LLM(base, skip_tokenizer_init=True, enable_lora=True, max_loras=3,
              max_lora_rank=16, max_num_batched_tokens=max_num_batched_tokens,
              enable_prefix_caching=False)
    ps = prompts(np.random.default_rng(SEED), 8)
    loras = [reqs[i % len(reqs)] for i in range(len(ps))]
    mixed = llm.generate([{"prompt_token_ids": p} for p in ps], greedy(16), lora_request=loras)
    for p, lora, out in zip(ps, loras, mixed):
        alone = llm.generate([{"prompt_token_ids": p}], greedy(16), lora_request=lora)
        assert out.outputs[0].token_ids == alone[0].outputs[0].token_ids, (SEED, lora)


def test_prefix_cache_keyed_by_adapter(lora_setup):
    from vllmx import LLM

    base, adapters = lora_setup
    reqs = lora_requests(adapters)
    llm = LLM(base, skip_tokenizer_init=True, enable_lora=True, max_loras=2,
              max_lora_rank=16, block_size=16)
    prompt = {"prompt_token_ids": np.random.default_rng(SEED).integers(3, VOCAB, 40).tolist()}
    first = llm.generate(prompt, greedy(8), lora_request=reqs["all"])[0]
    again = llm.generate(prompt, greedy(8), lora_request=reqs["all"])[0]
    other = llm.generate(prompt, greedy(8), lora_request=reqs["qv"])[0]
    plain = llm.generate(prompt, greedy(8))[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 32
    assert other.num_cached_tokens == 0 and plain.num_cached_tokens == 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    fresh = LLM(base, skip_tokenizer_init=True, enable_lora=True, max_lora_rank=16,
                enable_prefix_caching=False)
    assert other.outputs[0].token_ids == fresh.generate(
        prompt, greedy(8), lora_request=reqs["qv"])[0].outputs[0].token_ids


def test_taped_decode_equals_eager(lora_setup, monkeypatch):
    """Decode steps with adapters replay their step tapes (the rows' slots are the LoRA op's
    input), and give the tokens of an engine that runs every step eagerly; three adapters and
    the base model through two slots, so slots are rewritten between steps."""
    from vllmx import LLM
    from vllmx.worker import step_capture

    base, adapters = lora_setup
    reqs = [None] + list(lora_requests(adapters).values())
    ps = prompts(np.random.default_rng(SEED), 12)
    loras = [reqs[i % len(reqs)] for i in range(len(ps))]
    kw = {"skip_tokenizer_init": True, "enable_lora": True, "max_loras": 2,
          "max_lora_rank": 16, "enable_prefix_caching": False, "max_num_seqs": 8}
    replays = [0]
    real = step_capture.CapturedStep.replay

    def counted(self, *a, **k):
        replays[0] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(step_capture.CapturedStep, "replay", counted)
    taped = LLM(base, **kw).generate([{"prompt_token_ids": p} for p in ps], greedy(16),
                                     lora_request=loras)
    assert replays[0] > 10
    eager = LLM(base, enforce_eager=True, **kw).generate(
        [{"prompt_token_ids": p} for p in ps], greedy(16), lora_request=loras)
    assert [o.outputs[0].token_ids for o in taped] == [o.outputs[0].token_ids for o in eager]


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_decoding_keeps_each_adapters_tokens(lora_setup, method):
    """Drafted requests of three adapters and the base model in one batch get the tokens they
    get without speculation: the target verifies each row under its request's adapter (a
    draft model drafts without adapters, which only lowers acceptance)."""
    from vllmx import LLM

    base, adapters = lora_setup
    reqs = [None] + list(lora_requests(adapters).values())
    rng = np.random.default_rng(SEED)
    # Prompts that repeat themselves, so that prompt lookup finds drafts.
    ps = [(rng.integers(3, VOCAB, size=int(n)).tolist() * 3)[:48]
          for n in rng.integers(4, 12, size=8)]
    loras = [reqs[i % len(reqs)] for i in range(len(ps))]
    spec = ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
             "prompt_lookup_min": 1} if method == "ngram"
            else {"method": "draft_model", "model": base, "num_speculative_tokens": 3})
    kw = {"skip_tokenizer_init": True, "enable_lora": True, "max_loras": 4, "max_lora_rank": 16,
          "enable_prefix_caching": False}
    want = LLM(base, **kw).generate([{"prompt_token_ids": p} for p in ps], greedy(24),
                                    lora_request=loras)
    llm = LLM(base, speculative_config=spec, **kw)
    got = llm.generate([{"prompt_token_ids": p} for p in ps], greedy(24), lora_request=loras)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    sched = llm.llm_engine.scheduler
    assert sched.spec_decode_num_drafts > 0 and sched.spec_decode_num_accepted_tokens > 0


def test_beam_search_under_adapters(lora_setup):
    """LLM.beam_search and AsyncLLM.beam_search (the server's) run each prompt's beams under
    its adapter: width 1 is that adapter's greedy output, each beam's cum_logprob is the sum
    of its tokens' log-probs under a forward with the adapter, and the adapters' beams differ
    from the base model's."""
    import asyncio
    import math

    from vllmx import LLM, BeamSearchParams, SamplingParams
    from vllmx.engine.async_llm import AsyncLLM

    base, adapters = lora_setup
    reqs = lora_requests(adapters)
    llm = LLM(base, skip_tokenizer_init=True, enable_lora=True, max_loras=3, max_lora_rank=16)
    prompt = {"prompt_token_ids": [5, 17, 42, 9]}
    lora = reqs["all"]
    one = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=8, ignore_eos=True),
                          lora_request=lora)[0]
    greedy_out = llm.generate([prompt], greedy(8), lora_request=lora)[0].outputs[0]
    assert one.sequences[0].tokens[4:] == greedy_out.token_ids
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    loras = [None, reqs["all"], reqs["mlp"]]
    outs = llm.beam_search([prompt] * 3, params, lora_request=loras)
    assert len({tuple(tuple(b.tokens) for b in o.sequences) for o in outs}) == 3
    for out, lr in zip(outs[1:], loras[1:]):
        for b in out.sequences:
            scored = llm.generate([{"prompt_token_ids": b.tokens}],
                                  SamplingParams(max_tokens=1, prompt_logprobs=0),
                                  lora_request=lr)[0]
            lps = [scored.prompt_logprobs[i][t].logprob for i, t in enumerate(b.tokens) if i >= 4]
            assert math.isclose(sum(lps), b.cum_logprob, rel_tol=1e-4, abs_tol=1e-4)
    engine = AsyncLLM(llm.llm_engine)
    try:
        async def run():
            return [o async for o in engine.beam_search(prompt, "bs", params,
                                                        lora_request=reqs["all"])]

        got = asyncio.run(run())[0].outputs
    finally:
        engine.shutdown()
    assert [c.token_ids for c in got] == [b.tokens[4:] for b in outs[1].sequences]


@pytest.mark.parametrize("lora_dtype,want_dtype", [("auto", "bfloat16"), ("float32", "float32")])
def test_bf16_base_keeps_adapters_in_lora_dtype(tmp_path, lora_dtype, want_dtype):
    """On a bf16 checkpoint lora_dtype "auto" keeps the adapters in bf16 (vLLM keeps them in the
    model's dtype), "float32" in f32: the tokens of transformers + peft over the bf16 weights
    and the adapter's weights as rounded to that dtype (delta 0.01)."""
    from vllmx import LLM
    from vllmx.device import BF16, F32

    base = make_checkpoint("llama", "bfloat16", str(tmp_path))
    path = make_adapter(base, str(tmp_path), "all", seed=5)
    llm = LLM(base, skip_tokenizer_init=True, kv_cache_dtype="float32", enable_lora=True,
              max_lora_rank=16, lora_dtype=lora_dtype)
    layers = llm.llm_engine.lora_manager.modules[0]
    assert {la.dtype for la in layers.values()} == {BF16 if want_dtype == "bfloat16" else F32}
    ps = prompts(np.random.default_rng(SEED), 6)
    base_toks = [o.outputs[0].token_ids for o in
                 llm.generate([{"prompt_token_ids": p} for p in ps], greedy())]
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], greedy(),
                        lora_request=lora_requests({"all": path})["all"])
    oracle = peft_model(base, path)
    with torch.no_grad():
        for name, p in oracle.named_parameters():
            if "lora_" in name:  # (their scalings are powers of two: rounding commutes)
                p.copy_(p.to(getattr(torch, want_dtype)).to(torch.float32))
    check_against_peft(outs, base_toks, ps, base, path, DELTA, f"{lora_dtype} (seed {SEED})",
                       oracle)
