"""eagle and eagle3 speculation (vLLM's methods): an EAGLE-1 head drafts from the target's final
hidden states, an EAGLE-3 head from the residual streams entering three of its layers, the target
verifies. Outputs are exactly those without speculation whatever the drafts (random heads: ~none
accepted; a head built to agree with the target: many), batched == alone through chunked
prefill, prefix hits and preemption, seeded sampling, aborts, max_model_len; the drafts are the
argmax of a float64 reference of each head's math on the same weights; what is not supported is
refused by name."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.spec_decode.eagle_checkpoints import make_eagle_checkpoints
from tests.spec_decode.harness import (
    check_abort_mid_verify,
    check_batched_equal_alone,
    check_max_model_len,
    run,
)
from tests.spec_decode.test_ngram import prompts

pytest.importorskip("torch")

# (method, head, target) of each kind of run
HEADS = {"eagle": ("eagle", "eagle", "target"),
         "eagle_two_layers": ("eagle", "eagle_two_layers", "target"),
         "eagle3": ("eagle3", "eagle3", "target"),
         "eagle3_own": ("eagle3", "eagle3_own", "target"),
         "aligned": ("eagle", "aligned_eagle", "aligned_target")}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    return make_eagle_checkpoints(str(tmp_path_factory.mktemp("eagle")))


def spec_cfg(ckpts, kind: str, k: int = 3) -> tuple[str, dict]:
    """(target, speculative_config) of a kind of run."""
    method, head, target = HEADS[kind]
    return ckpts[target], {"method": method, "model": ckpts[head], "num_speculative_tokens": k}


@pytest.mark.parametrize("kind,eager", [(k, False) for k in HEADS] + [("eagle3", True)])
def test_greedy_output_is_unchanged(ckpts, kind, eager):
    """(eager: no step replays a tape, the aux hidden states written by the forward itself;
    test_eagle_reference checks the drafts through captured steps.)"""
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    ps = prompts(rng, 8)
    sps = [SamplingParams(temperature=0, max_tokens=int(rng.integers(1, 40)), ignore_eos=True)
           for _ in ps]
    target, spec = spec_cfg(ckpts, kind)
    want, _ = run(target, ps, sps, enforce_eager=eager)
    got, stats = run(target, ps, sps, spec, enforce_eager=eager)
    assert got == want
    assert stats.spec_decode_num_drafts > 0
    assert stats.spec_decode_num_draft_tokens >= stats.spec_decode_num_drafts
    if kind == "aligned":  # built to agree with the target often, not always
        assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


@pytest.mark.parametrize("kind", ["eagle3", "aligned"])
def test_batched_equal_alone_through_chunks_prefix_hits_and_preemption(ckpts, kind):
    """Greedy and seeded requests (drafted) and penalized ones (not), prompts sharing
    prefixes (cache hits: the head's KV comes with the hit blocks), chunked prefill with a
    small budget and a cache too small for all."""
    stats = check_batched_equal_alone(*spec_cfg(ckpts, kind))
    assert stats.spec_decode_num_draft_tokens > 0
    if kind == "aligned":
        assert stats.spec_decode_num_accepted_tokens > 0


@pytest.mark.parametrize("kind,k", [("aligned", 1), ("eagle3", 4)])
def test_requests_running_into_max_model_len(ckpts, kind, k):
    """Drafts stop short of max_model_len, the lookahead slots (clamped to it) hold the chained
    drafts' KV; k = 1 drafts without chaining."""
    stats = check_max_model_len(*spec_cfg(ckpts, kind, k))
    assert stats.spec_decode_num_draft_tokens > 0


def test_abort_mid_verify(ckpts):
    check_abort_mid_verify(*spec_cfg(ckpts, "eagle3"))


def _edit_config(src: str, dst: str, **changes) -> str:
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return dst


def test_eagle_config_errors(ckpts, tmp_path):
    from vllmx import LLM
    from vllmx.config import SpeculativeConfig

    with pytest.raises(ValueError, match="method 'eagle3' needs 'model'"):
        SpeculativeConfig.from_dict({"method": "eagle3", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match=r"keys \['prompt_lookup_min'\]"):
        SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 2,
                                     "model": "m", "prompt_lookup_min": 2})
    target = ckpts["target"]
    bad = {
        "arch": (_edit_config(ckpts["eagle"], str(tmp_path / "arch"),
                              architectures=["Eagle3Speculator"]), "eagle",
                 r"architectures \['Eagle3Speculator'\]; method 'eagle' reads"),
        "hidden": (_edit_config(ckpts["eagle"], str(tmp_path / "hidden"), hidden_size=128),
                   "eagle", "has hidden_size 128, the target 64"),
        "kv": (_edit_config(ckpts["eagle"], str(tmp_path / "kv"), num_key_value_heads=4),
               "eagle", "has num_key_value_heads 4, the target 2"),
        # vLLM's default layers (2, 2, 1) of a 4-layer target: two distinct, fc reads three
        "default_layers": (_edit_config(ckpts["eagle3"], str(tmp_path / "layers"),
                                        eagle_aux_hidden_state_layer_ids=None), "eagle3",
                           (r"fc reads 192 columns, the target's aux hidden states of layers "
                            r"\[1, 2\] are 128")),
        "eagle1_as_eagle3": (ckpts["eagle"], "eagle3", "not an EAGLE-3 head"),
        "layer_ids": (_edit_config(ckpts["eagle3"], str(tmp_path / "ids"),
                                   eagle_aux_hidden_state_layer_ids=[0, 1, 9]), "eagle3",
                      r"name layers the target lacks \(\[9\]"),
    }
    for path, method, msg in bad.values():
        with pytest.raises(ValueError, match=msg) as e:
            LLM(target, skip_tokenizer_init=True, device="cpu", speculative_config={
                "method": method, "model": path, "num_speculative_tokens": 2})
        assert repr(path) in str(e.value)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(os.path.join(ckpts["eagle"], "config.json"), bin_dir)
    with pytest.raises(ValueError, match="no .safetensors files"):
        LLM(target, skip_tokenizer_init=True, device="cpu", speculative_config={
            "method": "eagle", "model": str(bin_dir), "num_speculative_tokens": 2})
