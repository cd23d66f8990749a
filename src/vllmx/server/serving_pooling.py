"""The pooling endpoints (vLLM's serving_embedding / serving_pooling / serving_score /
serving_classification): requests -> PoolingParams and prompts, one engine call, vLLM's
response shapes. A server whose model cannot do what an endpoint asks answers 400 naming the
API, as vLLM does."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np

from vllmx.llm_pooling import score_pairs
from vllmx.pooling_params import PoolingParams
from vllmx.server.errors import OpenAIError
from vllmx.server.serving_engine import OpenAIServing, random_uuid

# vLLM's names of each API in its "The model does not support ... API" answers.
API_NAMES = {"embed": "Embeddings", "classify": "Classification", "score": "Score",
             "rerank": "Rerank (Score)", "pooling": "Pooling"}


def _prompts(inp) -> list:
    """OpenAI's input forms as engine prompts: texts, or token id lists as dicts."""
    if isinstance(inp, str):
        return [inp]
    if inp and isinstance(inp[0], int):
        return [{"prompt_token_ids": inp}]
    return [x if isinstance(x, str) else {"prompt_token_ids": x} for x in inp]


def _encode(data, encoding_format: str):
    """A vector (or per-token matrix) as OpenAI's float list, or base64 of its little-endian
    float32 bytes."""
    vec = np.asarray(data, dtype=np.float32)
    if encoding_format == "base64":
        return base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
    return vec.tolist()


def _usage(outs) -> dict:
    n = sum(len(o.prompt_token_ids) for o in outs)
    return {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
            "prompt_tokens_details": None}


class OpenAIServingPooling(OpenAIServing):
    """Every pooling endpoint over one AsyncPoolingLLM (or a generative client, for which each
    answers that the model does not support it)."""

    def _check(self, body, api: str, task: str) -> None:
        self.check_model(body.model)
        tasks = getattr(self.engine_client, "supported_tasks", ())
        if task not in tasks:
            raise OpenAIError(f"The model does not support {API_NAMES[api]} API")

    async def _encode_input(self, body, params: PoolingParams, task: str, render=None):
        """The request's prompts through the engine. A chat request (messages) is rendered
        first, by render (the chat server's, in a worker thread) into one prompt's ids."""
        if hasattr(body, "messages"):
            _, ids = await asyncio.to_thread(render, body)
            prompts = [{"prompt_token_ids": ids}]
        else:
            prompts = _prompts(body.input)
        return await self.engine_client.encode(prompts, [params] * len(prompts), task)

    def _header(self, prefix: str, body) -> dict:
        return {"id": f"{prefix}-{body.request_id or random_uuid()}", "object": "list",
                "created": int(time.time()), "model": body.model or self.served_model_names[0]}

    async def create_embedding(self, body, render=None) -> dict:
        """render: (chat request) -> (text, ids), for the chat form (EmbeddingChatRequest)."""
        self._check(body, "embed", "embed")
        params = PoolingParams(truncate_prompt_tokens=body.truncate_prompt_tokens,
                               dimensions=body.dimensions, normalize=body.normalize)
        outs = await self._encode_input(body, params, "embed", render)
        data = [{"index": i, "object": "embedding",
                 "embedding": _encode(o.outputs.data, body.encoding_format)}
                for i, o in enumerate(outs)]
        return {**self._header("embd", body), "data": data, "usage": _usage(outs)}

    async def create_pooling(self, body) -> dict:
        tasks = getattr(self.engine_client, "supported_tasks", ())
        task = body.task or (tasks[0] if tasks else "embed")
        if task == "score":
            raise OpenAIError("/pooling with task 'score' takes pairs: use /score",
                              param="task")
        self._check(body, "pooling", task)
        params = PoolingParams(truncate_prompt_tokens=body.truncate_prompt_tokens,
                               dimensions=body.dimensions, normalize=body.normalize,
                               use_activation=body.use_activation)
        outs = await self._encode_input(body, params, task)
        data = [{"index": i, "object": "pooling",
                 "data": _encode(o.outputs.data, body.encoding_format)}
                for i, o in enumerate(outs)]
        return {**self._header("pool", body), "data": data, "usage": _usage(outs)}

    async def create_classify(self, body) -> dict:
        self._check(body, "classify", "classify")
        params = PoolingParams(truncate_prompt_tokens=body.truncate_prompt_tokens,
                               use_activation=body.use_activation)
        outs = await self._encode_input(body, params, "classify")
        id2label = self.model_config.hf_config.get("id2label") or {}
        data = []
        for i, o in enumerate(outs):
            probs = np.asarray(o.outputs.data, dtype=np.float32)
            best = int(np.argmax(probs))
            data.append({"index": i, "label": id2label.get(str(best), f"LABEL_{best}"),
                         "probs": probs.tolist(), "num_classes": len(probs)})
        return {**self._header("classify", body), "data": data, "usage": _usage(outs)}

    async def _score(self, body, api: str, text_1, text_2, param: str = "documents"):
        self._check(body, api, "score")
        # (an embedding model scores by cosine, where use_activation does not apply)
        params = PoolingParams(truncate_prompt_tokens=body.truncate_prompt_tokens,
                               use_activation=body.use_activation)
        try:
            pairs = score_pairs(text_1, text_2)
        except ValueError as e:
            raise OpenAIError(str(e), param=param) from None
        return await self.engine_client.score(pairs, params)

    async def create_score(self, body) -> dict:
        first, second, param = body.sides
        outs = await self._score(body, "score", first, second, param)
        data = [{"index": i, "object": "score", "score": float(o.outputs.data[0])}
                for i, o in enumerate(outs)]
        return {**self._header("score", body), "data": data, "usage": _usage(outs)}

    async def create_rerank(self, body) -> dict:
        outs = await self._score(body, "rerank", body.query, body.documents)
        results = [{"index": i, "document": {"text": body.documents[i]},
                    "relevance_score": float(o.outputs.data[0])} for i, o in enumerate(outs)]
        results.sort(key=lambda r: r["relevance_score"], reverse=True)
        top_n = body.top_n if body.top_n > 0 else len(results)
        header = self._header("rerank", body)
        return {"id": header["id"], "model": header["model"],
                "usage": {"total_tokens": _usage(outs)["total_tokens"]},
                "results": results[:top_n]}
