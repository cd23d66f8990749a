"""Draft-model drafting (vLLM's draft_model method): a smaller model with the target's vocabulary
proposes k tokens greedily, which the target verifies in one forward (worker/model_runner.py).

The draft model runs on a ModelRunner and a KV cache of its own (its blocks from a KVCacheManager
without prefix caching). It is built in two steps around the target's KV cache: its weights
load first (on the GPU they are then part of what the target's cache is sized after, and the
target sets aside kv_reserve() for the draft's cache), its cache is made after, as large as the
target's plus room for each request's drafts. Each round, for the requests to draft, batched: catch up with each
request's tokens from where the draft's KV still holds them (the target may have rejected some
of the last drafts, and appended its own token), in chunks within the token budget — the step
that completes a request's catch-up samples its first draft — then k - 1 decode steps, one
draft each. Drafts are greedy (a single proposal, not a distribution), so the target's
acceptance rule keeps its output exactly what it is without speculation."""

from __future__ import annotations

import logging

import numpy as np

from vllmx.config import SpeculativeConfig, VllmxConfig
from vllmx.core.kv_cache_manager import KVCacheManager, cdiv
from vllmx.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from vllmx.device import F32
from vllmx.sampling_params import SamplingParams

logger = logging.getLogger("vllmx")

_GREEDY = SamplingParams(temperature=0, ignore_eos=True)


class _DraftRequest:
    """A request as the draft's KV cache manager sees it: the tokens its cache holds."""

    def __init__(self, req_id: str):
        self.request_id = req_id
        self.tokens = np.zeros(0, dtype=np.int32)  # tokens whose KV the draft cache holds
        self.num_computed_tokens = 0

    @property
    def num_tokens(self) -> int:
        return self.num_computed_tokens


