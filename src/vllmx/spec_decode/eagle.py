"""EAGLE drafting (vLLM's EagleProposer; methods eagle and eagle3, and mtp, which drafts the same
way from the target's own layer: mtp_proposer.py): a draft head proposes k tokens greedily from
the target's hidden states, which the target verifies in one forward (worker/model_runner.py).

The head's KV cache is one more layer per draft layer in the target's cache (index
num_hidden_layers(target) + j) and blocks, so it is allocated, cached by prefix and freed with
them; the scheduler allocates k lookahead slots past each request's scheduled tokens for the
chained drafts' KV (vLLM's num_lookahead_tokens). After every target step the head runs over the
rows the target kept (its rejected drafts' left out), each with the token after its position:
its KV at those positions follows the target's, and the last row of a request that sampled
proposes draft 1. Drafts 2..k chain, one row per request: the position after, the last draft as
its token, the head's own output in place of the target's hidden state. KV it wrote past a
request's kept tokens is rewritten by the next pass before it is read. Drafts are greedy (a
single proposal), so the target's acceptance rule keeps its output exactly what it is without
speculation.

What the head reads from the target: eagle and mtp its final hidden states, eagle3 the residual
streams entering three of its layers side by side (models/decoder.py keeps them)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from vllmx import ops
from vllmx.config import SpeculativeConfig, VllmxConfig
from vllmx.device import I32, DeviceArray, Uploads
from vllmx.layers.attention import AttentionMetadata
from vllmx.spec_decode.metadata import TargetHiddenStates
from vllmx.worker.input_batch import kv_slots

logger = logging.getLogger("vllmx")

# The draft checkpoints' architectures each method reads (vLLM's names for the same layouts).
EAGLE_ARCHS = {"eagle": ("LlamaForCausalLM", "EagleLlamaForCausalLM"),
               "eagle3": ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLM")}


def eagle_draft_config(spec: SpeculativeConfig) -> tuple[str, dict]:
    """(the draft's directory, its config.json) for method eagle / eagle3; ValueError naming
    the draft where it is not a checkpoint layout vllmx reads."""
    from vllmx.loader.model_source import resolve_model

    path = resolve_model(spec.model)
    what = f"speculative_config method {spec.method!r}: the draft {spec.model!r}"
    if path.endswith(".gguf") or not os.path.exists(os.path.join(path, "config.json")):
        raise ValueError(f"{what} is not a checkpoint directory with a config.json (EAGLE heads "
                         f"load from safetensors)")
    if not any(f.endswith(".safetensors") for f in os.listdir(path)):
        raise ValueError(f"{what} has no .safetensors files (convert a pytorch_model.bin "
                         f"head to safetensors)")
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    archs = cfg.get("architectures") or []
    if not any(a in EAGLE_ARCHS[spec.method] for a in archs):
        raise ValueError(f"{what} has architectures {archs}; method {spec.method!r} reads "
                         f"{', '.join(EAGLE_ARCHS[spec.method])} heads")
    return path, cfg


def check_eagle_draft(spec: SpeculativeConfig, target) -> dict:
    """The draft's config.json, checked against the loaded target (its hidden states feed the
    draft, and the draft's KV layers sit in the target's cache); ValueError naming both."""
    from vllmx.models.decoder import DecoderLM
    from vllmx.models.llama_eagle3 import aux_hidden_state_layers, use_aux_hidden_state

    _, cfg = eagle_draft_config(spec)
    t = target.config
    what = f"speculative_config method {spec.method!r}: the draft {spec.model!r}"
    if t.get("use_mla"):
        raise ValueError(f"{what}: the target's attention is MLA (its KV cache holds latent "
                         f"rows), where an EAGLE head's Llama attention cannot keep its KV")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    mine = {"hidden_size": cfg["hidden_size"], "head_dim": head_dim,
            "num_key_value_heads": cfg.get("num_key_value_heads") or cfg["num_attention_heads"]}
    for key, value in mine.items():
        if value != t[key]:
            raise ValueError(f"{what} has {key} {value}, the target {t[key]}: vllmx runs EAGLE "
                             f"heads of the target's hidden size and KV head layout")
    if cfg.get("target_hidden_size", t["hidden_size"]) != t["hidden_size"]:
        raise ValueError(f"{what} was trained for a target_hidden_size of "
                         f"{cfg['target_hidden_size']}; the target has {t['hidden_size']}")
    if spec.method == "eagle3" and use_aux_hidden_state(cfg):
        if not isinstance(target, DecoderLM) or getattr(target, "is_hybrid", False):
            raise ValueError(f"{what}: EAGLE-3 reads the target's aux hidden states, which "
                             f"{type(target).__name__} does not keep")
        try:
            aux_hidden_state_layers(cfg, t["num_hidden_layers"])
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from e
    return cfg


def eagle_layer_count(spec: SpeculativeConfig) -> int:
    """The KV layers the draft adds to the target's cache: one per draft layer."""
    return int(eagle_draft_config(spec)[1]["num_hidden_layers"])


