"""Speculative decoding on the GPU: ngram, draft_model (the draft on a KV cache of its own,
set aside from the target's budget), mtp, eagle and eagle3 (reading the target's hidden states
on the device) give exactly the tokens without speculation, greedy and seeded, in f32 (whose kernels are batch invariant: a verify step's k + 1 rows a request are
computed as a decode step's one), every KV block back at the end."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny_checkpoints import make_checkpoint
from tests.spec_decode.harness import run
from tests.spec_decode.test_ngram import prompts, seeded_greedy_penalized

pytestmark = pytest.mark.gpu
pytest.importorskip("torch")

GPU = {"device": "cuda", "dtype": "float32", "kv_cache_memory_bytes": 256 << 20,
       "max_model_len": 512}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("spec-gpu"))
    return {f: make_checkpoint(f, "float32", root) for f in ("qwen3", "llama")}


@pytest.mark.parametrize("method", ["ngram", "draft_self", "draft_other"])
def test_speculation_keeps_the_tokens_on_gpu(ckpts, method):
    rng = np.random.default_rng()
    ps = prompts(rng, 8)
    sps = seeded_greedy_penalized(rng, len(ps), 40)
    spec = ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}
            if method == "ngram" else
            {"method": "draft_model", "num_speculative_tokens": 3,
             "model": ckpts["qwen3" if method == "draft_self" else "llama"]})
    want, _ = run(ckpts["qwen3"], ps, sps, **GPU)
    got, stats = run(ckpts["qwen3"], ps, sps, spec, **GPU)
    assert got == want
    assert stats.spec_decode_num_drafts > 0
    if method == "draft_self":  # the target drafting for itself: every greedy draft accepted
        assert stats.spec_decode_num_accepted_tokens > 0


def test_draft_model_cache_is_set_aside_on_gpu(ckpts):
    """Under gpu_memory_utilization the target's cache leaves the draft's room: the draft's
    blocks are the target's plus its draft-only ones, and the device holds no more than the
    utilization asks (plus the draft's activations and graphs: without the set-aside the
    draft's cache alone, as large as the target's, would go past it)."""
    from vllmx import _C, LLM

    spec = {"method": "draft_model", "num_speculative_tokens": 3, "model": ckpts["llama"]}
    llm = LLM(ckpts["qwen3"], skip_tokenizer_init=True, device="cuda", dtype="float32",
              max_model_len=512, gpu_memory_utilization=0.3, speculative_config=spec)
    engine = llm.llm_engine
    drafter = engine.model_runner.drafter
    target_blocks = engine.config.cache_config.num_blocks
    assert drafter.kv.num_blocks == target_blocks + drafter.extra_blocks
    assert drafter.worker.kv_caches[0][0].shape[0] == drafter.kv.num_blocks
    free, total = _C.cuda_mem_get_info()
    assert total - free <= 0.3 * total + (1 << 30), (total - free) / total


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict:
    """EAGLE / EAGLE-3 heads (tests/spec_decode/eagle_checkpoints.py) and DeepSeek V3 with an MTP
    layer built to agree with it often (tests/spec_decode/test_mtp.py)."""
    import os
    import shutil

    from tests.spec_decode.eagle_checkpoints import make_eagle_checkpoints
    from tests.spec_decode.test_mtp import _write_mtp_layer

    root = str(tmp_path_factory.mktemp("heads-gpu"))
    out = make_eagle_checkpoints(os.path.join(root, "eagle"))
    base = make_checkpoint("deepseek_v3", "float32", root)
    out["mtp"] = os.path.join(root, "deepseek_v3-aligned")
    shutil.copytree(base, out["mtp"])
    _write_mtp_layer(out["mtp"], aligned=True)
    return out


@pytest.mark.parametrize("method,target,head", [
    ("eagle", "aligned_target", "aligned_eagle"), ("eagle3", "target", "eagle3"),
    ("mtp", "mtp", None)])
def test_hidden_state_drafters_keep_the_tokens_on_gpu(heads, method, target, head):
    """mtp / eagle / eagle3 on the GPU: their KV layers in the target's blocks, the target's
    hidden states kept on the device (copied out of the captured decode steps too), each draft
    step's inputs uploaded; the same tokens as without speculation in f32."""
    rng = np.random.default_rng()
    ps = prompts(rng, 8)
    sps = seeded_greedy_penalized(rng, len(ps), 40)
    spec = {"method": method, "num_speculative_tokens": 3}
    if head is not None:
        spec["model"] = heads[head]
    want, _ = run(heads[target], ps, sps, **GPU)
    got, stats = run(heads[target], ps, sps, spec, **GPU)
    assert got == want
    assert stats.spec_decode_num_drafts > 0
    if method != "eagle3":  # (the aligned heads agree with their targets often)
        assert stats.spec_decode_num_accepted_tokens > 0


# ---- hybrids: the CUDA mixers save each verify row's state in its extra slot; a rejection
# copies the state after the last accepted row back (device to device) ----

HYBRIDS = ("qwen3_next", "granite_moe_hybrid", "nemotron_h", "falcon_h1")


@pytest.fixture(scope="module")
def hybrid_ckpts(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("spec-gpu-hybrid"))
    return {f: make_checkpoint(f, "float32", root) for f in HYBRIDS}


@pytest.mark.parametrize("family", HYBRIDS)
def test_hybrid_speculation_keeps_the_tokens_on_gpu(hybrid_ckpts, family, monkeypatch):
    from tests.spec_decode.test_hybrid import check_ngram, check_partial_acceptance

    check_ngram(hybrid_ckpts[family], **GPU)
    check_partial_acceptance(hybrid_ckpts[family], monkeypatch, **GPU)


def test_hybrid_mtp_keeps_the_tokens_on_gpu(tmp_path):
    from tests.spec_decode.harness import check_greedy_unchanged, checkpoints_with_mtp
    from tests.spec_decode.test_hybrid import MTP, _write_qwen_mtp

    ckpts = checkpoints_with_mtp(str(tmp_path), ("qwen3_5",), _write_qwen_mtp)
    check_greedy_unchanged(ckpts["qwen3_5", "aligned"], MTP, True, **GPU)
