"""vLLM's SamplingParams: same field names, defaults and validation messages."""

from __future__ import annotations

import logging
import math
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

logger = logging.getLogger("vllmx")

_SAMPLING_EPS = 1e-5  # temperatures below this are greedy
_MAX_TEMP = 1e-2  # smaller positive temperatures are raised to this (vLLM: avoids inf / nan)
# What the native sampler holds: counts and ids are int32, scales float32, seeds int64.
_INT32_MAX = 2**31 - 1
_INT64 = (-(2**63), 2**63 - 1)
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_MIN = 1.401298464324817e-45  # the smallest positive float32


class RequestOutputKind(IntEnum):
    CUMULATIVE = 0  # every output carries everything generated so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """vLLM's structured outputs constraint: exactly one of json (a JSON schema, as a dict or
    its JSON text), regex, choice (the output is one of the strings), grammar (Lark, or GBNF /
    EBNF as llama.cpp writes it), json_object (any JSON object) or structural_tag (vLLM's
    {"structures": [{"begin", "schema", "end"}], "triggers": [...]} as JSON text)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # Options (vLLM's): JSON without free whitespace between tokens; schemas' objects closed
    # where they do not say (additionalProperties false); the whitespace JSON may hold.
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self):
        given = [name for name in _CONSTRAINTS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"You can only use one kind of structured outputs constraint but "
                             f"multiple are specified: {', '.join(given)}")
        if not given:
            raise ValueError("You must use one kind of structured outputs constraint but none "
                             "are specified (json, regex, choice, grammar, json_object or "
                             "structural_tag)")
        if hasattr(self.json, "model_json_schema"):  # a pydantic model class
            self.json = self.json.model_json_schema()
        checks = {"json": lambda v: isinstance(v, (str, dict)),
                  "regex": lambda v: isinstance(v, str),
                  "choice": lambda v: (isinstance(v, (list, tuple)) and len(v) > 0
                                       and all(isinstance(c, str) for c in v)),
                  "grammar": lambda v: isinstance(v, str) and v.strip() != "",
                  "json_object": lambda v: v is True,
                  "structural_tag": lambda v: isinstance(v, str)}
        name = given[0]
        if not checks[name](getattr(self, name)):
            want = {"json": "a JSON schema (dict or JSON text)", "regex": "a string",
                    "choice": "a non-empty list of strings", "grammar": "a non-empty string",
                    "json_object": "true", "structural_tag": "JSON text"}[name]
            raise ValueError(f"structured_outputs.{name} must be {want}, got "
                             f"{getattr(self, name)!r:.200}")
        if self.choice is not None:
            self.choice = list(self.choice)

    @classmethod
    def from_dict(cls, d: dict) -> StructuredOutputsParams:
        """From a request's structured_outputs object; unknown keys are an error."""
        if not isinstance(d, dict):
            raise ValueError(  # noqa: TRY004 - bad request input: a 400, as in vLLM
                f"structured_outputs must be an object, got {type(d).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        if unknown := sorted(set(d) - known):
            raise ValueError(f"structured_outputs has unknown field(s) {unknown}; known: "
                             f"{sorted(known)}")
        return cls(**d)


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None  # removed in vLLM V1: any value other than None/n is an error
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None  # top-k per output token (plus the sampled one); -1: whole vocab
    prompt_logprobs: int | None = None  # the same for every prompt token
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: StructuredOutputsParams | None = None  # vLLM's older name for it
    logit_bias: dict[int, float] | None = None  # token id -> bias, clamped to [-100, 100]
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    # Prompt logprobs need every prompt position computed: a prefix-cache hit must not skip any.
    skip_reading_prefix_cache: bool | None = None
    # Filled by the engine: the model's EOS ids (from generation_config / tokenizer).
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    # Filled by update_from_tokenizer (or directly, without a tokenizer): bad_words as token ids.
    _bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("give structured_outputs or guided_decoding (its older name), "
                                 "not both")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        if not isinstance(self.structured_outputs, (StructuredOutputsParams, type(None))):
            raise ValueError(  # noqa: TRY004 - bad request input: a 400, as in vLLM
                f"structured_outputs must be a StructuredOutputsParams, got "
                f"{type(self.structured_outputs).__name__}")
        if self.truncate_prompt_tokens is not None and (
                self.truncate_prompt_tokens == 0 or self.truncate_prompt_tokens < -1):
            raise ValueError(f"truncate_prompt_tokens must be >= 1 or -1, got "
                             f"{self.truncate_prompt_tokens}")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(
                f"best_of is not supported (vLLM V1 removed it), got best_of={self.best_of}; "
                f"use n to get several outputs")
        if 0 < self.temperature < _MAX_TEMP:
            logger.warning("temperature %s is less than %s, which may cause numerical errors "
                           "nan or inf in tensors. We have maxed it out to %s.",
                           self.temperature, _MAX_TEMP, _MAX_TEMP)
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        self.bad_words = list(dict.fromkeys(self.bad_words or []))
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        if self.top_k == -1:
            self.top_k = 0
        if _is_int(self.top_k) and self.top_k > _INT32_MAX:
            self.top_k = 0  # past any vocabulary: no top-k, as vLLM treats top_k >= vocab
        if self.logit_bias is not None:
            self.logit_bias = _convert_logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:  # a set: repeats would cost every step
            self.allowed_token_ids = list(dict.fromkeys(self.allowed_token_ids))
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:  # greedy: the filters are no-ops
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")
        if self.skip_reading_prefix_cache is None:
            self.skip_reading_prefix_cache = self.prompt_logprobs is not None

    def _verify_args(self) -> None:
        for name in ("n", "top_k", "min_tokens"):
            _check_int(name, getattr(self, name))
        for name in ("max_tokens", "seed", "logprobs", "prompt_logprobs",
                     "truncate_prompt_tokens"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name))
        if not 1 <= self.n <= _INT32_MAX:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.seed is not None and not _INT64[0] <= self.seed <= _INT64[1]:
            raise ValueError(f"seed must be in [{_INT64[0]}, {_INT64[1]}] (int64), got "
                             f"{self.seed}.")
        for name in ("presence_penalty", "frequency_penalty"):
            value = _check_float(name, getattr(self, name))
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}.")
        rp = _check_float("repetition_penalty", self.repetition_penalty)
        if rp <= 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {rp}.")
        if rp > _FLOAT32_MAX or _f32(rp) == 0.0:
            raise ValueError(f"repetition_penalty must be in [{_FLOAT32_MIN:.7g}, "
                             f"{_FLOAT32_MAX:.7g}] (a float32), got {rp}.")
        t = _check_float("temperature", self.temperature)
        if t < 0.0:
            raise ValueError(f"temperature must be non-negative, got {t}.")
        if t > _FLOAT32_MAX:
            raise ValueError(f"temperature must be at most {_FLOAT32_MAX:.7g} (a float32), got "
                             f"{t}.")
        top_p = _check_float("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0 or _f32(top_p) == 0.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= _check_float("min_p", self.min_p) <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.max_tokens is not None and self.max_tokens > _INT32_MAX:
            raise ValueError(f"max_tokens must be at most {_INT32_MAX}, got {self.max_tokens}.")
        if not 0 <= self.min_tokens <= _INT32_MAX:
            raise ValueError(
                f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}.")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not -1 <= k <= _INT32_MAX:
                raise ValueError(f"{name} must be non-negative or -1, got {k}.")
        if (self.truncate_prompt_tokens is not None
                and self.truncate_prompt_tokens > _INT32_MAX):
            raise ValueError(f"truncate_prompt_tokens must be at most {_INT32_MAX}, got "
                             f"{self.truncate_prompt_tokens}")
        if not all(_is_int(t) for t in self.stop_token_ids):
            raise ValueError(
                f"stop_token_ids must contain only integers, got {self.stop_token_ids}.")
        if not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}.")
        if any(not s for s in self.stop):
            raise ValueError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True. "
                             "Set detokenize=True to use stop.")
        if any(not isinstance(w, str) or not w for w in self.bad_words):
            raise ValueError(
                f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}")
        if self.allowed_token_ids is not None:
            if len(self.allowed_token_ids) == 0:
                raise ValueError("allowed_token_ids is not None and empty!")
            if not all(_is_int(t) for t in self.allowed_token_ids):
                raise ValueError(
                    f"allowed_token_ids must contain only integers, got "
                    f"{self.allowed_token_ids}.")

    # -- set up by the engine ------------------------------------------------------------------
    def update_from_tokenizer(self, tokenizer) -> None:
        """Tokenizes bad_words (vLLM's rule: each word as is and with a leading space, the
        latter kept when it gives a different first token and the same length)."""
        if not self.bad_words:
            return
        ids: list[list[int]] = []
        for word in self.bad_words:
            for prefix in ("", " "):
                tokens = list(tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False))
                if not tokens:
                    if not prefix:
                        raise ValueError("bad_words entries must tokenize to at least one token.")
                    continue
                if not prefix or (tokens[0] != ids[-1][0] and len(tokens) == len(ids[-1])):
                    ids.append(tokens)
        self._bad_words_token_ids = ids

    def verify_token_ids(self, vocab_size: int) -> None:
        """Checks every token id the request names (and the logprob counts) against the
        model's vocabulary; ValueError naming the offending ids."""
        def bad(ids):
            return [t for t in ids if not 0 <= t < vocab_size]

        if b := bad(self.stop_token_ids):
            raise ValueError(f"token_id(s) {b} in stop_token_ids contain out-of-vocab token "
                             f"ids. Vocabulary size: {vocab_size}")
        if self.logit_bias and (b := bad(self.logit_bias)):
            raise ValueError(f"token_id(s) {b} in logit_bias contain out-of-vocab token ids. "
                             f"Vocabulary size: {vocab_size}")
        if self.allowed_token_ids is not None and (b := bad(self.allowed_token_ids)):
            raise ValueError(f"allowed_token_ids contains out-of-vocab token id! token_id(s) "
                             f"{b}, vocabulary size: {vocab_size}")
        if self._bad_words_token_ids and (
                b := bad([t for w in self._bad_words_token_ids for t in w])):
            raise ValueError(f"The model vocabulary size is {vocab_size}, but the following "
                             f"tokens were specified as bad: {b}. All token id values should "
                             f"be integers satisfying: 0 <= token_id < {vocab_size}.")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and k > vocab_size:
                what = "sample logprobs" if name == "logprobs" else "prompt logprobs"
                raise ValueError(f"Requested {what} of {k}, which is greater than max "
                                 f"allowed: {vocab_size}")
        if self.top_k >= vocab_size:
            self.top_k = 0  # the whole vocabulary: no top-k (vLLM's rule)

    # -- derived -----------------------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    @property
    def sampling_type(self) -> SamplingType:
        if self.greedy:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        return self._bad_words_token_ids

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value) -> None:
    if not _is_int(value):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__} {value!r}.")


