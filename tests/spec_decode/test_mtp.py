"""mtp speculation (vLLM's method): DeepSeek-V3's and GLM-4.5's own multi-token-prediction layer
drafts from the target's hidden states, the target verifies. Outputs are exactly those without speculation
whatever the drafts (random MTP weights: ~none accepted; weights built to agree with the
target: many), batched == alone through chunked prefill, prefix hits and preemption, seeded
sampling, aborts; the drafts are the argmax of a float64 torch reference of the MTP math on the
same weights; a model without MTP layers is refused by name.

transformers' DeepseekV3ForCausalLM / Glm4MoeForCausalLM hold no MTP weights: the tests write
the layer stored after the last one (model.layers.{N}.*: a decoder layer, enorm / hnorm / eh_proj and
shared_head.norm) into a safetensors file of its own beside the checkpoint."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tests.models.tiny_checkpoints import make_checkpoint
from tests.spec_decode.harness import (
    check_abort_mid_verify,
    check_batched_equal_alone,
    check_drafts_against,
    check_greedy_unchanged,
    check_max_model_len,
    checkpoints_with_mtp,
)

pytest.importorskip("torch")

N = 3  # the tiny deepseek_v3's and glm4_moe's num_hidden_layers: the MTP layer's index
HIDDEN = 64
# The "aligned" checkpoint: the target's attention and MLP outputs scaled down (its residual
# stream stays close to the token's embedding, so its next token is nearly a function of the
# current one) and an MTP layer whose output is that embedding's norm, read through the
# target's final norm and lm_head: its drafts are the target's tokens more often than not.
SCALE = 0.1
FAMILIES = ("deepseek_v3", "glm4_moe")


def _write_mtp_layer(path: str, aligned: bool, seed: int = 0) -> None:
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(seed)
    w = load_file(os.path.join(path, "model.safetensors"))
    out = {}
    for name, t in w.items():  # a decoder layer shaped as the last one (MLA + MoE), random
        if name.startswith(f"model.layers.{N - 1}."):
            out[f"model.layers.{N}." + name.split(".", 3)[3]] = (
                rng.standard_normal(t.shape) * t.std() + t.mean()).astype(np.float32)
    p = f"model.layers.{N}."
    eh = rng.standard_normal((HIDDEN, 2 * HIDDEN)).astype(np.float32) / np.sqrt(HIDDEN)
    out[p + "hnorm.weight"] = rng.normal(1.0, 0.3, HIDDEN).astype(np.float32)
    if aligned:
        def damp(ws):
            return {n: t * SCALE if n.endswith(("o_proj.weight", "down_proj.weight")) else t
                    for n, t in ws.items()}

        w, out = damp(w), damp(out)
        eh[:, :HIDDEN] = np.eye(HIDDEN)
        eh[:, HIDDEN:] *= SCALE
        out[p + "enorm.weight"] = np.ones(HIDDEN, np.float32)
        out[p + "shared_head.norm.weight"] = w["model.norm.weight"].copy()
        save_file(w, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        out[p + "enorm.weight"] = rng.normal(1.0, 0.3, HIDDEN).astype(np.float32)
        out[p + "shared_head.norm.weight"] = rng.normal(1.0, 0.3, HIDDEN).astype(np.float32)
    out[p + "eh_proj.weight"] = eh.astype(np.float32)
    save_file(out, os.path.join(path, "mtp.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    """(family, kind) -> checkpoint: kind "no_mtp" (as transformers writes it), "random",
    "aligned"."""
    return checkpoints_with_mtp(str(tmp_path_factory.mktemp("mtp")), FAMILIES,
                                _write_mtp_layer)


def spec_cfg(k: int = 3) -> dict:
    return {"method": "mtp", "num_speculative_tokens": k}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["random", "aligned"])
def test_greedy_output_is_unchanged(ckpts, family, kind):
    check_greedy_unchanged(ckpts[family, kind], spec_cfg(), kind == "aligned")


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_equal_alone_through_chunks_prefix_hits_and_preemption(ckpts, family):
    """Greedy and seeded requests (drafted) and penalized ones (not), prompts sharing
    prefixes (cache hits: the MTP layer's KV comes with the hit blocks), chunked prefill with
    a small budget and a cache too small for all."""
    stats = check_batched_equal_alone(ckpts[family, "aligned"], spec_cfg(3))
    assert stats.spec_decode_num_accepted_tokens > 0


@pytest.mark.parametrize("k", [1, 4])
def test_requests_running_into_max_model_len(ckpts, k):
    """Requests that end by max_model_len: their drafts stop short of it, and the lookahead
    slots (clamped to it) hold the chained drafts' KV; k = 1 drafts without chaining."""
    stats = check_max_model_len(ckpts["deepseek_v3", "aligned"], spec_cfg(k))
    assert stats.spec_decode_num_accepted_tokens > 0


def test_abort_mid_verify(ckpts):
    check_abort_mid_verify(ckpts["deepseek_v3", "aligned"], spec_cfg())


class _Reference:
    """float64 torch: the target's final-normed hidden states over a prompt, then the MTP
    math on the checkpoint's weights (transformers' DeepseekV3DecoderLayer /
    Glm4MoeDecoderLayer as its decoder layer), chaining k drafts."""

    def __init__(self, path: str):
        import torch
        import transformers as tf
        from safetensors.numpy import load_file
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer

        cfg = tf.AutoConfig.from_pretrained(path)
        cfg._attn_implementation = cfg._experts_implementation = "eager"  # (float64 on the CPU)
        deepseek = cfg.model_type == "deepseek_v3"
        if deepseek:
            cfg.num_key_value_heads = cfg.num_attention_heads  # MLA: k / v per head (repeat_kv)
        self.target = tf.AutoModelForCausalLM.from_pretrained(path, config=cfg,
                                                              dtype=torch.float64).eval()
        w = {n: torch.from_numpy(t).double() for n, t in
             load_file(os.path.join(path, "mtp.safetensors")).items()}
        p = f"model.layers.{N}."
        layer_cls = DeepseekV3DecoderLayer if deepseek else Glm4MoeDecoderLayer
        self.layer = layer_cls(cfg, layer_idx=N).double().eval()
        sd = {n[len(p):]: t for n, t in w.items() if not n[len(p):].startswith(
            ("enorm", "hnorm", "eh_proj", "shared_head", "mlp.experts"))}
        experts = range(cfg.n_routed_experts)
        sd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat(
            [w[f"{p}mlp.experts.{i}.gate_proj.weight"], w[f"{p}mlp.experts.{i}.up_proj.weight"]])
            for i in experts])
        sd["mlp.experts.down_proj"] = torch.stack([w[f"{p}mlp.experts.{i}.down_proj.weight"]
                                                   for i in experts])
        self.layer.load_state_dict(sd)
        self.w = {n[len(p):]: t for n, t in w.items()}
        self.eps = cfg.rms_norm_eps

    def _rms(self, x, name):
        return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * self.w[name]

    def _layer(self, xs):  # the decoder layer over rows 0..len-1 (causal); the last row's out
        import torch

        t = xs.shape[0]
        pos = torch.arange(t)[None]
        cos_sin = self.target.model.rotary_emb(xs[None], pos)
        mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        return self.layer(xs[None], attention_mask=mask, position_ids=pos,
                          position_embeddings=cos_sin)[0, -1]

    def _eh(self, tokens, hidden, positions):
        import torch

        emb = self.target.model.embed_tokens(torch.tensor(tokens))
        emb[torch.tensor(positions) == 0] = 0
        return torch.cat([self._rms(emb, "enorm.weight"), self._rms(hidden, "hnorm.weight")],
                         -1) @ self.w["eh_proj.weight"].T

    def drafts(self, prompt: list[int], sampled: int, k: int):
        """(k drafts after the prompt and its sampled token, the logits of each)."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # (tiny float64 ops: threads only contend, 100x slower)
        try:
            with torch.no_grad():
                return self._drafts(prompt, sampled, k)
        finally:
            torch.set_num_threads(threads)

    def _drafts(self, prompt: list[int], sampled: int, k: int):
        import torch

        n = len(prompt)
        hidden = self.target.model(input_ids=torch.tensor([prompt])).last_hidden_state[0]
        xs = self._eh(prompt[1:] + [sampled], hidden, list(range(n)))
        out = self._layer(xs)
        drafts, logits = [], []
        for j in range(k):
            lg = self._rms(out, "shared_head.norm.weight") @ self.target.lm_head.weight.T
            drafts.append(int(lg.argmax()))
            logits.append(lg.numpy())
            if j + 1 < k:  # the next row: the draft as its token, the output as hidden
                xs = torch.cat([xs, self._eh([drafts[-1]], out[None], [n + j])])
                out = self._layer(xs)
        return drafts, np.array(logits)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["random", "aligned"])
def test_drafts_match_a_float64_reference(ckpts, family, kind):
    """Every draft the engine proposes, after prefills and verify steps (captured ones
    included), for requests batched together, is the argmax of the MTP math in float64 on the
    same weights over the request's tokens so far, and their logits agree: the MTP layer's KV,
    built pass by pass with rejected rows left out and chained rows rewritten, is the one a
    single pass over the sequence gives."""
    check_drafts_against(ckpts[family, kind], spec_cfg(3),
                         lambda: _Reference(ckpts[family, kind]))


def test_mtp_config_errors(ckpts, tmp_path):
    import json

    from vllmx import LLM
    from vllmx.config import SpeculativeConfig

    with pytest.raises(ValueError, match=r"keys \['model'\]"):
        SpeculativeConfig.from_dict({**spec_cfg(), "model": "x"})
    llama = make_checkpoint("qwen3", "float32", str(tmp_path))
    zero = str(tmp_path / "zero")
    shutil.copytree(ckpts["deepseek_v3", "random"], zero)
    with open(os.path.join(zero, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(zero, "config.json"), "w") as f:
        json.dump({**cfg, "num_nextn_predict_layers": 0}, f)
    for path, msg in ((llama, r"\(Qwen3ForCausalLM\) has none that vllmx runs"),
                      (zero, r"\(DeepseekV3ForCausalLM\) has no multi-token-prediction layers"),
                      (ckpts["glm4_moe", "no_mtp"],
                       r"lacks its MTP layer's tensors \(model\.layers\.3\.\*;")):
        with pytest.raises(ValueError, match=msg) as e:
            LLM(path, skip_tokenizer_init=True, device="cpu", speculative_config=spec_cfg())
        assert repr(path) in str(e.value)
