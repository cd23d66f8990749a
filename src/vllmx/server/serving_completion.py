"""POST /v1/completions (vLLM's OpenAIServingCompletion): one engine request per prompt, n
choices each (choice index = prompt index * n + sample index), streamed as SSE or returned
whole."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from vllmx.outputs import Logprob
from vllmx.server.errors import OpenAIError, from_exception, sse_error
from vllmx.server.protocol import CompletionRequest
from vllmx.server.serving_engine import (
    OpenAIServing,
    drop_nulls,
    first_output,
    merge_async_iterators,
    prompt_logprobs_json,
    random_uuid,
    sse_chunks,
    stream_outputs,
)


def _clamp(lp: float) -> float:
    return max(lp, -9999.0)  # -inf is not JSON; OpenAI uses -9999


# vLLM's words (its input processor's: an empty prompt in a list), which clients match on.
EMPTY_PROMPT = "The decoder prompt cannot be empty (prompt must not be empty)"


class CompletionLogprobs:
    """OpenAI's completion logprobs (tokens, token_logprobs, top_logprobs, text_offset), built
    incrementally so that stream chunks carry only their part."""

    def __init__(self, name_token):
        self._text = name_token  # (token id, Logprob | None) -> the token's name
        self.text_offset = 0

    def build(self, token_ids: list[int], logprobs: list[dict[int, Logprob] | None]) -> dict:
        out = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for token_id, step in zip(token_ids, logprobs):
            if step is None:  # the first prompt token has no logprob
                token = self._text(token_id, None)
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
            else:
                token = self._text(token_id, step.get(token_id))
                lp = step.get(token_id)
                out["token_logprobs"].append(_clamp(lp.logprob) if lp is not None else None)
                out["top_logprobs"].append({self._text(t, p): _clamp(p.logprob)
                                            for t, p in step.items()})
            out["tokens"].append(token)
            out["text_offset"].append(self.text_offset)
            self.text_offset += len(token)
        return out


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, request: CompletionRequest, request_id: str | None):
        """The response dict, or (streaming) an async iterator of SSE lines."""
        # Tokenizing and checking run in a worker thread: never on the event loop.
        prompts, engine_prompts, params = await asyncio.to_thread(self._prepare, request)
        request_id = f"cmpl-{request.request_id or request_id or random_uuid()}"
        gens = [self.generate(p, sp, f"{request_id}-{i}" if len(prompts) > 1 else request_id,
                              request.priority, request.model)
                for i, (p, sp) in enumerate(zip(engine_prompts, params))]
        merged = merge_async_iterators(*gens)
        created = int(time.time())
        model = request.model or self.served_model_names[0]
        if request.stream:
            first = await first_output(merged)
            return self._stream(request, prompts, merged, first, request_id, created, model)
        return await self._full(request, prompts, merged, request_id, created, model)

    def _prepare(self, request: CompletionRequest):
        """(prompts as (text, ids), the engine prompts, their SamplingParams)."""
        self.check_model(request.model)
        self.check_unsupported(request)
        if request.suffix is not None:
            raise OpenAIError("suffix is not currently supported", param="suffix")
        prompts = self._prompts(request)
        want_logprobs = request.logprobs
        prompt_logprobs = request.prompt_logprobs
        if request.echo and want_logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = want_logprobs
        engine_prompts, params = [], []
        for text, ids in prompts:
            max_tokens = self.max_tokens_for(len(ids), request.max_tokens, "prompt")
            params.append(self.sampling_params(request, max_tokens, want_logprobs,
                                               prompt_logprobs))
            engine_prompts.append({"prompt": text, "prompt_token_ids": ids})
        return prompts, engine_prompts, params

    def _prompts(self, request: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        p = request.prompt
        if isinstance(p, str):
            items: list = [p]
        elif not p:
            raise OpenAIError(EMPTY_PROMPT, param="prompt")
        elif isinstance(p[0], int):
            items = [p]
        else:
            items = list(p)
        out = []
        tok = self.engine_client.get_tokenizer()
        for item in items:
            if isinstance(item, str):
                if not item:
                    raise OpenAIError(EMPTY_PROMPT, param="prompt")
                ids = self.encode_prompt(item, request.add_special_tokens,
                                         request.truncate_prompt_tokens)
                text = item
            else:
                if not item:
                    raise OpenAIError(EMPTY_PROMPT, param="prompt")
                ids = list(item)
                self.check_prompt_ids(ids)
                text = tok.decode(ids) if tok is not None else None
            ids = self.truncate(ids, request.truncate_prompt_tokens)
            out.append((text, ids))
        return out

    def _prompt_part(self, request, prompt, final_prompt_logprobs, lp_builder):
        """What echo puts before the generated text: the prompt text and its logprobs."""
        text, ids = prompt
        logprobs = None
        if request.logprobs is not None:
            plp = final_prompt_logprobs or [None] * len(ids)
            logprobs = lp_builder.build(ids, plp)
        return text or "", logprobs

    async def _full(self, request, prompts, merged, request_id, created, model) -> dict:
        n = request.n
        choices: dict[int, dict] = {}
        prompt_logprobs: dict[int, list] = {}
        cached: dict[int, int] = {}  # prompt -> its prefix-cache hit
        timestamps = None  # the last output's (per-request metrics: one prompt, n = 1)
        try:
            async for i, out in merged:
                cached[i] = out.num_cached_tokens
                timestamps = out.metrics
                if out.prompt_logprobs is not None:
                    prompt_logprobs[i] = out.prompt_logprobs
                for c in out.outputs:
                    idx = i * n + c.index
                    ch = choices.setdefault(idx, {"text": [], "token_ids": [], "logprobs": [],
                                                  "finish_reason": None, "stop_reason": None})
                    ch["text"].append(c.text)
                    ch["token_ids"].extend(c.token_ids)
                    if c.logprobs:
                        ch["logprobs"].extend(c.logprobs)
                    if c.finish_reason is not None:
                        ch["finish_reason"], ch["stop_reason"] = c.finish_reason, c.stop_reason
        except Exception as e:
            raise from_exception(e) from e
        # Building the answer (logprob tokens decoded, echoed prompts) is CPU work that grows
        # with the output: off the event loop.
        return await asyncio.to_thread(self._response, request, prompts, choices,
                                       prompt_logprobs, request_id, created, model,
                                       sum(cached.values()), timestamps)

    def _response(self, request, prompts, choices, prompt_logprobs, request_id, created,
                  model, cached: int = 0, timestamps=None) -> dict:
        """vLLM's CompletionResponse, every key (its model_dump): each choice's and its
        prompt's token ids with return_token_ids, null for what vllmx has no source of."""
        with_ids = bool(request.return_token_ids)
        n = request.n
        builders: dict[int, CompletionLogprobs] = {}
        result_choices = []
        completion_tokens = 0
        for idx in sorted(choices):
            ch, i = choices[idx], idx // n
            text = "".join(ch["text"])
            logprobs = None
            if request.logprobs is not None:
                b = builders.setdefault(idx, CompletionLogprobs(self.token_namer(request)))
                logprobs = {"text_offset": [], "token_logprobs": [], "tokens": [],
                            "top_logprobs": []}
                if request.echo:
                    _, logprobs = self._prompt_part(request, prompts[i],
                                                    prompt_logprobs.get(i), b)
                gen = b.build(ch["token_ids"], ch["logprobs"])
                for k in logprobs:
                    logprobs[k] = logprobs[k] + gen[k]
            if request.echo:
                text = (prompts[i][0] or "") + text
            completion_tokens += len(ch["token_ids"])
            result_choices.append({
                "index": idx, "text": text, "logprobs": logprobs,
                "finish_reason": ch["finish_reason"], "stop_reason": ch["stop_reason"],
                "token_ids": ch["token_ids"] if with_ids else None,
                # (vLLM always sends the field: null unless prompt_logprobs was asked for.)
                "prompt_logprobs": (prompt_logprobs_json(prompt_logprobs.get(i))
                                    if request.prompt_logprobs is not None else None),
                "prompt_token_ids": list(prompts[i][1]) if with_ids else None,
                "routed_experts": None})
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        return {"id": request_id, "object": "text_completion", "created": created,
                "model": model, "choices": result_choices, "service_tier": None,
                "system_fingerprint": self.system_fingerprint,
                "usage": self.usage(prompt_tokens, completion_tokens, cached),
                "kv_transfer_params": None, "ec_transfer_params": None,
                "metrics": self.timing(timestamps, completion_tokens,
                                       len(prompts) == 1 and n == 1)}

    async def _stream(self, request, prompts, merged, first, request_id, created,
                      model) -> AsyncIterator[str]:
        n = request.n
        include_usage, continuous = self.include_usage(request)
        builders: dict[int, CompletionLogprobs] = {}
        num_tokens: dict[int, int] = {}
        echoed: set[int] = set()
        with_ids = bool(request.return_token_ids)
        ids_sent: set[int] = set()  # choices whose prompt ids went out (return_token_ids)
        cached: dict[int, int] = {}
        timestamps = None

        chunk = sse_chunks(request_id, "text_completion", created, model)

        try:
            async for i, out in stream_outputs(first, merged):
                cached[i] = out.num_cached_tokens
                timestamps = out.metrics
                for c in out.outputs:
                    idx = i * n + c.index
                    b = builders.setdefault(idx, CompletionLogprobs(self.token_namer(request)))
                    text, logprobs = c.text, None
                    if request.echo and idx not in echoed:  # the prompt comes first
                        echoed.add(idx)
                        ptext, logprobs = self._prompt_part(request, prompts[i],
                                                            out.prompt_logprobs, b)
                        text = ptext + text
                    if request.logprobs is not None:
                        gen = b.build(c.token_ids, c.logprobs or [])
                        logprobs = gen if logprobs is None else {
                            k: logprobs[k] + gen[k] for k in gen}
                    num_tokens[idx] = num_tokens.get(idx, 0) + len(c.token_ids)
                    if (not text and c.finish_reason is None and not logprobs
                            and not (with_ids and c.token_ids)):
                        continue
                    # vLLM's stream choice: the prompt's ids on a choice's first chunk and each
                    # chunk's new tokens (return_token_ids), both keys always there.
                    prompt_ids = None
                    if with_ids and idx not in ids_sent:
                        ids_sent.add(idx)
                        prompt_ids = list(prompts[i][1])
                    choice = {"index": idx, "text": text, "logprobs": logprobs,
                              "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                              "prompt_token_ids": prompt_ids,
                              "token_ids": list(c.token_ids) if with_ids else None}
                    usage = None
                    if continuous:
                        usage = self.usage(len(prompts[i][1]), num_tokens[idx], stream=True)
                    # vLLM's: the fingerprint on a choice's last chunk, unless a usage chunk
                    # follows (it is the stream's last then).
                    last = (not include_usage and c.finish_reason is not None
                            and self.system_fingerprint is not None)
                    yield chunk([choice], usage,
                                {"system_fingerprint": self.system_fingerprint} if last else None)
            if include_usage:
                g = sum(num_tokens.values())
                extra = {"system_fingerprint": self.system_fingerprint,
                         "metrics": drop_nulls(self.timing(timestamps, g,
                                                           len(prompts) == 1 and n == 1))}
                yield chunk([], self.usage(sum(len(ids) for _, ids in prompts), g,
                                           sum(cached.values()), stream=True),
                            drop_nulls(extra))
        except Exception as e:  # noqa: BLE001 - the stream ends with the error event
            yield sse_error(e)
        finally:
            await merged.aclose()
        yield "data: [DONE]\n\n"