class DraftModelProposer:
    def __init__(self, config: VllmxConfig, spec: SpeculativeConfig, target_vocab: int,
                 device: str):
        from vllmx.engine.arg_utils import EngineArgs
        from vllmx.worker.worker_base import create_worker

        self.k = spec.num_speculative_tokens
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        self.max_model_len = mc.max_model_len
        self.block_size = cc.block_size
        # Room for each request's drafts beyond the target's blocks.
        self.extra_blocks = sc.max_num_seqs * cdiv(self.k + 1, cc.block_size)
        args = EngineArgs(model=spec.model, skip_tokenizer_init=True, seed=mc.seed,
                          max_model_len=mc.max_model_len, block_size=cc.block_size,
                          max_num_seqs=sc.max_num_seqs,
                          max_num_batched_tokens=sc.max_num_batched_tokens,
                          enable_prefix_caching=False, device=device,
                          enforce_eager=mc.enforce_eager, dtype=mc.dtype,
                          num_gpu_blocks_override=self.extra_blocks)
        self.draft_config = args.create_engine_config()
        _, self.worker = create_worker(self.draft_config)
        self.worker.load_model()
        if getattr(self.worker.model, "is_hybrid", False):
            raise ValueError(f"the draft model {spec.model!r} is a hybrid (linear attention / "
                             f"state-space layers): its recurrent state cannot follow the "
                             f"target's rejected drafts back; draft with a Transformer model "
                             f"(or the target's mtp layer)")
        vocab = self.worker.model.vocab_size
        if vocab != target_vocab:
            raise ValueError(f"the draft model {spec.model!r} has a vocabulary of {vocab} "
                             f"tokens, the target {target_vocab}: draft_model needs the "
                             f"target's vocabulary")
        self.model_name = spec.model
        self.runner = self.kv = None  # start()
        self.budget = sc.max_num_batched_tokens
        self.requests: dict[str, _DraftRequest] = {}
        self._removed: set[str] = set()  # dropped since the last round (the runner forgets them)

    def kv_reserve(self) -> tuple[int, int]:
        """What the draft's cache takes beside the target's: (bytes a target block brings, as the
        draft holds as many blocks as the target, fixed bytes for the draft-only blocks)."""
        from vllmx.worker.worker_base import kv_block_bytes

        itemsize = 4 if self.worker.kv_dtype() == F32 else 2
        per_block = kv_block_bytes(self.worker.model.config, self.block_size, itemsize)
        return per_block, per_block * self.extra_blocks

    def start(self, target_blocks: int) -> None:
        """The draft's KV cache, as many blocks as the target's (the draft never holds more of a
        request than the target does) plus room for each request's drafts, and its warm-up."""
        num_blocks = target_blocks + self.extra_blocks
        dc = self.draft_config
        dc.cache_config.num_gpu_blocks_override = num_blocks
        dc.scheduler_config.max_model_len = dc.model_config.max_model_len
        self.worker.initialize_kv_cache()
        self.worker.compile_or_warm_up_model()
        self.runner = self.worker.model_runner
        self.kv = KVCacheManager(num_blocks, self.block_size, False, self.max_model_len)
        logger.info("draft model %s: %d speculative tokens", self.model_name, self.k)

    def remove_requests(self, req_ids) -> None:
        """Forgets requests (finished, or preempted: their next draft catches up anew)."""
        for req_id in req_ids:
            d = self.requests.pop(req_id, None)
            if d is not None:
                self.kv.free(d)
                self._removed.add(req_id)

    def propose_batch(self, seqs: dict[str, np.ndarray]) -> dict[str, list[int]]:
        """Up to k greedy draft tokens for each request's token sequence (1-D arrays)."""
        k_of, need = {}, {}
        for req_id, toks in seqs.items():
            k = min(self.k, self.max_model_len - len(toks))
            if k <= 0:
                continue
            d = self.requests.get(req_id)
            if d is None:
                d = self.requests[req_id] = _DraftRequest(req_id)
            # The draft's KV holds d.tokens: keep the prefix the sequence still starts with,
            # and feed at least the last token (whose logits give the first draft).
            m = min(d.num_computed_tokens, len(toks) - 1)
            diff = np.flatnonzero(d.tokens[:m] != toks[:m])
            d.num_computed_tokens = int(diff[0]) if diff.size else m
            if self.kv.allocate_slots(d, len(toks) + k - 1 - d.num_computed_tokens) is None:
                self.remove_requests([req_id])  # no room this round: it catches up next time
                continue
            k_of[req_id], need[req_id] = k, toks
        drafts: dict[str, list[int]] = {r: [] for r in need}
        # The draft's steps are launched back to back: each takes its requests' input ids where
        # the step before sampled them (the runner's asynchronous scheduling), and the host
        # takes a step's tokens once the next one is launched, so on the GPU they run without
        # a wait between them. Every step gives each request it samples one token (a failed
        # step raises), so the steps are known before any token is back.
        launched: list[tuple[list[str], object]] = []  # (requests it samples, the step)

        def launch(new, cached, scheduled, sampled: list[str]) -> None:
            launched.append((sampled, self._step(new, cached, scheduled)))
            while len(launched) > 1:
                self._take(*launched.pop(0), drafts)

        self._catch_up(need, launch)
        # k - 1 decode steps: each feeds the last draft and samples the next.
        for j in range(1, self.k):
            ids = [r for r in need if j < k_of[r]]
            if not ids:
                break
            cached = CachedRequestData()
            for r in ids:
                d = self.requests[r]
                cached.req_ids.append(r)
                cached.new_block_ids.append([])
                cached.num_computed_tokens.append(d.num_computed_tokens)
                d.num_computed_tokens += 1
            launch([], cached, {r: 1 for r in ids}, ids)
        for step in launched:
            self._take(*step, drafts)
        for r, toks in need.items():  # the cache holds the sequence and all drafts but the last
            d = self.requests[r]
            d.tokens = np.concatenate([toks, np.asarray(drafts[r][:-1], dtype=np.int32)])
            d.num_computed_tokens = min(d.num_computed_tokens, len(d.tokens))
        return {r: d for r, d in drafts.items() if d}

    def _catch_up(self, need: dict[str, np.ndarray], launch) -> None:
        """Launches steps over each request's tokens from where its cache ends, within the
        token budget; the step that reaches a request's last token samples its first draft."""
        left = dict(need)
        while left:
            new, scheduled, budget, sampled = [], {}, self.budget, []
            for r, toks in left.items():
                if budget <= 0:
                    break
                d = self.requests[r]
                n = min(len(toks) - d.num_computed_tokens, budget)
                budget -= n
                scheduled[r] = n
                new.append(NewRequestData(r, toks.tolist(), _GREEDY,
                                          list(self.kv.get_block_ids(r)),
                                          d.num_computed_tokens, len(toks)))
                d.num_computed_tokens += n
                if d.num_computed_tokens == len(toks):
                    sampled.append(r)
            for r in sampled:
                del left[r]
            launch(new, CachedRequestData(), scheduled, sampled)

    def _step(self, new, cached, scheduled):
        """The draft's step, launched: its PendingStep (_take gets its output)."""
        so = SchedulerOutput(new, cached, scheduled, sum(scheduled.values()), self._removed,
                             set())
        self._removed = set()
        return self.runner.execute_model(so, non_block=True)

    def _take(self, ids: list[str], step, drafts: dict[str, list[int]]) -> None:
        """A launched draft step's tokens onto the drafts of the requests it sampled."""
        out = step.get_output()
        if out.failed:
            raise RuntimeError(f"the draft model's step failed: {out.failed}")
        for r in ids:
            drafts[r].extend(out.sampled_token_ids.get(r, ()))
