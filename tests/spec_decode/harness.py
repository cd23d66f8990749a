"""The engine runs the speculative decoding tests compare: one LLM per run (CPU), its outputs'
token ids and scheduler stats, and the check that every KV block came back."""

from __future__ import annotations

import gc

from tests.spec_decode.test_ngram import tokens


def run(ckpt, ps, sps, spec=None, **kw):
    """(token ids per prompt, scheduler stats) of one engine on ckpt, speculating with spec."""
    from vllmx import LLM

    llm = LLM(ckpt, skip_tokenizer_init=True, device="cpu", speculative_config=spec, **kw)
    outs = tokens(llm.generate(ps, sps, use_tqdm=False))
    stats = llm.llm_engine.scheduler.make_stats()
    free = llm.llm_engine.scheduler.kv_cache_manager.num_free_blocks
    total = llm.llm_engine.config.cache_config.num_blocks
    del llm
    gc.collect()
    assert free == total
    return outs, stats
