"""Beam search as vLLM V1 runs it: above the engine, by steps of one token. Each step asks the
engine for every live beam's next-token log-probs (one request a beam, max_tokens=1,
logprobs=2 * beam_width: the prefix cache holds the beams' shared tokens), extends each beam by
each of those tokens, moves the beams that ended with EOS to the finished ones, and keeps the
beam_width best of the rest by vLLM's score (cumulative log-prob / length ** length_penalty,
the prompt counted in the length, a final EOS not). After max_tokens steps the live beams join
the finished ones and the beam_width best of all are the answer.

BeamSearch holds one prompt's search as a state machine (`pending` -> engine -> `advance`), so
LLM.beam_search (the engine stepped in this thread) and AsyncLLM.beam_search (the server) drive
the same rule."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllmx.outputs import Logprob
from vllmx.sampling_params import BeamSearchParams


@dataclass
class BeamSearchSequence:
    """A beam: the prompt's and its own tokens, each generated position's log-probs, their sum."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (ended with EOS) | "length"


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


def get_beam_search_score(tokens: list[int], cumulative_logprob: float,
                          eos_token_id: int | None, length_penalty: float = 1.0) -> float:
    """vLLM's beam score: the cumulative log-prob over the sequence's length (prompt included,
    a final EOS not) to the power length_penalty."""
    seq_len = len(tokens)
    if eos_token_id is not None and tokens[-1] == eos_token_id:
        seq_len -= 1
    return cumulative_logprob / (seq_len ** length_penalty)


class BeamSearch:
    """One prompt's search: `pending()` lists the beams whose next token to ask for (empty once
    done), `advance()` takes the engine's log-probs for them, `result()` the best beams."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams,
                 eos_token_ids: set[int], max_model_len: int):
        self.prompt_len = len(prompt_token_ids)
        self.params = params
        self.eos = set() if params.ignore_eos else set(eos_token_ids)
        # No step may take a beam past the context (its request would be refused).
        self.steps_left = min(params.max_tokens, max_model_len - self.prompt_len)
        self.live = [BeamSearchSequence(list(prompt_token_ids))]
        self.finished: list[BeamSearchSequence] = []

    def _score(self, beam: BeamSearchSequence) -> float:
        eos = beam.tokens[-1] if beam.finish_reason == "stop" else None
        return get_beam_search_score(beam.tokens, beam.cum_logprob, eos,
                                     self.params.length_penalty)

    def pending(self) -> list[list[int]]:
        return [b.tokens for b in self.live] if self.steps_left > 0 and self.live else []

    def advance(self, step_logprobs: list[dict[int, Logprob]]) -> None:
        """step_logprobs[i]: the next-token log-probs (the sampled token and the top
        2 * beam_width) of pending()[i]."""
        extended = []
        for beam, top in zip(self.live, step_logprobs):
            for token, lp in top.items():
                new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [top],
                                         beam.cum_logprob + lp.logprob)
                if token in self.eos:
                    new.finish_reason = "stop"
                    self.finished.append(new)
                else:
                    extended.append(new)
        extended.sort(key=self._score, reverse=True)
        self.live = extended[:self.params.beam_width]
        self.steps_left -= 1

    def result(self, decode=None) -> list[BeamSearchSequence]:
        """The beam_width best beams, best first; texts by decode(generated ids) where given
        (a final EOS left out of the text unless include_stop_str_in_output)."""
        for beam in self.live:
            beam.finish_reason = "length"
        best = sorted(self.finished + self.live, key=self._score,
                      reverse=True)[:self.params.beam_width]
        if decode is not None:
            for beam in best:
                ids = beam.tokens[self.prompt_len:]
                if (beam.finish_reason == "stop" and ids
                        and not self.params.include_stop_str_in_output):
                    ids = ids[:-1]
                beam.text = decode(ids)
        return best
