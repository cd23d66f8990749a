"""What completions and chat share (vLLM's OpenAIServing): the model check, the request ->
SamplingParams mapping, the context-length check, and running one or more engine requests
with their outputs merged and their metrics recorded."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from http import HTTPStatus

from vllmx.outputs import RequestOutput
from vllmx.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from vllmx.server.errors import OpenAIError
from vllmx.server.metrics import ServerMetrics
from vllmx.server.structured_outputs import structured_outputs_of

logger = logging.getLogger("vllmx")

_PARAM_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
# Neutral values: a field SamplingParams lacks may be dropped only when the request leaves it so.
_NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
            "min_tokens": 0, "include_stop_str_in_output": False, "ignore_eos": False,
            "skip_special_tokens": True, "spaces_between_special_tokens": True, "top_k": 0,
            "min_p": 0.0, "bad_words": []}


def random_uuid() -> str:
    return uuid.uuid4().hex


class OpenAIServing:
    def __init__(self, engine_client, served_model_names: list[str], metrics: ServerMetrics,
                 log_requests: bool = True, return_tokens_as_token_ids: bool = False,
                 enable_prompt_tokens_details: bool = False,
                 enable_per_request_metrics: bool = False,
                 enable_force_include_usage: bool = False,
                 system_fingerprint: str | None = None):
        self.engine_client = engine_client
        self.return_tokens_as_token_ids = return_tokens_as_token_ids
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        self.enable_per_request_metrics = enable_per_request_metrics
        self.enable_force_include_usage = enable_force_include_usage
        self.system_fingerprint = system_fingerprint
        self.served_model_names = served_model_names
        self.metrics = metrics
        self.log_requests = log_requests
        mc = self.model_config = engine_client.model_config
        self.max_model_len = mc.max_model_len  # the KV cache holds at least this (checked)
        self.default_sampling = {k: mc.gen_config[k] for k in
                                 ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
                                 if mc.gen_config.get(k) is not None}
        self.default_max_tokens = mc.gen_config.get("max_new_tokens")

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
              stream: bool = False) -> dict:
        """vLLM's usage object: in a response, prompt_tokens_details always (null unless
        --enable-prompt-tokens-details: then the prompt's prefix-cache hit as cached_tokens;
        vllmx counts no cache writes or multimodal tokens, null); in a stream's last chunk,
        whose nulls vLLM leaves out, only the cached tokens, where enabled."""
        u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
        details = None
        if self.enable_prompt_tokens_details and cached_tokens is not None:
            details = ({"cached_tokens": cached_tokens} if stream else
                       {"cached_tokens": cached_tokens, "created_cache_tokens": None,
                        "multimodal_tokens": None})
        if details is not None or not stream:
            u["prompt_tokens_details"] = details
        return u

    def include_usage(self, request) -> tuple[bool, bool]:
        """(a stream's usage chunk, usage on every chunk): stream_options', or both with
        --enable-force-include-usage (vLLM's should_include_usage)."""
        if self.enable_force_include_usage:
            return True, True
        opts = request.stream_options
        usage = bool(opts and opts.include_usage)
        return usage, bool(usage and opts.continuous_usage_stats)

    def timing(self, metrics, num_generated: int, single: bool) -> dict | None:
        """vLLM's per-request timing metrics (--enable-per-request-metrics) from one
        request's timestamps, None where off or where one stream does not own them (several
        prompts or n > 1, as vLLM suppresses them): time to first token and queue time from
        when it was scheduled, generation time and mean inter-token latency over its decode,
        tokens per second from scheduling to its last token; null where a timestamp is
        missing."""
        if not (self.enable_per_request_metrics and single):
            return None
        m = metrics
        sched = m.first_scheduled_time if m else None
        first = m.first_token_time if m else None
        last = m.last_token_time if m else None
        ms = 1000.0
        out = {"time_to_first_token_ms": (first - sched) * ms if sched and first else None,
               "generation_time_ms": (last - first) * ms if first and last else None,
               "queue_time_ms": (sched - m.arrival_time) * ms if m and sched else None,
               "mean_itl_ms": ((last - first) / (num_generated - 1) * ms
                               if first and last and num_generated > 1 else None),
               "tokens_per_second": None}
        if sched and last and last > sched:
            out["tokens_per_second"] = num_generated / (last - sched)
        return out

    def token_namer(self, request):
        """How logprobs name a token: "token_id:<id>" with return_tokens_as_token_ids (the
        request's, else the server's), else its text (the Logprob's decoded_token if set)."""
        as_ids = request.return_tokens_as_token_ids
        if as_ids is None:
            as_ids = self.return_tokens_as_token_ids
        if as_ids:
            return lambda token_id, lp: f"token_id:{token_id}"
        tok = self.tokenizer

        def text(token_id: int, lp) -> str:
            if lp is not None and lp.decoded_token is not None:
                return lp.decoded_token
            return tok.decode_token(token_id)
        return text

    @property
    def tokenizer(self):
        tok = self.engine_client.get_tokenizer()
        if tok is None:
            raise OpenAIError("this server runs without a tokenizer (skip_tokenizer_init)")
        return tok

    # -- checks -----------------------------------------------------------------------------
    # The served names and LoRA adapters (serving_models.py), set by build_app; None: the
    # served_model_names alone.
    models = None

    def check_model(self, model: str | None) -> None:
        if self.models is not None:
            self.models.lora_request(model)  # 404 for a name that is neither
            return
        if model and model not in self.served_model_names:
            raise OpenAIError(f"The model `{model}` does not exist.", HTTPStatus.NOT_FOUND,
                              param="model")

    @staticmethod
    def check_unsupported(request) -> None:
        if request.stream_options is not None and not request.stream:
            raise OpenAIError("Stream options can only be defined when `stream=True`.",
                              param="stream_options")
        if request.n < 1:
            raise OpenAIError(f"n must be at least 1, got {request.n}.", param="n")
        # vLLM's rules (its request models' check_logprobs): prompt logprobs come with the
        # whole response, never in a stream; -1 asks for the whole vocabulary.
        plp = request.prompt_logprobs
        if plp is not None:
            if request.stream and (plp > 0 or plp == -1):
                raise OpenAIError("`prompt_logprobs` are not available when `stream=True`.",
                                  param="prompt_logprobs")
            if plp < -1:
                raise OpenAIError("`prompt_logprobs` must be a positive value or -1.",
                                  param="prompt_logprobs")

    def truncate(self, ids: list[int], truncate_prompt_tokens: int | None) -> list[int]:
        """vLLM's truncate_prompt_tokens: keep the last k prompt tokens (-1: max_model_len)."""
        if truncate_prompt_tokens is None:
            return ids
        k = self.max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
        if k < 1 or k > self.max_model_len:
            raise OpenAIError(f"truncate_prompt_tokens must be -1 or in [1, max_model_len="
                              f"{self.max_model_len}], got {truncate_prompt_tokens}",
                              param="truncate_prompt_tokens")
        return ids[-k:]

    def max_tokens_for(self, num_prompt: int, max_tokens: int | None,
                       what: str = "messages") -> int:
        """The request's max_tokens, or what is left of the context; 400 when it cannot fit."""
        if num_prompt >= self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {num_prompt} input tokens. Please reduce the length of the "
                f"input {what}.")
        if max_tokens is None:
            left = self.max_model_len - num_prompt
            return min(left, self.default_max_tokens) if self.default_max_tokens else left
        if max_tokens < 1:
            raise OpenAIError(f"max_tokens must be at least 1, got {max_tokens}.",
                              param="max_tokens")
        if num_prompt + max_tokens > self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {num_prompt + max_tokens} tokens ({num_prompt} in the {what}, "
                f"{max_tokens} in the completion). Please reduce the length of the {what} or "
                f"completion.", param="max_tokens")
        return max_tokens

    # -- SamplingParams -----------------------------------------------------------------------
    def sampling_params(self, request, max_tokens: int, logprobs: int | None,
                        prompt_logprobs: int | None) -> SamplingParams | BeamSearchParams:
        if request.use_beam_search:
            return self.beam_search_params(request, max_tokens, logprobs, prompt_logprobs)
        kwargs = dict(self.default_sampling)
        requested = {
            "n": request.n, "best_of": request.best_of,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "repetition_penalty": request.repetition_penalty,
            "temperature": request.temperature, "top_p": request.top_p,
            "top_k": request.top_k, "min_p": request.min_p, "seed": request.seed,
            "stop": request.stop, "stop_token_ids": request.stop_token_ids,
            "bad_words": request.bad_words,
            "include_stop_str_in_output": request.include_stop_str_in_output,
            "ignore_eos": request.ignore_eos, "max_tokens": max_tokens,
            "min_tokens": request.min_tokens, "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "skip_special_tokens": request.skip_special_tokens,
            "spaces_between_special_tokens": request.spaces_between_special_tokens,
            "logit_bias": request.logit_bias, "allowed_token_ids": request.allowed_token_ids,
            "structured_outputs": structured_outputs_of(request),
        }
        kwargs.update({k: v for k, v in requested.items() if v is not None})
        for name in list(kwargs):
            if name not in _PARAM_FIELDS:
                if kwargs[name] == _NEUTRAL.get(name, object()):
                    del kwargs[name]
                else:
                    raise OpenAIError(f"{name} is not supported by this server yet", param=name)
        try:
            params = SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
        except (ValueError, TypeError, NotImplementedError) as e:
            raise OpenAIError(str(e), param=_param_of(str(e), kwargs)) from e
        # The vocabulary, tokenizer and --max-logprobs checks are the engine's (AsyncLLM runs
        # them before queueing the request); bad ids or counts come back as a ValueError.
        return params

    def beam_search_params(self, request, max_tokens: int, logprobs: int | None,
                           prompt_logprobs: int | None) -> BeamSearchParams:
        """vLLM's use_beam_search: n beams (beam_width = n), the temperature of the steps (the
        model's default, else 1.0, when unset), length_penalty. What beam search would leave
        unused is refused by name (vLLM ignores it silently)."""
        unused = {"logprobs": logprobs, "prompt_logprobs": prompt_logprobs,
                  "stop": request.stop or None, "stop_token_ids": request.stop_token_ids or None,
                  "bad_words": request.bad_words or None, "logit_bias": request.logit_bias,
                  "allowed_token_ids": request.allowed_token_ids, "top_p": request.top_p,
                  "top_k": request.top_k, "min_p": request.min_p,
                  "presence_penalty": request.presence_penalty,
                  "frequency_penalty": request.frequency_penalty,
                  "repetition_penalty": request.repetition_penalty,
                  "min_tokens": request.min_tokens or None,
                  "structured_outputs": structured_outputs_of(request)}
        for name, value in unused.items():
            if value is not None:
                raise OpenAIError(f"{name} is not supported with use_beam_search", param=name)
        temperature = request.temperature
        if temperature is None:
            temperature = self.default_sampling.get("temperature", 1.0)
        try:
            return BeamSearchParams(beam_width=request.n, max_tokens=max_tokens,
                                    ignore_eos=request.ignore_eos, temperature=temperature,
                                    length_penalty=request.length_penalty,
                                    include_stop_str_in_output=request.include_stop_str_in_output)
        except ValueError as e:
            raise OpenAIError(str(e), param="n") from e

    @functools.cached_property
    def _max_chars_per_token(self) -> int:
        """An upper bound on the characters one token stands for: its longest vocabulary entry
        (added tokens included), times 4 for what normalization may fold together."""
        return 4 * max(1, max(map(len, self.tokenizer.get_vocab()), default=1))

    def encode_prompt(self, text: str, add_special_tokens: bool,
                      truncate_prompt_tokens: int | None, what: str = "prompt") -> list[int]:
        """The prompt's ids. A text too long for max_model_len whatever its tokens is refused
        before tokenizing it (seconds of CPU for a few megabytes), unless it is to be
        truncated."""
        floor = len(text) // self._max_chars_per_token
        if truncate_prompt_tokens is None and floor >= self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has at least {floor} input tokens ({len(text)} characters). "
                f"Please reduce the length of the input {what}.")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    @property
    def max_logprobs(self) -> int:
        return self.model_config.max_logprobs

    def check_prompt_ids(self, ids: list[int], param: str = "prompt") -> None:
        """Token ids of a prompt against the vocabulary, before anything decodes them."""
        vocab = self.model_config.get_vocab_size()
        if bad := [t for t in ids if not 0 <= t < vocab]:
            raise OpenAIError(f"prompt token id {bad[0]} is out of vocabulary (size {vocab})",
                              param=param)

    # -- running requests ---------------------------------------------------------------------
    def generate(self, prompt: dict, params: SamplingParams | BeamSearchParams, request_id: str,
                 priority: int, model: str | None = None) -> AsyncIterator[RequestOutput]:
        """One request's outputs, under the LoRA adapter its `model` names (if any)."""
        lora = self.models.lora_request(model) if self.models is not None else None
        if self.log_requests:
            logger.info("Received request %s: prompt tokens %d, params %s", request_id,
                        len(prompt["prompt_token_ids"]), params)
        if isinstance(params, BeamSearchParams):
            gen = self.engine_client.beam_search(prompt, request_id, params, lora_request=lora)
        else:
            gen = self.engine_client.generate(prompt, params, request_id=request_id,
                                              priority=priority, lora_request=lora)
        return self.metrics.track(gen, time.time(), params)


