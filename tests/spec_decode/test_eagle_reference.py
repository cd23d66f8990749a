"""The drafts of eagle and eagle3 against float64 torch: the target (transformers) gives its final
hidden states (EAGLE-1) or its hidden_states[j], the residual stream entering layer j (EAGLE-3's
aux layers); the head's math (transformers' LlamaAttention and LlamaMLP as its layer) runs over
the request's tokens so far and chains k drafts. Every draft the engine proposes, after prefills
and verify steps (captured ones included), batched, is the reference's argmax and the logits
agree: the head's KV, built pass by pass with rejected rows left out and chained rows
rewritten, is the one a single pass over the sequence gives (harness.check_drafts_against)."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest

from tests.spec_decode.harness import check_drafts_against
from tests.spec_decode.test_eagle import ckpts, spec_cfg  # noqa: F401 - the fixture

pytest.importorskip("torch")


class _Reference:
    def __init__(self, target: str, head: str, method: str):
        import torch
        import transformers as tf
        from safetensors.numpy import load_file
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

        cfg = tf.AutoConfig.from_pretrained(target)
        cfg._attn_implementation = "eager"
        self.target = tf.AutoModelForCausalLM.from_pretrained(target, config=cfg,
                                                              dtype=torch.float64).eval()
        with open(os.path.join(head, "config.json")) as f:
            self.cfg = json.load(f)
        w = {n.replace("midlayer.", "layers.0."): torch.from_numpy(t.astype(np.float64))
             for n, t in load_file(os.path.join(head, "model.safetensors")).items()}
        self.eagle3 = method == "eagle3"
        h = cfg.hidden_size
        self.attns, self.mlps = [], []
        for j in range(self.cfg["num_hidden_layers"]):
            attn_cfg = copy.deepcopy(cfg)
            attn_cfg.head_dim = h // cfg.num_attention_heads
            # (the first layer's q/k/v read 2H in EAGLE-3)
            attn_cfg.hidden_size = 2 * h if self.eagle3 and j == 0 else h
            attn = LlamaAttention(attn_cfg, layer_idx=0).double().eval()
            attn.o_proj = torch.nn.Linear(h, h, bias=False).double()
            mlp = LlamaMLP(cfg).double().eval()
            p = f"layers.{j}."
            attn.load_state_dict({n[len(p) + len("self_attn."):]: t for n, t in w.items()
                                  if n.startswith(p + "self_attn.")})
            mlp.load_state_dict({n[len(p) + len("mlp."):]: t for n, t in w.items()
                                 if n.startswith(p + "mlp.")})
            self.attns.append(attn)
            self.mlps.append(mlp)
        self.w, self.eps = w, cfg.rms_norm_eps
        self.lm_head = w.get("lm_head.weight", self.target.lm_head.weight.detach())
        d2t = w.get("d2t")
        self.d2t = None if d2t is None else (np.arange(len(d2t)) + d2t.numpy().astype(np.int64))

    def _rms(self, x, name):
        return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * self.w[name]

    def _layer(self, xs, residual):
        """The head's layers over rows 0..len-1 (causal): each row's output stream (the first
        layer reads xs as they are, the others their input_layernorm of the stream)."""
        import torch

        t = xs.shape[0]
        pos = torch.arange(t)[None]
        cos_sin = self.target.model.rotary_emb(xs[None], pos)
        mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        out = residual
        for j, (attn, mlp) in enumerate(zip(self.attns, self.mlps)):
            x = xs if j == 0 else self._rms(out, f"layers.{j}.input_layernorm.weight")
            out = out + attn(x[None], position_embeddings=cos_sin, attention_mask=mask)[0][0]
            out = out + mlp(self._rms(out, f"layers.{j}.post_attention_layernorm.weight"))
        return out

    def _rows(self, tokens, hidden):
        """(layer inputs, residuals) of rows: the next tokens and the hidden states."""
        import torch

        embed = self.w.get("embed_tokens.weight", self.target.model.embed_tokens.weight)
        e = embed[torch.tensor(tokens)]
        if self.eagle3:
            normed = self._rms(hidden, "layers.0.hidden_norm.weight")
            x = torch.cat([self._rms(e, "layers.0.input_layernorm.weight"), normed], -1)
            return x, normed if self.cfg.get("norm_before_residual") else hidden
        x = torch.cat([e, hidden], -1) @ self.w["fc.weight"].T
        return x, x

    def drafts(self, prompt: list[int], sampled: int, k: int):
        """(k drafts after the prompt and its sampled token, the logits of each)."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # (tiny float64 ops: threads only contend)
        try:
            with torch.no_grad():
                return self._drafts(prompt, sampled, k)
        finally:
            torch.set_num_threads(threads)

    def _drafts(self, prompt, sampled, k):
        import torch

        out = self.target.model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
        if self.eagle3:
            ids = self.cfg["eagle_aux_hidden_state_layer_ids"]
            hidden = torch.cat([out.hidden_states[j][0] for j in sorted(set(ids))], -1)
            hidden = hidden @ self.w["fc.weight"].T
        else:
            hidden = out.last_hidden_state[0]
        xs, residual = self._rows(prompt[1:] + [sampled], hidden)
        drafts, logits = [], []
        for _ in range(k):
            h = self._layer(xs, residual)[-1]
            lg = (self._rms(h, "norm.weight") if self.eagle3 else h) @ self.lm_head.T
            i = int(lg.argmax())
            drafts.append(i if self.d2t is None else int(self.d2t[i]))
            logits.append(lg.numpy())
            x, r = self._rows([drafts[-1]], h[None])  # the next row: the draft, the output
            xs, residual = torch.cat([xs, x]), torch.cat([residual, r])
        return drafts, np.array(logits)


@pytest.mark.parametrize("kind", ["eagle", "eagle_two_layers", "eagle3", "eagle3_own",
                                  "aligned"])
def test_drafts_match_a_float64_reference(ckpts, kind):  # noqa: F811 - the fixture
    target, spec = spec_cfg(ckpts, kind)
    check_drafts_against(target, spec, lambda: _Reference(target, spec["model"], spec["method"]))


def test_drafts_after_steps_launched_ahead(ckpts):  # noqa: F811 - the fixture
    """With asynchronous scheduling the steps of a paused batch are launched before the last
    one's tokens are back, and the drafter's KV follows them a step late (from a copy of the
    captured hidden states): the drafts after each pause (a random head: its drafts rejected,
    so pauses of 2, 4, 8, ... steps) still match the reference."""
    target, spec = spec_cfg(ckpts, "eagle3")
    check_drafts_against(target, spec, lambda: _Reference(target, spec["model"], spec["method"]),
                         max_tokens=40, async_scheduling=True)
