"""The model runner's per-request and per-step state: CachedRequestState (vLLM's name: what the
runner keeps of a scheduled request between steps), the predicates on it that decide how a
step samples it, and PendingStep (a launched step whose tokens are still on their way)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vllmx.core.sched_output import ModelRunnerOutput, TokenLogprobs
from vllmx.layers.sampler import (
    PendingSample,
    RequestSamplingState,
    SamplerOutput,
    SamplingMetadata,
)
from vllmx.lora.request import LoRARequest
from vllmx.sampling_params import SamplingParams

if TYPE_CHECKING:
    from vllmx.structured_output.backend_guidance import GuidanceGrammar
    from vllmx.worker.model_runner import ModelRunner

logger = logging.getLogger("vllmx")


class DraftBackoff:
    """When speculation stops paying for a request: after MISSES verify steps in a row that
    accepted none of its drafts it drafts nothing for `pause` steps (2 at first, doubling to
    MAX_PAUSE while the probe after each pause fails too); an accepted draft resets it. A probe
    verifies one draft, not k: a verify step keeps a draft only if it keeps the first, so one
    row answers whether drafting pays again, at a fifth of the rows (a batch's probes made
    40-row steps of 8-row ones). (One draft after every step that kept none, not only after
    pauses, cost the copy-heavy workload 1.93x -> 1.63x: copy runs resume a step after a
    miss.) Its tokens are the same either way (drafting fewer never changes them); what
    changes is that a request whose drafts keep failing — on the CPU a 5-row verify step costs
    about two decode steps — runs at nearly the speed it has without speculation."""

    MISSES = 4
    MAX_PAUSE = 64

    def __init__(self):
        self.misses, self.pause, self.skip = 0, 2, 0
        self.paused = False  # since its last accepted draft: its next drafts are a probe

    def update(self, accepted: int) -> None:
        """After a verify step with drafts, of which `accepted` were kept."""
        if accepted:
            self.misses, self.pause, self.paused = 0, 2, False
            return
        self.misses += 1
        if self.misses >= self.MISSES:
            self.skip, self.misses = self.pause, self.MISSES - 1  # a failed probe pauses again
            self.pause = min(2 * self.pause, self.MAX_PAUSE)
            self.paused = True

    def max_drafts(self, k: int) -> int:
        """How many of the k drafts proposed for its next step the request verifies."""
        return 1 if self.paused else k

    def drafts_next(self) -> bool:
        """What the next drafts_now() will say (without counting a paused step)."""
        return not self.skip

    def drafts_now(self) -> bool:
        """Whether the request drafts for its next step (called once a step)."""
        if self.skip:
            self.skip -= 1
            return False
        return True


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    num_prompt_tokens: int
    rng_state: np.ndarray
    sampling: RequestSamplingState | None = None  # created at the first sampling step
    grammar: GuidanceGrammar | None = None  # structured output: the request's matcher
    # prompt_logprobs being gathered across prefill chunks: entry i is prompt token i's.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    lora_request: LoRARequest | None = None  # its adapter; None: the base model
    # speculative decoding: when its drafts keep failing, it drafts less
    draft_backoff: DraftBackoff = field(default_factory=DraftBackoff)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def drafts_for(sp: SamplingParams) -> bool:
    """Whether a request's steps verify drafts: those without penalties (a penalized
    request's sampler state counts tokens as they are kept, not per verify row). A constrained
    request's drafts are cut where its grammar stops allowing them, and each of its verify
    rows is masked (or checked) at the grammar's state after the drafts before it."""
    return not sp.has_penalties


def needs_tokens(state: CachedRequestState) -> bool:
    """Whether sampling the request's next token reads its tokens so far on the host
    (penalties, bad words, the min_tokens ban, a grammar's mask): then the step before must be
    finished before this one samples."""
    st = state.sampling
    if state.grammar is not None:
        return True
    return st is not None and (st.penalties or bool(st.bad_words) or (
        len(st.bias_ban_ids) > len(st.bias_ids)
        and state.num_output_tokens <= state.sampling_params.min_tokens))


class PendingStep:
    """A launched step (vLLM's AsyncModelRunnerOutput): get_output() waits for its tokens,
    keeps them in the runner's request states (once) and returns the ModelRunnerOutput."""

    def __init__(self, runner: ModelRunner | None, out: ModelRunnerOutput, **fields):
        self._runner = runner
        self.out = out
        self.sample_ids: list[str] = fields.get("sample_ids", [])
        self.drafts: dict[str, list[int]] = fields.get("drafts", {})
        self.smd: SamplingMetadata | None = fields.get("smd")
        self.sample: PendingSample | None = None  # set by launch_sample
        # req_id -> the row of sample.token_ids holding its (first) new token
        self.sample_rows: dict[str, int] = fields.get("sample_rows", {})
        # For a drafter that reads the target's hidden states: the step's rows ([T, H]) and
        # each request's (req_id, first row, first position, rows scheduled).
        self.hidden = fields.get("hidden")
        self.layout: list[tuple[str, int, int, int]] = fields.get("layout", [])
        # Queues the step's sampling: at once, or where its grammar masks were still being
        # computed when it was launched, at the next step's launch (before its forward) or at
        # get_output().
        self._sample_later = fields.get("sample_later")

    @property
    def done(self) -> bool:
        return self._runner is None

    def launch_sample(self) -> None:
        """Queues the sampling (once). Where it fails (its masks, or the sampler refusing its
        settings), the step's sampled requests fail with that error and the others go on."""
        if self._sample_later is None:
            return
        sample_later, self._sample_later = self._sample_later, None
        try:
            self.sample = sample_later()
        except Exception as e:
            logger.exception("a step's sampling failed")
            for req_id in self.sample_ids:
                self.out.failed[req_id] = f"sampling failed: {type(e).__name__}: {e}"
            n = len(self.smd.temperature)
            self.sample = PendingSample.done(SamplerOutput(
                np.zeros(n, np.int32), np.zeros(n, np.float32), [None] * n))

    def may_draft(self) -> bool:
        """Whether finishing this step may propose drafts (for the step after it): then the
        engine finishes it before scheduling that step, whose drafts they would be. A request
        that speculation's backoff pauses for its next step proposes none, so while every
        request of the batch is paused steps are launched ahead as without speculation."""
        if self._runner is None or self._runner.drafter is None:
            return False
        requests = self._runner.requests
        return any(r in requests and drafts_for(requests[r].sampling_params)
                   and requests[r].draft_backoff.drafts_next() for r in self.sample_ids)

    def get_output(self) -> ModelRunnerOutput:
        if self._runner is not None:
            self.launch_sample()
            runner, self._runner = self._runner, None
            runner._finish(self)
        return self.out