def _check_float(name: str, value) -> float:
    """value as a float; ValueError for non-numbers, NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(  # noqa: TRY004 - vLLM raises ValueError for these
            f"{name} must be a number, got {type(value).__name__} {value!r}.")
    try:
        value = float(value)
    except OverflowError:  # an int past the largest double
        raise ValueError(f"{name} must be a finite number, got {value}.") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}.")
    return value


def _f32(value: float) -> float:
    """value rounded to float32 (what the native sampler sees)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _convert_logit_bias(logit_bias: dict) -> dict[int, float]:
    out: dict[int, float] = {}
    invalid = []
    for token, bias in logit_bias.items():
        try:
            token_id = int(token)
        except (ValueError, TypeError, OverflowError):
            invalid.append(token)
            continue
        # vLLM clamps biases to [-100, 100]; a NaN would poison the row, so it is an error.
        out[token_id] = min(100.0, max(-100.0, _check_float(f"logit_bias[{token!r}]", bias)))
    if invalid:
        raise ValueError(f"logit_bias contains key(s) that cannot be converted to integer "
                         f"token IDs: {invalid!r}")
    return out


@dataclass
class BeamSearchParams:
    """vLLM's BeamSearchParams."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")

    def step_params(self) -> SamplingParams:
        """What each beam's one-token request asks the engine for."""
        return SamplingParams(max_tokens=1, logprobs=2 * self.beam_width,
                              temperature=self.temperature, ignore_eos=True, detokenize=False)
