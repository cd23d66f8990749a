"""The Responses API's routes (vLLM's responses api_router): POST /v1/responses, GET and
DELETE /v1/responses/{response_id}, POST /v1/responses/{response_id}/cancel."""

from __future__ import annotations

from fastapi import APIRouter, Request

from vllmx.server.errors import OpenAIError
from vllmx.server.protocol_responses import ResponsesRequest
from vllmx.server.serving_responses import OpenAIServingResponses


def add_responses_routes(v1: APIRouter, responses: OpenAIServingResponses, respond,
                         check_generative) -> None:
    """Adds the routes to v1 (respond: the app's runner of a handler; check_generative: its
    refusal on a pooling model)."""

    @v1.post("/responses")
    async def create_responses(body: ResponsesRequest, request: Request):
        check_generative("Responses")
        return await respond(responses.create_responses(
            body, request.headers.get("X-Request-Id")), request)

    @v1.get("/responses/{response_id}")
    async def retrieve_responses(response_id: str, stream: bool = False):
        if stream:  # vLLM replays the events of background responses only
            raise OpenAIError("stream=true replays background responses, which this server "
                              "does not run", param="stream")
        return responses.retrieve(response_id)

    @v1.delete("/responses/{response_id}")
    async def delete_responses(response_id: str):
        return responses.delete(response_id)

    @v1.post("/responses/{response_id}/cancel")
    async def cancel_responses(response_id: str):
        return responses.cancel(response_id)
