"""Incremental detokenization and stop-string checks, one request at a time.

Tokens are decoded with `tokenizers`' DecodeStream, primed with the end of the prompt so that
the first generated token keeps its leading space (as vLLM does): text grows by whole UTF-8
characters only, so a character split across tokens appears once it is complete."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from vllmx.sampling_params import SamplingParams


def _prompt_suffix(tokenizer, prompt_ids: list[int]) -> list[int]:
    """The shortest prompt tail (>= 4 tokens) that decodes cleanly, to prime the stream."""
    if len(prompt_ids) <= 4:
        return list(prompt_ids)
    for n in range(4, min(len(prompt_ids), 24) + 1):
        tail = prompt_ids[-n:]
        if "\ufffd" not in tokenizer.decode(tail, skip_special_tokens=False):
            return tail
    return prompt_ids[-4:]


class IncrementalDetokenizer:
    def __init__(self, tokenizer, params: SamplingParams, prompt_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.params = params
        self.output_text = ""
        self.stop_str: str | None = None
        self.enabled = tokenizer is not None and params.detokenize
        # Stop strings may span tokens: hold back what could still be the start of one.
        self.stop_buffer = (max(len(s) for s in params.stop) - 1) if params.stop else 0
        if self.enabled:
            self.backend = tokenizer.backend_tokenizer
            self.stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)
            for tok in _prompt_suffix(tokenizer, prompt_token_ids):
                self._step(tok)

    def _step(self, token_id: int) -> str | None:
        try:
            return self.stream.step(self.backend, token_id)
        except Exception as e:  # invalid prefix after a special token: restart the stream
            if "Invalid prefix" not in str(e):
                raise
            self.stream = DecodeStream(skip_special_tokens=self.params.skip_special_tokens)
            return self.stream.step(self.backend, token_id)

    def update(self, new_token_ids: list[int], num_output_tokens: int) -> str | None:
        """Decodes new tokens and checks stop strings; returns the stop string that matched."""
        if not self.enabled or self.stop_str is not None:
            return None
        prev = len(self.output_text)
        for tok in new_token_ids:
            chunk = self._step(tok)
            if chunk:
                self.output_text += chunk
        sp = self.params
        if sp.stop and num_output_tokens > sp.min_tokens and len(self.output_text) > prev:
            start = max(0, prev - self.stop_buffer)
            best = None
            for s in sp.stop:
                idx = self.output_text.find(s, start)
                if idx >= 0 and (best is None or idx < best[0]):
                    best = (idx, s)
            if best is not None:
                idx, s = best
                self.stop_str = s
                self.output_text = self.output_text[: idx + len(s) if sp.include_stop_str_in_output
                                                    else idx]
        return self.stop_str

    def get_text(self, finished: bool) -> str:
        """The text safe to show: while running, minus what might start a stop string."""
        if finished or not self.stop_buffer or self.stop_str is not None:
            return self.output_text
        return self.output_text[: max(0, len(self.output_text) - self.stop_buffer)]
