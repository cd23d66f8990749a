"""The model runner's structured-output steps (as vLLM splits its runner into mixins): each
constrained request's matcher, the batch's grammar masks for a step, and the tokens a grammar
forces, fast-forwarded after a step's token."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from vllmx import ops
from vllmx.layers.sampler import SamplerOutput, SamplingMetadata, advance_rng_states
from vllmx.worker.step_state import CachedRequestState, PendingStep

if TYPE_CHECKING:
    from vllmx.structured_output import StructuredOutputManager
    from vllmx.structured_output.backend_guidance import GuidanceGrammar


class StructuredOutputModelRunnerMixin:
    """For ModelRunner: reads its structured_output_manager, masks_on_thread, max_model_len,
    requests and the launch state (_in_flight, _launching)."""

    structured_output_manager: StructuredOutputManager | None
    masks_on_thread: bool
    requests: dict[str, CachedRequestState]
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
                       smd: SamplingMetadata) -> tuple[Future | None, list[str], list]:
        """The constrained requests' masks for this step, now that their last tokens are in
        their matchers: one a sampled row, a request with drafts having one more a draft (the
        grammar's state after the drafts before it). On the GPU they are computed on
        llguidance's threads, started from the manager's thread so that the host does not
        wait for them: the step's sampling does (PendingStep.launch_sample), and they are
        computed while the engine takes the last step's outputs and schedules the next one,
        with this step's forward running. On the CPU, whose cores run the next forward, one
        row after another here (see StructuredOutputManager.grammar_bitmask), the Future done;
        and a greedy request that returns no logprobs gets none at all: its tokens are checked
        after sampling instead (_grammar_check). Also the ids of the requests masked or checked
        (those a failure of either fails), and the checked requests as (first row, grammar,
        drafts); None for the Future where no row is masked."""
        grammars, masked_drafts, rows, constrained, checked = [], [], [], [], []
        i = 0
        for state, d in zip(states, drafts):
            grammar = state.grammar
            if grammar is not None and grammar.active:  # (not while still reasoning)
                constrained.append(state.req_id)
                if (not self.masks_on_thread and smd.temperature[i] == 0
                        and smd.num_logprobs[i] < 0):
                    checked.append((i, grammar, d))
                else:
                    grammars.append(grammar)
                    masked_drafts.append(d)
                    rows.extend(range(i, i + 1 + len(d)))
            i += 1 + len(d)
        if not grammars:
            return None, constrained, checked
        smd.grammar_rows = np.array(rows, dtype=np.int32)
        manager = self.structured_output_manager
        masks = Future()
        try:
            if self.masks_on_thread:
                return (manager.grammar_bitmask_async(grammars, masked_drafts), constrained,
                        checked)
            masks.set_result(manager.grammar_bitmask(grammars, masked_drafts, parallel=False))
        except Exception as e:  # noqa: BLE001 - the step's sampling fails with it (launch_sample)
            masks.set_exception(e)
        return masks, constrained, checked

    def _grammar_check(self, sampled: SamplerOutput, logits: np.ndarray,
                       checked: list[tuple[int, GuidanceGrammar, list[int]]]) -> None:
        """The CPU's greedy constrained rows, sampled without a mask: each token the grammar
        allows is the one the mask would have given too (the argmax over all tokens, if
        allowed, is the argmax over the allowed ones; the logits processors keep -inf where
        the mask put it, so masking before or after them picks the same), and for the rest
        the mask is computed and the row sampled again over what it allows. With drafts, row
        by row as verification goes (each at the grammar's state after the drafts accepted
        before it), up to the first row whose token is not its draft. A model that follows its
        constraint mostly skips the mask (the [a-z ]{600} regex's masks take ~10 ms a step for
        32 rows of SmolLM2, its checks ~0.1). In place over sampled (ids and their log-probs,
        which such rows never show); logits: the step's, as the sampler left them (its
        processors applied)."""
        ids = sampled.sampled_token_ids
        for row, g, d in checked:
            cur, j = g, 0  # (drafts accepted are consumed by a copy: GuidanceGrammar.copy)
            while True:
                r = row + j
                if not cur.allows(int(ids[r])):
                    ids[r], sampled.sampled_logprobs[r] = self._masked_greedy(logits[r], cur)
                if j == len(d) or int(ids[r]) != d[j]:
                    break
                cur = cur.copy() if cur is g else cur
                if not cur.matcher.consume_token(d[j]):
                    raise RuntimeError(f"structured output: a draft the grammar allowed was "
                                       f"refused ({cur.error})")
                j += 1

    def _masked_greedy(self, logits_row: np.ndarray, grammar) -> tuple[int, float]:
        """The greedy token of one row of logits under the grammar's mask, and its log-prob."""
        again = np.array(logits_row, dtype=np.float32, copy=True)[None]
        ops.apply_token_bitmask(again, self.structured_output_manager.grammar_bitmask(
            [grammar], parallel=False))
        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        ids, lps = ops.sample(again, zero, np.zeros(1, np.int32), one, zero,
                              np.zeros((1, 2), np.uint64))
        return int(ids[0]), float(lps[0])

    def _grammar_drafts(self, spec_token_ids: dict[str, list[int]]) -> None:
        """A constrained request's drafts cut where its grammar stops allowing them (in place):
        its verify rows then each have a state to be masked at."""
        for req_id, d in spec_token_ids.items():
            state = self.requests.get(req_id)
            if state is not None and state.grammar is not None and d:
                del d[state.grammar.draft_prefix(d):]

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
        this step, and a step launched from it reads that token alone), nor after a step that
        verified the request's drafts; within max_tokens and max_model_len; stop ids are
        sampled (min_tokens bans them)."""
        grammar, sp = state.grammar, state.sampling_params
        if (grammar is None or not grammar.active or sp.logprobs is not None
                or sp.allowed_token_ids or sp.bad_words):
            return []
        if self._launching or (self._in_flight is not None and self._in_flight is not step):
            return []
        # The scheduler takes a verify step's tokens as accepted drafts + 1 (rejections are
        # counted from them), so a step that verified drafts appends nothing more.
        if step.drafts.get(state.req_id):
            return []
        n = len(state.token_ids) + num_new
        limit = self.max_model_len - n
        if sp.max_tokens is not None:
            limit = min(limit, sp.max_tokens - (n - state.num_prompt_tokens))
        forced = grammar.fast_forward(limit, sp.stop_token_ids or ())  # (EOS: the grammar's)
        if forced and not sp.greedy:
            state.rng_state = advance_rng_states(state.rng_state, len(forced))
        return forced