def _param_of(message: str, kwargs: dict) -> str | None:
    """The request field a SamplingParams error names (its messages start with it)."""
    first = message.split(" ", 1)[0]
    return first if first in kwargs else None


async def merge_async_iterators(*iterators: AsyncIterator) -> AsyncIterator[tuple[int, object]]:
    """(i, item) from several async iterators as items come. Closing (or cancelling) the
    merged iterator cancels every producer, so each underlying request is aborted."""
    if len(iterators) == 1:  # the common case: no tasks needed
        try:
            async for item in iterators[0]:
                yield 0, item
        finally:
            await iterators[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def drain(i: int, it: AsyncIterator) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, e))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.ensure_future(drain(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_output(merged: AsyncIterator):
    """A stream's first output (None if there is none), awaited before the stream's 200 is
    sent, so that a request the engine refuses is an HTTP error, not an event in the stream;
    an error closes merged (aborting its requests)."""
    try:
        return await merged.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        await merged.aclose()
        raise


async def stream_outputs(first, merged: AsyncIterator):
    """A stream's outputs: first (awaited by first_output before the 200 was sent; None if
    there was none), then the rest of merged."""
    if first is not None:
        yield first
    async for item in merged:
        yield item


def drop_nulls(d: dict | None) -> dict | None:
    """d without its null fields (vLLM's exclude_none on a stream's last chunk), None if
    nothing is left."""
    if d is None:
        return None
    return {k: v for k, v in d.items() if v is not None} or None


def sse_chunks(request_id: str, obj: str, created: int, model: str):
    """chunk(choices, usage=None, extra=None) -> one `data:` line of a stream, the text json.dumps
    writes for {"id", "object", "created", "model", "choices"[, "usage"][, extra's keys]}; the
    four fields every chunk repeats are serialized once per stream, not once per token."""
    head = json.dumps({"id": request_id, "object": obj, "created": created, "model": model},
                      ensure_ascii=False)[:-1]

    def chunk(choices: list, usage: dict | None = None, extra: dict | None = None) -> str:
        tail = "" if usage is None else f', "usage": {json.dumps(usage, ensure_ascii=False)}'
        if extra:  # (system_fingerprint, metrics: a stream's last chunk)
            tail += ", " + json.dumps(extra, ensure_ascii=False)[1:-1]
        return f'data: {head}, "choices": {json.dumps(choices, ensure_ascii=False)}{tail}}}\n\n'

    return chunk


def prompt_logprobs_json(plp) -> list | None:
    """vLLM's prompt_logprobs in a response: per prompt position (None first) token id ->
    logprob, rank, decoded_token."""
    if plp is None:
        return None
    return [None if step is None else
            {str(t): {"logprob": max(p.logprob, -9999.0), "rank": p.rank,
                      "decoded_token": p.decoded_token} for t, p in step.items()}
            for step in plp]
