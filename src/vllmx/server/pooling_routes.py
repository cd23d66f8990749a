"""The pooling endpoints' routes (vLLM's pooling api_routers): /v1/embeddings, /pooling,
/classify, /score and /v1/score, /rerank, /v1/rerank and /v2/rerank, over OpenAIServingPooling;
and which API a SageMaker /invocations body is for."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from vllmx.server.protocol_pooling import (
    ClassificationRequest,
    EmbeddingCompletionRequest,
    EmbeddingRequest,
    PoolingCompletionRequest,
    RerankRequest,
    ScoreRequest,
)
from vllmx.server.serving_pooling import OpenAIServingPooling


def add_pooling_routes(app: FastAPI, v1: APIRouter, auth: list, pooling: OpenAIServingPooling,
                       render, respond) -> dict[str, tuple]:
    """Adds the routes (v1: the /v1 router; auth: the API-key dependency for the others;
    render: the chat server's, for /v1/embeddings' chat form; respond: the app's runner of a
    handler). Returns /invocations' handlers by kind: (request class, route function)."""

    @v1.post("/embeddings")
    async def create_embedding(body: EmbeddingRequest, request: Request):
        return await respond(pooling.create_embedding(body, render), request)

    @app.post("/pooling", dependencies=auth)
    async def create_pooling(body: PoolingCompletionRequest, request: Request):
        return await respond(pooling.create_pooling(body), request)

    @app.post("/classify", dependencies=auth)
    async def create_classify(body: ClassificationRequest, request: Request):
        return await respond(pooling.create_classify(body), request)

    @app.post("/score", dependencies=auth)
    @app.post("/v1/score", dependencies=auth)
    async def create_score(body: ScoreRequest, request: Request):
        return await respond(pooling.create_score(body), request)

    @app.post("/rerank", dependencies=auth)
    @app.post("/v1/rerank", dependencies=auth)
    @app.post("/v2/rerank", dependencies=auth)
    async def do_rerank(body: RerankRequest, request: Request):
        return await respond(pooling.create_rerank(body), request)

    return {"embed": (EmbeddingCompletionRequest, create_embedding),
            "classify": (ClassificationRequest, create_classify),
            "score": (ScoreRequest, create_score), "rerank": (RerankRequest, do_rerank)}


def invocation_kind(body, is_pooling: bool) -> str | None:
    """Which API a SageMaker /invocations body is for, by its keys (vLLM's route tries each
    request type in turn): chat, completion, or on a pooling model input / score / rerank."""
    if not isinstance(body, dict):
        return None
    if "messages" in body:
        return "chat"
    if "prompt" in body:
        return "completion"
    if not is_pooling:
        return None
    if "input" in body:
        return "input"
    if {"text_1", "data_1", "queries"} & set(body):
        return "score"
    return "rerank" if "query" in body else None
