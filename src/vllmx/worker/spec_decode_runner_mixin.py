"""The model runner's speculative-decoding steps (as vLLM splits its runner into mixins): the
drafts staged after each request's tokens, one sampled row per verified position, the hidden
states a drafter reads (mtp, eagle, eagle3) and the drafts proposed after a step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vllmx.core.sched_output import ModelRunnerOutput
from vllmx.device import DeviceArray
from vllmx.layers.placement import Placement, placement
from vllmx.layers.sampler import SamplingMetadata, advance_rng_states
from vllmx.spec_decode.metadata import TargetHiddenStates
from vllmx.worker.input_batch import kv_slots
from vllmx.worker.step_state import CachedRequestState, PendingStep, drafts_for

if TYPE_CHECKING:
    from vllmx.worker.input_batch import InputBatch


class SpecDecodeModelRunnerMixin:
    """For ModelRunner: reads its drafter, input_batch, requests, device, model, the step
    buffers (input_ids, slot_mapping, block_table) and decode_capture, and writes hidden_out."""

    drafter: object | None
    input_batch: InputBatch
    requests: dict[str, CachedRequestState]

    def keep_hidden_states(self, aux_layers: tuple[int, ...] | None = None,
                           act_dtype: int | None = None) -> None:
        """Keeps every step's hidden states for a drafter that reads them (mtp, eagle): captured
        steps copy theirs out (set before any capture is recorded). aux_layers (eagle3): the
        residual streams entering these layers instead, side by side, which the model's forward
        writes here (captured or not). On the GPU a device array in act_dtype."""
        if self.decode_capture.steps:
            raise RuntimeError("keep_hidden_states: before any step is captured")
        width = self.model.config["hidden_size"] * (len(aux_layers) if aux_layers else 1)
        shape = (len(self.input_ids), width)
        self.hidden_out = (DeviceArray.zeros(shape, act_dtype) if self.device == "cuda"
                           else np.zeros(shape, dtype=np.float32))
        self._aux_hidden = bool(aux_layers)
        if aux_layers:  # (its residual add's unit weight goes where the model runs)
            on = Placement(self.device, act_dtype) if self.device == "cuda" else Placement()
            with placement(on):
                self.model.set_aux_hidden_state_layers(aux_layers, self.hidden_out)

    def _verify(self, state: CachedRequestState, drafts: list[int], rows: range, toks: list[int],
                smd, rejected: dict[str, int], rolled_back: list[tuple[str, int]]) -> range:
        """A request's rows of a finished step kept: each row was sampled as without
        speculation, so a draft is accepted exactly when the target draws it (for drafts that
        are a single proposal, not a distribution, this is the rejection sampler: accepted with
        probability p(draft), else a draw from p without it) and the tokens kept are the ones
        the request gets without speculation, seeded or greedy; then the first token that
        differs. Notes the drafts rejected (rejected), the backoff's count, a hybrid's rollback
        (rolled_back: the drafts accepted) and the generator after the last row kept."""
        m = 0
        while m < len(drafts) and toks[rows[m]] == drafts[m]:
            m += 1
        rows = rows[:m + 1]
        rejected[state.req_id] = len(drafts) - m
        if drafts:
            state.draft_backoff.update(m)
            state.rng_state = smd.rng_state[rows[-1]].copy()
        if m < len(drafts) and self.state_slots is not None:
            rolled_back.append((state.req_id, m))
        return rows

    def _draft_from_hidden(self, layout, hidden, rejected: dict[str, int],
                           failed: dict[str, str]) -> dict[str, list[int]]:
        """A drafter reading the target's hidden states (mtp) runs over each request's rows of
        this step but its rejected drafts' (so that its own KV follows the target's), each row
        with the token after its position; those that sampled a token (in `rejected`) and
        take drafts get them."""
        batch, b = self.input_batch, len(layout)
        rows, slots, ids, positions = [], [], [], []
        qsl, seq_lens = np.zeros(b + 1, np.int32), np.zeros(b, np.int32)
        batch_rows, sampled, req_ids = np.zeros(b, np.int64), np.zeros(b, bool), []
        for req_id, row0, start, n in layout:
            state = self.requests.get(req_id)
            # (With asynchronous scheduling the next step was formed since this one launched:
            # a request it no longer runs, finished or preempted, has no KV to follow.)
            if state is None or req_id in failed or req_id not in batch.req_id_to_index:
                continue
            i = len(req_ids)
            n -= rejected.get(req_id, 0)
            batch_rows[i] = batch.req_id_to_index[req_id]
            rows.append(np.arange(row0, row0 + n, dtype=np.int32))
            # Its slots from its block table (the step's slot_mapping may hold the next step's).
            pos = np.arange(start, start + n, dtype=np.int32)
            slots.append(kv_slots(self.block_table, batch_rows[i], pos, self.block_size)
                         .astype(np.int32))
            positions.append(pos)
            ids.extend(state.token_ids[start + 1:start + n + 1])
            qsl[i + 1], seq_lens[i] = qsl[i] + n, start + n
            sampled[i] = (req_id in rejected and drafts_for(state.sampling_params)
                          and state.draft_backoff.drafts_now())
            req_ids.append(req_id)
        if not req_ids:
            return {}
        b = len(req_ids)
        return self.drafter.propose_from_hidden(TargetHiddenStates(
            req_ids, hidden, np.concatenate(rows), np.asarray(ids, dtype=np.int32),
            np.concatenate(positions), np.concatenate(slots), qsl[:b + 1], seq_lens[:b],
            self.block_table[batch_rows[:b]], sampled[:b]))

    def _propose_drafts(self, step: PendingStep, to_draft: dict[str, np.ndarray],
                        rejected: dict[str, int], out: ModelRunnerOutput) -> None:
        """The next step's drafts into out.spec_token_ids: proposed from the sequences in
        to_draft (ngram, draft_model) or from this step's hidden states (mtp, eagle), cut to
        one for a request's probe after a pause of speculation's backoff (DraftBackoff.
        max_drafts), each constrained request's cut where its grammar stops allowing them."""
        if to_draft:
            out.spec_token_ids.update(self.drafter.propose_batch(to_draft))
        if step.hidden is not None:
            out.spec_token_ids.update(self._draft_from_hidden(step.layout, step.hidden,
                                                              rejected, out.failed))
        for req_id, d in out.spec_token_ids.items():
            state = self.requests.get(req_id)
            if state is not None and len(d) > 1:
                out.spec_token_ids[req_id] = d[:state.draft_backoff.max_drafts(len(d))]
        if self.structured_output_manager is not None:
            self._grammar_drafts(out.spec_token_ids)

    def _stage_drafts(self, drafts: dict[str, list[int]]) -> None:
        """Writes each request's drafts after its tokens in the persistent batch, where the
        step's input ids are read from (not counted as its tokens: the accepted ones are
        appended after the step)."""
        batch = self.input_batch
        for req_id, d in drafts.items():
            if d:
                row = batch.req_id_to_index[req_id]
                n = batch.num_tokens[row]
                batch.token_ids[row, n:n + len(d)] = d

    @staticmethod
    def _sampling_metadata(states: list[CachedRequestState], drafts: list[list[int]],
                           vocab: int) -> SamplingMetadata:
        """One row per sampled position: a request with k drafts has k + 1, the j-th seeing
        its tokens and the first j drafts (what the sequence holds there if they are
        accepted)."""
        if not any(drafts):  # one row per request
            return SamplingMetadata.build(
                [s.sampling_params for s in states], [s.sampling for s in states],
                [s.token_ids for s in states], [s.num_prompt_tokens for s in states],
                [s.rng_state for s in states], vocab)
        rows = [(s, list(d[:j])) for s, d in zip(states, drafts) for j in range(len(d) + 1)]
        # A random row's generator: the request's after the draws of the rows before it.
        rng = [s.rng_state if not d or s.sampling_params.greedy
               else advance_rng_states(s.rng_state, len(d)) for s, d in rows]
        return SamplingMetadata.build(
            [s.sampling_params for s, _ in rows], [s.sampling for s, _ in rows],
            [s.token_ids + d if d else s.token_ids for s, d in rows],
            [s.num_prompt_tokens for s, _ in rows], rng, vocab)
