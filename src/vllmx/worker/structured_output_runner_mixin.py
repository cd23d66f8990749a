"""The model runner's structured-output steps (as vLLM splits its runner into mixins): each
constrained request's matcher, the batch's grammar masks for a step, and the tokens a grammar
forces, fast-forwarded after a step's token."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from vllmx.layers.sampler import SamplingMetadata, advance_rng_states
from vllmx.worker.step_state import CachedRequestState, PendingStep

if TYPE_CHECKING:
    from vllmx.structured_output import StructuredOutputManager
    from vllmx.structured_output.backend_guidance import GuidanceGrammar


class StructuredOutputModelRunnerMixin:
    """For ModelRunner: reads its structured_output_manager, masks_on_thread, max_model_len
    and the launch state (_in_flight, _launching)."""

    structured_output_manager: StructuredOutputManager | None
    masks_on_thread: bool
    max_model_len: int
    _in_flight: PendingStep | None
    _launching: bool

    def _grammar_init(self, state: CachedRequestState) -> GuidanceGrammar:
        """The request's matcher, advanced over the output it already has (a request resumed
        after preemption starts a fresh state)."""
        if self.structured_output_manager is None:
            raise ValueError("structured outputs need a tokenizer")
        grammar = self.structured_output_manager.grammar_init(
            state.sampling_params.structured_outputs, state.token_ids[:state.num_prompt_tokens])
        if not grammar.accept_tokens(state.token_ids[state.num_prompt_tokens:]):
            raise ValueError(f"structured output: the output so far does not match the "
                             f"grammar ({grammar.error})")
        return grammar

    def _grammar_masks(self, states: list[CachedRequestState], drafts: list[list[int]],
                       smd: SamplingMetadata) -> tuple[Future | None, list[str]]:
        """The constrained requests' masks for this step (each has one row: never drafted),
        now that their last tokens are in their matchers. On the GPU they are computed on
        llguidance's threads, started from the manager's thread so that the host does not
        wait for them: the step's sampling does (PendingStep.launch_sample), and they are
        computed while the engine takes the last step's outputs and schedules the next one,
        with this step's forward running. On the CPU, whose cores run the next forward, one
        row after another here (see StructuredOutputManager.grammar_bitmask), the Future done.
        Also the ids of the requests masked (those a failure of the masks fails); (None, [])
        where no row is constrained."""
        grammars, rows, constrained = [], [], []
        i = 0
        for state, d in zip(states, drafts):
            if state.grammar is not None and state.grammar.active:  # not still reasoning
                grammars.append(state.grammar)
                rows.append(i)
                constrained.append(state.req_id)
            i += 1 + len(d)
        if not grammars:
            return None, []
        smd.grammar_rows = np.array(rows, dtype=np.int32)
        manager = self.structured_output_manager
        masks = Future()
        try:
            if self.masks_on_thread:
                return manager.grammar_bitmask_async(grammars), constrained
            masks.set_result(manager.grammar_bitmask(grammars, parallel=False))
        except Exception as e:  # noqa: BLE001 - the step's sampling fails with it (launch_sample)
            masks.set_exception(e)
        return masks, constrained

    def _forced_tokens(self, step: PendingStep, state: CachedRequestState,
                       num_new: int) -> list[int]:
        """Structured outputs' fast-forward: the tokens the request's grammar forces after
        this step's (a JSON schema's next key, a regex's literal text), appended to its
        output unsampled; the next step computes their KV together with the token after them,
        which it samples, as a prefill chunk would. Any sampling would have picked them, and
        a random request's generator takes the one draw a step each would have taken, so
        greedy and seeded outputs are those without it. Not for requests that return logprobs
        (none are computed for these tokens) or whose allowed_token_ids / bad_words could ban
        the one token the grammar allows (then its sampling fails the request), nor while a
        later step is scheduled (asynchronous scheduling: the scheduler counted one token from
        this step, and a step launched from it reads that token alone); within max_tokens and
        max_model_len; stop ids are sampled (min_tokens bans them)."""
        grammar, sp = state.grammar, state.sampling_params
        if (grammar is None or not grammar.active or sp.logprobs is not None
                or sp.allowed_token_ids or sp.bad_words):
            return []
        if self._launching or (self._in_flight is not None and self._in_flight is not step):
            return []
        n = len(state.token_ids) + num_new
        limit = self.max_model_len - n
        if sp.max_tokens is not None:
            limit = min(limit, sp.max_tokens - (n - state.num_prompt_tokens))
        forced = grammar.fast_forward(limit, sp.stop_token_ids or ())  # (EOS: the grammar's)
        if forced and not sp.greedy:
            state.rng_state = advance_rng_states(state.rng_state, len(forced))
        return forced
