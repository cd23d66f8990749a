"""Turns a SchedulerOutput into one model forward over a mixed batch of prefill chunks and
decodes, then samples. Per-step inputs are built on the host in persistent, preallocated
buffers (sliced each step; on the GPU they travel in one copy to a persistent device buffer).
Pure decode steps run padded to a batch-size bucket and replay that bucket's capture
(worker/decode_capture.py: CUDA graphs on the GPU, native op tapes on the CPU), so no Python
runs inside such a step's forward.

A step is launched (inputs staged, forward and sampler queued) and finished (its tokens read
and kept) separately: with asynchronous scheduling the engine launches step N + 1 before it
finishes step N, and the tokens step N sampled reach step N + 1's input ids on the device
(scatter_tokens), never passing through the host in between (vLLM's async scheduling)."""

from __future__ import annotations

import logging

import numpy as np

from vllmx import ops
from vllmx.core.sched_output import (
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from vllmx.device import DeviceArray
from vllmx.layers.sampler import (
    RequestSamplingState,
    Sampler,
    advance_rng_states,
    seed_rng_state,
)
from vllmx.worker.input_batch import InputBatch
from vllmx.worker.spec_decode_runner_mixin import SpecDecodeModelRunnerMixin
from vllmx.worker.state_slots import StateSlots
from vllmx.worker.step_inputs_runner_mixin import (
    StepInputsModelRunnerMixin,
    mla_decompressed,
)
from vllmx.worker.step_state import (
    CachedRequestState,
    PendingStep,
    drafts_for,
    needs_tokens,
)
from vllmx.worker.structured_output_runner_mixin import StructuredOutputModelRunnerMixin

logger = logging.getLogger("vllmx")

# Prompt positions whose logits (for prompt_logprobs) are computed at once: bounds the memory.
_PROMPT_LOGITS_CHUNK = 256

class ModelRunner(StepInputsModelRunnerMixin, SpecDecodeModelRunnerMixin,
                  StructuredOutputModelRunnerMixin):
    def __init__(self, model, kv_caches, cache_dtype: int, block_size: int,
                 max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, seed: int,
                 device: str = "cpu", enforce_eager: bool = False,
                 num_speculative_tokens: int = 0):
        self.model = model
        self.device = device
        self.kv_caches = kv_caches
        self.cache_dtype = cache_dtype
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks_per_req = -(-max_model_len // block_size)
        self.requests: dict[str, CachedRequestState] = {}
        self.global_rng = np.random.default_rng(seed)
        self.sampler = Sampler()
        self.drafter = None  # speculative decoding: a proposer (spec_decode/), set by the engine
        self.lora_manager = None  # LoRA: the LoRAModelManager, set by the engine
        # [max tokens, H]: where a captured step leaves its hidden states for a drafter that
        # reads them (keep_hidden_states; a capture's own activations are gone after it).
        self.hidden_out: np.ndarray | None = None
        self._aux_hidden = False  # hidden_out holds eagle3's aux hidden states, not the final
        # structured outputs: makes each constrained request's matcher, fills the masks (set
        # by the engine; None without a tokenizer)
        self.structured_output_manager = None
        t, b = max_num_batched_tokens, max_num_seqs
        self.input_ids = np.zeros(t, dtype=np.int32)
        self.positions = np.zeros(t, dtype=np.int32)
        self.slot_mapping = np.zeros(t, dtype=np.int32)
        self.query_start_loc = np.zeros(b + 1, dtype=np.int32)
        self.seq_lens = np.zeros(b, dtype=np.int32)
        # The running requests' rows persist across steps (worker/input_batch.py); the block
        # table the kernels read is its array.
        self.input_batch = InputBatch(b, max_model_len, block_size)
        # Hybrid models: a recurrent-state slot per running request (worker/state_slots.py).
        # With speculation each also keeps the states after a verify step's positions.
        self.state_slots = (StateSlots(model, b, device == "cuda", num_speculative_tokens, t)
                            if getattr(model, "is_hybrid", False) else None)
        # longrope: (original context, row offset) for requests whose prompt is longer
        self._long_prompt = getattr(getattr(model, "rope", None), "long_prompt_offset", None)
        self.block_table = self.input_batch.block_table
        self._init_step_inputs(t, b, enforce_eager, num_speculative_tokens)
        self._in_flight: PendingStep | None = None  # the last launched step, until finished
        self.async_scheduling = False  # (the engine's: steps may launch before one finishes)
        self._launching = False  # in _launch (steps scheduled before the last one's tokens)
        # Grammar masks started on the StructuredOutputManager's thread (_grammar_masks): on
        # the GPU; on the CPU, whose cores run the forward, in line.
        self.masks_on_thread = device != "cpu"

    def _set_active_loras(self, layout, t: int) -> dict[str, str]:
        """Each row's adapter for the LoRA layers (vLLM's token_lora_mapping); the requests
        whose adapter could not be loaded again, with the error (they fail, the step goes
        on)."""
        ids = np.zeros(t, dtype=np.int32)
        loras = {}
        for req_id, row, _, n in layout:
            lora = self.requests[req_id].lora_request
            if lora is not None:
                ids[row:row + n] = lora.lora_int_id
                loras[lora.lora_int_id] = lora
        bad = self.lora_manager.set_active_loras(ids, loras)
        out = {}
        for req_id, _, _, _ in layout:
            lora = self.requests[req_id].lora_request
            if lora is not None and lora.lora_int_id in bad:
                logger.error("request %s: LoRA adapter %r: %s", req_id, lora.lora_name,
                             bad[lora.lora_int_id])
                out[req_id] = f"LoRA adapter {lora.lora_name!r}: {bad[lora.lora_int_id]}"
        return out

    def _add_request(self, new: NewRequestData) -> None:
        sp = new.sampling_params
        seed = sp.seed if sp.seed is not None else int(self.global_rng.integers(0, 2**63))
        old = self.requests.get(new.req_id)
        rng = old.rng_state if old is not None else seed_rng_state(seed)  # resumed: same stream
        self.requests[new.req_id] = CachedRequestState(
            new.req_id, list(new.token_ids), sp, list(new.block_ids), new.num_computed_tokens,
            new.num_prompt_tokens, rng, lora_request=new.lora_request)

    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.input_batch
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
        if self.state_slots is not None:
            self.state_slots.give_back(so.finished_req_ids | so.preempted_req_ids)
        if self.drafter is not None:  # (a preempted request's drafter state starts over)
            self.drafter.remove_requests(so.finished_req_ids | so.preempted_req_ids)
        for new in so.scheduled_new_reqs:  # new, or resumed after preemption: a fresh row
            self._add_request(new)
            if self.state_slots is not None:
                self.state_slots.take(new.req_id)
            batch.add_request(new.req_id, new.token_ids, new.num_computed_tokens,
                              new.block_ids, self._rope_offset(new.num_prompt_tokens))
        c = so.scheduled_cached_reqs
        rows = batch.req_id_to_index
        for req_id, blocks, computed in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens):
            state = self.requests[req_id]
            state.num_computed_tokens = computed
            row = rows.get(req_id)
            if blocks:
                state.block_ids.extend(blocks)
                if row is not None:
                    batch.append_blocks(req_id, blocks)
            if row is not None:
                batch.num_computed_tokens[row] = computed

    def _form_batch(self, scheduled: list[str], num_scheduled: dict[str, int]) -> list[str]:
        """The persistent batch holds exactly this step's requests (one left out of the last
        step comes back with its row rebuilt from its state), rows [0, n) in run order."""
        batch, keep = self.input_batch, set(scheduled)
        for req_id in [r for r in batch.req_id_to_index if r not in keep]:
            batch.remove_request(req_id)
        for req_id in scheduled:
            if req_id not in batch:
                s = self.requests[req_id]
                batch.add_request(req_id, s.token_ids, s.num_computed_tokens, s.block_ids,
                                  self._rope_offset(s.num_prompt_tokens))
        batch.condense()
        if self._mla_prefill:  # an MLA model's whole prompts last: its prefill takes the tail
            n = batch.num_reqs
            batch.put_last(mla_decompressed(batch.num_computed_tokens[:n], np.array(
                [num_scheduled[r] for r in batch.req_ids[:n]], dtype=np.int64)))
        return batch.req_ids[:batch.num_reqs]

    def _rope_offset(self, num_prompt_tokens: int) -> int:
        """Longrope: a prompt longer than the original context takes the long factors at
        every position (layers/rotary.py), read at an offset in the rope cache."""
        lp = self._long_prompt
        return lp[1] if lp is not None and num_prompt_tokens > lp[0] else 0

    def _prepare_requests(self, req_ids: list[str]) -> dict[str, str]:
        """Each scheduled request's sampler state (built at its first step), request by
        request: one whose state cannot be built is left out of the step and reported failed
        (req_id -> error), so the others run."""
        failed: dict[str, str] = {}
        vocab = self.model.vocab_size
        for req_id in req_ids:
            state = self.requests[req_id]
            if state.sampling is None:
                try:
                    state.sampling = RequestSamplingState(state.sampling_params, vocab)
                    if state.sampling_params.structured_outputs is not None:
                        state.grammar = self._grammar_init(state)
                except Exception as e:
                    logger.exception("request %s: its sampler state failed", req_id)
                    failed[req_id] = f"{type(e).__name__}: {e}"
        return failed

    def execute_model(self, so: SchedulerOutput, non_block: bool = False):
        """Runs the scheduled step: its ModelRunnerOutput, or with non_block the launched
        PendingStep (asynchronous scheduling), whose get_output() the engine calls after it
        has launched the next step."""
        step = self._launch(so)
        return step if non_block else step.get_output()

    def _launch(self, so: SchedulerOutput) -> PendingStep:
        self._launching = True
        try:
            return self._launch_step(so)
        finally:
            self._launching = False

    def _launch_step(self, so: SchedulerOutput) -> PendingStep:
        if self._in_flight is not None:  # its sampling queued before this step's forward
            self._in_flight.launch_sample()
        self._token_fixup = self._logits_rows = None
        self._update_states(so)
        req_ids = list(so.num_scheduled_tokens)
        prev = self._in_flight
        if prev is not None and not prev.done and prev.out.failed:
            # Failed in the step in flight (its sampling, say), which this step was scheduled
            # before: not run again (its blocks are freed once that step's output is taken).
            req_ids = [r for r in req_ids if r not in prev.out.failed]
        failed = self._prepare_requests(req_ids)
        if failed:
            req_ids = [r for r in req_ids if r not in failed]
        req_ids = self._form_batch(req_ids, so.num_scheduled_tokens)
        if not req_ids:
            return PendingStep(None, ModelRunnerOutput([], {}, {}, failed=failed))
        drafts = {r: so.scheduled_spec_decode_tokens.get(r, ()) for r in req_ids}
        # Requests whose last token the step in flight samples: their input id comes from
        # where it was sampled, unless this step has drafts (then the step in flight finishes
        # first). Sampling that reads tokens on the host (penalties, bad words, the min_tokens
        # ban, a grammar's mask) waits for the step in flight only once this step's forward is
        # queued, so on the GPU the forward runs while the host takes those tokens and
        # computes the masks (vLLM's async scheduling with structured outputs).
        pending, finish_prev = {}, False
        if prev is not None and not prev.done:
            on_host = not isinstance(prev.sample.token_ids, DeviceArray)
            if any(drafts.values()) or (on_host and self.device == "cuda"):
                prev.get_output()
            else:
                pending = {r: prev.sample_rows[r] for r in req_ids if r in prev.sample_rows}
                finish_prev = any(needs_tokens(self.requests[r]) for r in req_ids)
        num_scheduled = np.array([so.num_scheduled_tokens[r] for r in req_ids], dtype=np.int32)
        self._stage_drafts(drafts)
        self.input_batch.prepare_inputs(num_scheduled, self.input_ids, self.positions,
                                        self.slot_mapping, self.query_start_loc, self.seq_lens)
        t = 0
        logits_rows: list[int] = []
        sample_ids: list[str] = []  # a request with k drafts samples k + 1 rows
        # (request, first hidden row, prompt positions start .. last - 1) for prompt_logprobs
        prompt_rows: list[tuple[CachedRequestState, int, int, int]] = []
        dst: list[int] = []
        layout = []  # (req_id, first row, first position, rows)
        for req_id, n in zip(req_ids, num_scheduled.tolist()):
            state = self.requests[req_id]
            start = state.num_computed_tokens
            layout.append((req_id, t, start, n))
            end = start + n
            if state.sampling_params.prompt_logprobs is not None and state.num_output_tokens == 0:
                # position p predicts prompt token p + 1
                last = min(end, state.num_prompt_tokens - 1)
                if last > start:
                    prompt_rows.append((state, t, start, last))
            num_tokens = len(state.token_ids)
            if req_id in pending:  # its input at position num_tokens: the one in flight
                dst.append(t + num_tokens - start)
                num_tokens += 1
            t += n
            k = len(drafts[req_id])
            if end == num_tokens + k:  # caught up: this step samples the next token
                logits_rows.extend(range(t - 1 - k, t))
                sample_ids.append(req_id)
        gather = logits_rows and logits_rows != list(range(len(logits_rows)))
        if gather and self.device == "cuda":
            self._logits_rows = np.asarray(logits_rows, dtype=np.int32)
        if pending:
            self._token_fixup = (np.array(dst, dtype=np.int32),
                                 np.fromiter(pending.values(), np.int32, len(pending)),
                                 prev.sample.token_ids)
        nb = len(req_ids)
        if self.lora_manager is not None:
            failed.update(self._set_active_loras(layout, t))
        if self.state_slots is not None and self.state_slots.num_spec:
            self.state_slots.mark_spec_rows(layout, drafts)
        hidden, logits = self._forward(t, nb, t == len(logits_rows) and not prompt_rows)
        out = ModelRunnerOutput(req_ids, {}, {}, failed=failed)
        for state, row, start, last in prompt_rows:
            try:
                self._gather_prompt_logprobs(state, hidden, row, start, last)
            except Exception as e:
                logger.exception("request %s: its prompt logprobs failed", state.req_id)
                failed[state.req_id] = f"{type(e).__name__}: {e}"
        # What the drafter reads: a captured step's copy, or eagle3's aux hidden states.
        draft_hidden = hidden
        if self.hidden_out is not None and (logits is not None or self._aux_hidden):
            draft_hidden = self.hidden_out[:t]
            if self.async_scheduling and sample_ids:
                # The next step may be launched before this one's drafter reads them (a
                # paused batch): a copy, queued before that step's forward overwrites them.
                draft_hidden = ops.copy_of(draft_hidden)
        if not sample_ids:
            if self.hidden_out is not None:  # the drafter's KV follows the prompt chunks
                self._draft_from_hidden(layout, draft_hidden, {}, out.failed)
            return PendingStep(None, out)
        if logits is None:
            if not gather:
                rows = hidden[:len(logits_rows)]  # decode: the first rows, no gather
            elif self.device == "cuda":
                rows = ops.gather_rows(hidden, self._staged_rows)
            else:
                rows = ops.gather_rows(hidden, np.asarray(logits_rows, dtype=np.int32))
            logits = self.model.compute_logits(rows)
        if finish_prev:  # its tokens into the states and matchers this step samples from
            prev.get_output()
        states = [self.requests[r] for r in sample_ids]
        smd = self._sampling_metadata(states, [drafts[r] for r in sample_ids], logits.shape[1])
        masks, constrained, checked = self._grammar_masks(states,
                                                          [drafts[r] for r in sample_ids], smd)
        # Each request's generator after this step, known now: a request without drafts
        # takes one draw if it samples at random (greedy rows none), so the next step may be
        # launched before this one's tokens are back. (With drafts, what is accepted decides.)
        random = smd.temperature > 0
        after = smd.rng_state.copy()
        if random.any():  # (an all-greedy step, speculation's usual one, skips the numpy work)
            after[random] = advance_rng_states(after[random])
        sample_rows, i = {}, 0
        for state in states:
            sample_rows[state.req_id] = i
            k = len(drafts[state.req_id])
            if not k:
                state.rng_state = after[i]
            i += k + 1

        def fail_constrained(e: Exception) -> None:  # (the others go on)
            logger.exception("computing a step's grammar masks failed")
            for req_id in constrained:
                out.failed[req_id] = (f"structured output: computing the grammar masks "
                                      f"failed: {type(e).__name__}: {e}")

        def sample():
            if masks is not None:
                try:
                    smd.grammar_bitmask = masks.result()
                except Exception as e:  # noqa: BLE001 - logged there; those requests fail
                    fail_constrained(e)
                    smd.grammar_rows = None
            pending = self.sampler.launch(logits, smd)
            if checked:  # (the CPU's: sampled already)
                try:
                    self._grammar_check(pending.result(), logits, checked)
                except Exception as e:  # noqa: BLE001 - logged there; those requests fail
                    fail_constrained(e)
            return pending

        step = PendingStep(self, out, sample_ids=sample_ids, drafts=drafts, smd=smd,
                           sample_later=sample, sample_rows=sample_rows,
                           hidden=draft_hidden if self.hidden_out is not None else None,
                           layout=layout)
        if masks is None or masks.done():
            step.launch_sample()
        self._in_flight = step
        return step

    def _finish(self, step: PendingStep) -> None:
        """Takes a launched step's tokens (waiting for them): the accepted ones go into the
        request states and the persistent batch, and into step.out."""
        if self._in_flight is step:
            self._in_flight = None
        out, smd, drafts = step.out, step.smd, step.drafts
        sampled = step.sample.result()
        toks = sampled.sampled_token_ids.tolist()
        lps = sampled.sampled_logprobs.tolist()
        batch = self.input_batch
        # Rows that get one token each, appended at once after the loop (the drafter reads its
        # request's row in the loop, so with one the rows are appended there).
        rows1: list[int] = []
        toks1: list[int] = []
        to_draft: dict[str, np.ndarray] = {}  # the sequences to propose drafts after
        rejected: dict[str, int] = {}  # drafts rejected (their rows left out of the drafter's)
        rolled_back: list[tuple[str, int]] = []  # hybrids: (request, drafts it accepted)
        for req_id in step.sample_ids:
            d = drafts[req_id]
            i = step.sample_rows[req_id]
            rows = range(i, i + len(d) + 1)
            state = self.requests.get(req_id)
            if state is None or req_id in out.failed:  # (finished while the step ran)
                continue
            rows = self._verify(state, d, rows, toks, smd, rejected, rolled_back)
            if state.sampling_params.prompt_logprobs is not None and state.num_output_tokens == 0:
                out.prompt_logprobs[req_id] = (state.prompt_logprobs
                                               or [None] * state.num_prompt_tokens)
                state.prompt_logprobs = None
            new = [toks[r] for r in rows]
            if state.grammar is not None and not state.grammar.accept_tokens(new):
                # Only when the mask left nothing to sample (other settings excluded every
                # token the grammar allows) and the sampler fell back to an unmasked token.
                out.failed[req_id] = (
                    f"structured output: token {new[-1]} does not match the grammar "
                    f"({state.grammar.error}); do allowed_token_ids, logit_bias, bad_words or "
                    f"min_tokens exclude every token it allows?")
                continue
            try:
                forced = self._forced_tokens(step, state, len(new))
            except Exception as e:  # (that request fails, not the engine)
                logger.exception("fast-forwarding a structured output's forced tokens failed")
                out.failed[req_id] = (f"structured output: fast-forwarding the grammar's forced "
                                      f"tokens failed ({type(e).__name__}: {e})")
                continue
            state.token_ids.extend(new)
            state.token_ids.extend(forced)
            row = batch.req_id_to_index.get(req_id)
            if row is not None:
                if len(new) == 1 and self.drafter is None and not forced:
                    rows1.append(row)
                    toks1.append(new[0])
                else:
                    for tok in new + forced:
                        batch.append_token(req_id, tok)
            out.sampled_token_ids[req_id] = new + forced
            # (Only requests without logprobs fast-forward: these values are never shown.)
            out.sampled_logprobs[req_id] = [lps[r] for r in rows] + [0.0] * len(forced)
            if sampled.logprobs[rows[0]] is not None:
                out.logprobs[req_id] = [sampled.logprobs[r] for r in rows]
            if (self.drafter is not None and drafts_for(state.sampling_params)
                    and step.hidden is None and state.draft_backoff.drafts_now()):
                row = batch.req_id_to_index[req_id]
                to_draft[req_id] = batch.token_ids[row, :batch.num_tokens[row]]
        if rolled_back:  # (before the drafter, whose forward runs no mixer, and the next step)
            self.state_slots.rollback(rolled_back)
        self._propose_drafts(step, to_draft, rejected, out)
        if rows1:
            batch.append_tokens(np.array(rows1, dtype=np.int64), np.array(toks1, dtype=np.int32))

    def _gather_prompt_logprobs(self, state: CachedRequestState, hidden: np.ndarray, row: int,
                                start: int, last: int) -> None:
        """Prompt logprobs of tokens start + 1 .. last (from hidden rows row ..)."""
        if state.prompt_logprobs is None:
            state.prompt_logprobs = [None] * state.num_prompt_tokens
        k = state.sampling_params.prompt_logprobs
        for c in range(start, last, _PROMPT_LOGITS_CHUNK):
            e = min(last, c + _PROMPT_LOGITS_CHUNK)
            logits = self.model.compute_logits(hidden[row + c - start:row + e - start])
            targets = np.asarray(state.token_ids[c + 1:e + 1], dtype=np.int32)
            state.prompt_logprobs[c + 1:e + 1] = self.sampler.prompt_logprobs(logits, targets, k)
