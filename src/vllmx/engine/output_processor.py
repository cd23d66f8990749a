"""Engine requests → RequestOutputs: detokenization, stop strings, output kinds."""

from __future__ import annotations

from vllmx.engine.request import Request
from vllmx.outputs import CompletionOutput, RequestOutput
from vllmx.sampling_params import RequestOutputKind


class RequestState:
    def __init__(self, request: Request, tokenizer):
        self.request = request
        self.tokenizer = tokenizer
        self.text = ""
        self.sent_tokens = 0
        self.sent_text = 0
        self.stop_str: str | None = None

    def detokenize(self) -> None:
        """Re-decodes the output and checks stop strings on the text that is new."""
        sp = self.request.sampling_params
        if self.tokenizer is None or not sp.detokenize:
            return
        prev = len(self.text)
        text = self.tokenizer.decode(self.request.output_token_ids,
                                     skip_special_tokens=sp.skip_special_tokens)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
            text = text.rstrip("\ufffd")
            prev = min(prev, len(text))
        self.text = text
        if sp.stop and self.stop_str is None:
            longest = max(len(s) for s in sp.stop)
            start = max(0, prev - longest + 1)
            for s in sp.stop:
                idx = self.text.find(s, start)
                if idx >= 0:
                    self.stop_str = s
                    self.text = self.text[: idx + len(s) if sp.include_stop_str_in_output else idx]
                    break


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}

    def add_request(self, request: Request) -> None:
        self.states[request.request_id] = RequestState(request, self.tokenizer)

    def process(self, request: Request) -> tuple[RequestOutput | None, str | None]:
        """The output to hand out for this request now (None for FINAL_ONLY while running),
        and the stop string that matched, if any (the caller finishes the request)."""
        state = self.states[request.request_id]
        state.detokenize()
        finished = request.is_finished() or state.stop_str is not None
        sp = request.sampling_params
        if sp.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None, state.stop_str
        if finished:
            self.states.pop(request.request_id, None)
        token_ids = request.output_token_ids
        text = state.text
        if sp.output_kind == RequestOutputKind.DELTA:
            token_ids = token_ids[state.sent_tokens:]
            text = text[state.sent_text:]
        state.sent_tokens, state.sent_text = len(request.output_token_ids), len(state.text)
        finish_reason = "stop" if state.stop_str is not None else request.get_finished_reason()
        stop_reason = state.stop_str if state.stop_str is not None else request.stop_reason
        completion = CompletionOutput(
            index=0, text=text, token_ids=list(token_ids),
            cumulative_logprob=float(sum(request.output_logprobs)),
            finish_reason=finish_reason, stop_reason=stop_reason)
        return RequestOutput(
            request_id=request.request_id, prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids, prompt_logprobs=None,
            outputs=[completion], finished=finished, metrics=request.metrics), state.stop_str

    def abort(self, request_id: str) -> None:
        self.states.pop(request_id, None)
