"""Multi-token-prediction drafting (vLLM's mtp method): the target checkpoint's own MTP layer
(models/mtp.py) proposes k tokens greedily from the target's hidden states, which the
target verifies in one forward (worker/model_runner.py).

Its KV cache is one more layer of the target's (index num_hidden_layers) in the target's
blocks, so it is allocated, cached by prefix and freed with them; the scheduler allocates k
lookahead slots past each request's scheduled tokens for the chained drafts' KV (vLLM's
num_lookahead_tokens). After every target step the layer runs over the rows the target kept
(its rejected drafts' left out), each with the token after its position: its KV at those
positions follows the target's, and the last row of a request that sampled proposes draft 1.
Drafts 2..k chain, one row per request: the position after, the last draft as its token, the
layer's own output in place of the target's hidden state. The first MTP layer drafts every
step (the released checkpoints have one); KV it wrote past a request's kept tokens is rewritten
by the next pass before it is read. Drafts are greedy (a single proposal), so the target's
acceptance rule keeps its output exactly what it is without speculation."""

from __future__ import annotations

import logging

import numpy as np

from vllmx import ops
from vllmx.config import ModelConfig, SpeculativeConfig, VllmxConfig
from vllmx.layers.attention import AttentionMetadata
from vllmx.spec_decode.metadata import TargetHiddenStates

logger = logging.getLogger("vllmx")

# Architectures whose checkpoints store MTP layers past the last decoder layer, and vllmx runs.
MTP_ARCHS = ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM")


def mtp_layer_count(mc: ModelConfig) -> int:
    """The KV layers MTP drafting adds to the target's cache (one: the first MTP layer drafts
    every step); ValueError naming the model where it has no MTP layer vllmx can run."""
    archs = mc.architectures or [mc.hf_config.get("gguf_architecture") or "unknown"]
    what = f"{mc.model!r} ({', '.join(archs)})"
    num = mc.hf_config.get("num_nextn_predict_layers")
    if not any(a in MTP_ARCHS for a in archs):
        raise ValueError(f"speculative_config method 'mtp' drafts with the target's own "
                         f"multi-token-prediction layers; {what} has none that vllmx runs "
                         f"(MTP architectures: {', '.join(MTP_ARCHS)})")
    if not num:
        raise ValueError(f"speculative_config method 'mtp': {what} has no multi-token-"
                         f"prediction layers (num_nextn_predict_layers = {num!r})")
    if mc.is_gguf or mc.load_format == "dummy":
        raise ValueError(f"speculative_config method 'mtp' reads the MTP layer from the "
                         f"safetensors checkpoint; {what} is "
                         f"{'a GGUF file' if mc.is_gguf else 'load_format=dummy'}")
    return 1


class MTPProposer:
    def __init__(self, config: VllmxConfig, spec: SpeculativeConfig, target, kv_caches,
                 cache_dtype: int, device: str):
        from vllmx.loader.safetensors import load_safetensors
        from vllmx.models.mtp import MultiTokenPredictorLayer

        if device != "cpu":
            raise ValueError("speculative_config method 'mtp' runs on the CPU so far (as the "
                             "models that carry MTP layers do); use device='cpu'")
        mc = config.model_config
        mtp_layer_count(mc)
        n = target.config["num_hidden_layers"]
        weights = load_safetensors(mc.path)
        if f"model.layers.{n}.eh_proj.weight" not in weights:
            raise ValueError(f"speculative_config method 'mtp': {mc.model!r} lacks its MTP "
                             f"layer's tensors (model.layers.{n}.*; num_nextn_predict_layers "
                             f"says it has one, but the checkpoint was saved without it)")
        self.model = MultiTokenPredictorLayer(target, weights)
        del weights
        if len(kv_caches) <= self.model.layer_idx:
            raise RuntimeError("mtp: the KV cache has no layer for the MTP layer")
        self.k = spec.num_speculative_tokens
        self.max_model_len = mc.max_model_len
        self.block_size = config.cache_config.block_size
        self.kv_caches, self.cache_dtype = kv_caches, cache_dtype
        logger.info("mtp: layer %d drafts %d speculative tokens", n, self.k)

    def remove_requests(self, req_ids) -> None:
        """(Nothing is kept per request: the MTP layer's KV lives in the request's blocks.)"""

    def propose_from_hidden(self, t: TargetHiddenStates) -> dict[str, list[int]]:
        """Runs the MTP layer over a target step's kept rows; up to k greedy drafts for each
        request that sampled (t.sampled)."""
        md = AttentionMetadata(t.slot_mapping, t.block_table, t.query_start_loc, t.seq_lens,
                               self.kv_caches, self.cache_dtype)
        out = self.model.forward(t.input_ids, t.positions, ops.gather_rows(t.hidden, t.rows),
                                 md)
        # The sampled token sits at position seq_len, draft j at seq_len + j, and a step that
        # accepts all k samples one more token: below max_model_len (the scheduler's rule).
        ks = np.where(t.sampled, np.minimum(self.k, self.max_model_len - t.seq_lens - 2), 0)
        live = np.flatnonzero(ks > 0)
        if not live.size:
            return {}
        last = t.query_start_loc[1:][live] - 1
        h = ops.gather_rows(out, last)
        tokens = self._greedy(h)
        drafts = {int(i): [int(tok)] for i, tok in zip(live, tokens)}
        pos = t.positions[last]
        bs = self.block_size
        for j in range(1, self.k):
            keep = ks[live] > j
            if not keep.any():
                break
            live, tokens, pos = live[keep], tokens[keep], pos[keep] + 1
            h = ops.gather_rows(h, np.flatnonzero(keep))
            n = len(live)
            bt = t.block_table[live]
            slots = bt[np.arange(n), pos // bs] * bs + pos % bs
            md = AttentionMetadata(slots.astype(np.int32), bt, np.arange(n + 1, dtype=np.int32),
                                   (pos + 1).astype(np.int32), self.kv_caches,
                                   self.cache_dtype, max_query_len=1)
            h = self.model.forward(tokens, pos, h, md)
            tokens = self._greedy(h)
            for i, tok in zip(live, tokens):
                drafts[int(i)].append(int(tok))
        return {t.req_ids[i]: d for i, d in drafts.items()}

    def _greedy(self, h: np.ndarray) -> np.ndarray:
        return np.argmax(self.model.compute_logits(h), axis=1).astype(np.int32)
