"""Engine requests → vLLM's RequestOutputs: incremental detokenization, stop strings,
logprobs with decoded tokens, output kinds (cumulative / delta / final only), and the
aggregation of n > 1 samples of one prompt (a parent request with n children)."""

from __future__ import annotations

from vllmx.core.sched_output import TokenLogprobs
from vllmx.engine.detokenizer import IncrementalDetokenizer
from vllmx.engine.request import Request, RequestStatus
from vllmx.outputs import CompletionOutput, Logprob, RequestOutput
from vllmx.sampling_params import RequestOutputKind, SamplingParams


class ParentRequest:
    """One user request with n > 1: its children are engine requests f"{i}_{request_id}"."""

    def __init__(self, request_id: str, params: SamplingParams):
        self.request_id = request_id
        self.params = params
        self.unfinished: set[str] = set()
        self.final: dict[int, CompletionOutput] = {}

    def child_params(self, index: int) -> SamplingParams:
        from dataclasses import replace

        seed = None if self.params.seed is None else self.params.seed + index
        return replace(self.params, n=1, seed=seed)


class RequestState:
    def __init__(self, request: Request, tokenizer, index: int = 0,
                 parent: ParentRequest | None = None):
        self.request = request
        self.tokenizer = tokenizer
        self.index = index
        self.parent = parent
        self.detokenizer = IncrementalDetokenizer(tokenizer, request.sampling_params,
                                                  request.prompt_token_ids)
        self.num_detokenized = 0
        self.sent_tokens = 0
        self.sent_text = 0
        self.logprobs: list[dict[int, Logprob]] = []
        self.cumulative_logprob = 0.0
        self.prompt_logprobs: list | None = None
        self.prompt_logprobs_sent = False

    def _decode_token(self, token_id: int) -> str | None:
        if self.tokenizer is None or not self.request.sampling_params.detokenize:
            return None
        return self.tokenizer.decode_token(token_id)

    def to_dict(self, lp: TokenLogprobs) -> dict[int, Logprob]:
        ranks = {}
        out: dict[int, Logprob] = {}
        for j, (tok, val) in enumerate(zip(lp.token_ids, lp.logprobs)):
            if tok in out:
                continue
            ranks[tok] = lp.rank if j == 0 else j
            out[tok] = Logprob(val, ranks[tok], self._decode_token(tok))
        return out

    def add_logprobs(self, lps: list[TokenLogprobs] | None,
                     sampled_logprobs: list[float]) -> None:
        """The new tokens' log-probs (several per step with speculative decoding)."""
        if self.request.sampling_params.logprobs is None:
            return
        self.cumulative_logprob += sum(sampled_logprobs)
        for lp in lps or ():
            self.logprobs.append(self.to_dict(lp))

    def set_prompt_logprobs(self, entries: list[TokenLogprobs | None]) -> None:
        self.prompt_logprobs = [None if e is None else self.to_dict(e) for e in entries]


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.parents: dict[str, ParentRequest] = {}

    def add_request(self, request: Request, index: int = 0,
                    parent: ParentRequest | None = None) -> None:
        self.states[request.request_id] = RequestState(request, self.tokenizer, index, parent)
        if parent is not None:
            self.parents[parent.request_id] = parent
            parent.unfinished.add(request.request_id)

    def process(self, request: Request, logprobs: list[TokenLogprobs] | None = None,
                sampled_logprobs: list[float] | None = None,
                prompt_logprobs: list | None = None) -> tuple[RequestOutput | None, str | None]:
        """Takes the request's new token(s) (their logprobs, where asked for, one per token
        the step produced: those past a stop are not kept); returns the output to hand out
        now (None when nothing is due) and the stop string that matched, if any (the caller
        then finishes the request)."""
        state = self.states[request.request_id]
        if prompt_logprobs is not None:
            state.set_prompt_logprobs(prompt_logprobs)
        num_new = request.num_output_tokens - state.num_detokenized
        state.add_logprobs(None if logprobs is None else logprobs[:num_new],
                           (sampled_logprobs or [])[:num_new])
        new_tokens = request.output_token_ids[state.num_detokenized:]
        state.num_detokenized = request.num_output_tokens
        if (request.status == RequestStatus.FINISHED_STOPPED and new_tokens
                and not request.sampling_params.include_stop_str_in_output):
            new_tokens = new_tokens[:-1]  # a stop token (EOS / stop_token_ids) adds no text
        stop_str = state.detokenizer.update(new_tokens, request.num_output_tokens)
        finished = request.is_finished() or stop_str is not None
        if stop_str is not None and not request.is_finished():
            request.stop_reason = stop_str
        return self._make_output(state, finished), stop_str

    def abort(self, request: Request) -> RequestOutput | None:
        """The final output of an aborted request (finish_reason "abort")."""
        state = self.states.get(request.request_id)
        if state is None:
            return None
        return self._make_output(state, True)

    def fail(self, request: Request) -> RequestOutput | None:
        """The final output of a request that failed (finish_reason "error", its error set):
        what it generated so far where its state still renders, else nothing but the error
        (None while a FINAL_ONLY parent waits for its other samples)."""
        state = self.states.get(request.request_id)
        if state is not None:
            try:
                return self._make_output(state, True)
            except Exception:  # noqa: BLE001 - its state is what broke: report it bare
                self.states.pop(request.request_id, None)
        parent = state.parent if state is not None else None
        if parent is not None:
            parent.unfinished.discard(request.request_id)
            if not parent.unfinished:
                self.parents.pop(parent.request_id, None)
        return RequestOutput(
            request_id=parent.request_id if parent is not None else request.request_id,
            prompt=request.prompt, prompt_token_ids=request.prompt_token_ids,
            prompt_logprobs=None,
            outputs=[CompletionOutput(state.index if state is not None else 0, "", [], None,
                                      finish_reason="error")],
            finished=parent is None or not parent.unfinished, metrics=request.metrics,
            error=request.error)

    def _completion(self, state: RequestState, finished: bool) -> CompletionOutput:
        req, sp = state.request, state.request.sampling_params
        text = state.detokenizer.get_text(finished)
        token_ids = req.output_token_ids
        logprobs = state.logprobs if sp.logprobs is not None else None
        if sp.output_kind == RequestOutputKind.DELTA:
            token_ids = token_ids[state.sent_tokens:]
            text = text[state.sent_text:]
            if logprobs is not None:
                logprobs = logprobs[state.sent_tokens:]
        state.sent_tokens = req.num_output_tokens
        state.sent_text = len(state.detokenizer.get_text(finished))
        stop_str = state.detokenizer.stop_str
        finish_reason = ("stop" if stop_str is not None else req.get_finished_reason()) if finished else None
        return CompletionOutput(
            index=state.index, text=text, token_ids=list(token_ids),
            cumulative_logprob=state.cumulative_logprob if sp.logprobs is not None else None,
            logprobs=logprobs, finish_reason=finish_reason,
            stop_reason=(stop_str if stop_str is not None else req.stop_reason) if finished else None)

    def _make_output(self, state: RequestState, finished: bool) -> RequestOutput | None:
        req, sp = state.request, state.request.sampling_params
        if sp.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        completion = self._completion(state, finished)
        if finished:
            self.states.pop(req.request_id, None)
        request_id, outputs, all_finished = req.request_id, [completion], finished
        parent = state.parent
        if parent is not None:
            request_id = parent.request_id
            if finished:
                parent.unfinished.discard(req.request_id)
            all_finished = not parent.unfinished
            if sp.output_kind == RequestOutputKind.FINAL_ONLY:
                parent.final[state.index] = completion
                if not all_finished:
                    return None
                outputs = [parent.final[i] for i in sorted(parent.final)]
            if all_finished:
                self.parents.pop(parent.request_id, None)
        prompt_logprobs = None
        if state.prompt_logprobs is not None and not state.prompt_logprobs_sent:
            prompt_logprobs = state.prompt_logprobs
            if sp.output_kind == RequestOutputKind.DELTA:
                state.prompt_logprobs_sent = True
        elif state.prompt_logprobs is not None and sp.output_kind != RequestOutputKind.DELTA:
            prompt_logprobs = state.prompt_logprobs
        return RequestOutput(
            request_id=request_id, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
            prompt_logprobs=prompt_logprobs, outputs=outputs, finished=all_finished,
            num_cached_tokens=req.num_cached_tokens, metrics=req.metrics, error=req.error)