class EagleProposer:
    def __init__(self, config: VllmxConfig, spec: SpeculativeConfig, target, kv_caches,
                 cache_dtype: int, device: str, act_dtype: int | None = None):
        from vllmx.layers.placement import Placement, placement

        self.k = spec.num_speculative_tokens
        self.max_model_len = config.model_config.max_model_len
        self.block_size = config.cache_config.block_size
        self.kv_caches, self.cache_dtype = kv_caches, cache_dtype
        # On the GPU the draft's weights go where the target's are, and each draft step's host
        # inputs (ids, positions, rows, cache metadata) go up before it runs.
        self.on_gpu = device == "cuda"
        with placement(Placement(device, act_dtype) if self.on_gpu else Placement()):
            self.model = self.load_model(config, spec, target)
        sc = config.scheduler_config
        t, b = sc.max_num_batched_tokens, sc.max_num_seqs
        if self.on_gpu:  # a pass's ids, positions, rows and cache metadata in one copy
            blocks = -(-self.max_model_len // self.block_size)
            self._uploads = Uploads(4 * t + 2 * b + 1 + b * blocks)
        # 0 .. max_num_seqs - 1 where the draft runs: the rows scatter_tokens writes
        self._rows = (DeviceArray.from_numpy(np.arange(b, dtype=np.int32)) if self.on_gpu
                      else np.arange(b, dtype=np.int32))
        self._d2t = None  # draft_id_to_target_id where the draft runs (_greedy)
        logger.info("%s: the draft proposes %d speculative tokens", spec.method, self.k)

    def load_model(self, config: VllmxConfig, spec: SpeculativeConfig, target):
        from vllmx.loader.safetensors import load_safetensors
        from vllmx.models.llama_eagle import EagleLlamaForCausalLM
        from vllmx.models.llama_eagle3 import Eagle3LlamaForCausalLM

        cfg = check_eagle_draft(spec, target)
        path, _ = eagle_draft_config(spec)
        cls = Eagle3LlamaForCausalLM if spec.method == "eagle3" else EagleLlamaForCausalLM
        try:
            model = cls(cfg, load_safetensors(path), target, self.max_model_len)
        except ValueError as e:  # (missing tensors, mismatched shapes: name the draft)
            raise ValueError(f"speculative_config method {spec.method!r}: the draft "
                             f"{spec.model!r}: {e}") from e
        if len(self.kv_caches) < target.config["num_hidden_layers"] + len(model.layers):
            raise RuntimeError(f"{spec.method}: the KV cache has no layers for the draft's")
        target_vocab = target.vocab_size
        d2t = model.draft_id_to_target_id
        if d2t is None and model.vocab_size != target_vocab:
            raise ValueError(f"speculative_config method {spec.method!r}: the draft "
                             f"{spec.model!r} has a vocabulary of {model.vocab_size} tokens and "
                             f"no d2t mapping to the target's {target_vocab}")
        if d2t is not None and (len(d2t) != model.vocab_size or d2t.min() < 0
                                or d2t.max() >= target_vocab):
            raise ValueError(f"speculative_config method {spec.method!r}: the draft "
                             f"{spec.model!r}'s d2t maps {len(d2t)} draft ids (its lm_head "
                             f"has {model.vocab_size}) outside the target's {target_vocab}")
        return model

    def remove_requests(self, req_ids) -> None:
        """(Nothing is kept per request: the draft's KV lives in the request's blocks.)"""

    def _inputs(self, ids, positions, slots, block_table, qsl, seq_lens, *extra,
                max_query_len: int = 0) -> tuple:
        """(ids, positions, AttentionMetadata, *extra) where the draft runs: on the GPU their
        device copies, sent in one queued copy."""
        arrays = [np.asarray(a, dtype=np.int32) for a in (ids, positions, slots, block_table,
                                                          qsl, seq_lens, *extra)]
        if self.on_gpu:
            arrays = self._uploads(*arrays)
        ids, positions, slots, block_table, qsl, seq_lens = arrays[:6]
        md = AttentionMetadata(slots, block_table, qsl, seq_lens, self.kv_caches,
                               self.cache_dtype, max_query_len)
        return (ids, positions, md) + tuple(arrays[6:])

    def propose_from_hidden(self, t: TargetHiddenStates) -> dict[str, list[int]]:
        """Runs the draft over a target step's kept rows; up to k greedy drafts for each
        request that sampled (t.sampled). The chain stays where the draft runs: each draft's
        ids go into the next pass's inputs there (scatter_tokens), and the drafts come to the
        host once, after the last pass (on the GPU one wait for k passes, not k)."""
        ids, positions, md, rows = self._inputs(t.input_ids, t.positions, t.slot_mapping,
                                                t.block_table, t.query_start_loc, t.seq_lens,
                                                t.rows)
        hidden = self.model.combine_hidden_states(ops.gather_rows(t.hidden, rows))
        out = self.model.forward(ids, positions, hidden, md)
        # The sampled token sits at position seq_len, draft j at seq_len + j, and a step that
        # accepts all k samples one more token: below max_model_len (the scheduler's rule).
        ks = np.where(t.sampled, np.minimum(self.k, self.max_model_len - t.seq_lens - 2), 0)
        live = np.flatnonzero(ks > 0)
        if not live.size:
            return {}
        last = t.query_start_loc[1:][live] - 1
        h = ops.gather_rows(out, self._on_device(last))
        tokens = self._greedy(h)
        chain = [(live, tokens)]  # (the requests drafting, their draft) a pass
        pos = t.positions[last]
        bs = self.block_size
        for j in range(1, self.k):
            keep = ks[live] > j
            if not keep.any():
                break
            live, pos = live[keep], pos[keep] + 1
            n = len(live)
            bt = t.block_table[live]
            slots = kv_slots(bt, np.arange(n), pos, bs)
            ids, positions, md, keep_rows = self._inputs(
                np.zeros(n), pos, slots, bt, np.arange(n + 1), pos + 1, np.flatnonzero(keep),
                max_query_len=1)
            ops.scatter_tokens(ids, self._rows[:n], tokens, keep_rows)  # each one's last draft
            h = self.model.forward(ids, positions, ops.gather_rows(h, keep_rows), md)
            tokens = self._greedy(h)
            chain.append((live, tokens))
        drafts: dict[int, list[int]] = {}
        for reqs, toks in chain:
            for i, tok in zip(reqs.tolist(), _host(toks).tolist()):
                drafts.setdefault(i, []).append(tok)
        return {t.req_ids[i]: d for i, d in drafts.items()}

    def _on_device(self, a: np.ndarray):
        """One int32 array where the draft runs."""
        a = np.asarray(a, dtype=np.int32)
        return self._uploads(a)[0] if self.on_gpu else a

    def _greedy(self, h):
        """Each row's draft: the argmax of the head's logits, as a target token id (i32, where
        the logits are: nothing comes to the host)."""
        ids = ops.argmax(self.model.compute_logits(h))
        d2t = self.model.draft_id_to_target_id
        if d2t is None:
            return ids
        if self._d2t is None:  # (the map where the draft runs, once)
            self._d2t = (DeviceArray.from_numpy(d2t.astype(np.int32)) if self.on_gpu
                         else d2t.astype(np.int32))
        out = (DeviceArray.empty(ids.shape, I32) if isinstance(ids, DeviceArray)
               else np.empty_like(ids))
        ops.scatter_tokens(out, self._rows[:len(ids)], self._d2t, ids)  # out[i] = d2t[ids[i]]
        return out


def _host(a) -> np.ndarray:
    return a.numpy() if isinstance(a, DeviceArray) else a
