"""The FastAPI app (vLLM's api_server): OpenAI routes under /v1, plus /health, /version,
/tokenize, /detokenize and /metrics. Every error leaves in OpenAI's shape; a client that
disconnects cancels its handler (non-streaming) or closes its stream, which aborts the engine
request and frees its KV blocks at once. CPU work (tokenizing, rendering templates and large
answers) runs in worker threads, so the event loop, /health included, always answers; bodies
past the limit are refused unread."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Coroutine
from http import HTTPStatus

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import vllmx
from vllmx.server.errors import OpenAIError, error_response, from_exception, pydantic_message
from vllmx.server.fingerprint import build_system_fingerprint
from vllmx.server.metrics import ServerMetrics, StatLogger
from vllmx.server.pooling_routes import add_pooling_routes, invocation_kind
from vllmx.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from vllmx.server.responses_routes import add_responses_routes
from vllmx.server.serving_chat import OpenAIServingChat
from vllmx.server.serving_completion import OpenAIServingCompletion
from vllmx.server.serving_messages import AnthropicServingMessages, add_messages_routes
from vllmx.server.serving_models import (
    LoadLoRAAdapterRequest,
    OpenAIServingModels,
    UnloadLoRAAdapterRequest,
)
from vllmx.server.serving_pooling import OpenAIServingPooling
from vllmx.server.serving_responses import (
    DEFAULT_MAX_STORED_RESPONSES,
    OpenAIServingResponses,
)

logger = logging.getLogger("vllmx")


async def listen_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_cancellable(work: Awaitable, request: Request):
    """Runs a handler until it finishes or the client disconnects (then cancels it, which
    aborts its engine requests). Returns the handler's result, or None after a disconnect."""
    handler = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(listen_for_disconnect(request))
    try:
        await asyncio.wait([handler, listener], return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
        if not handler.done():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
    if handler.cancelled():
        return None
    return handler.result()


class SSEResponse(StreamingResponse):
    """A stream that watches for the client's disconnect and closes its generator at once
    (Starlette would only notice at the next write, and leave the generator to GC)."""

    media_type = "text/event-stream"

    def __init__(self, content, on_close=None, **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close  # called once the stream has ended, however it ended

    async def __call__(self, scope, receive, send) -> None:
        async def listen():
            while (await receive())["type"] != "http.disconnect":
                pass

        stream = asyncio.ensure_future(self.stream_response(send))
        listener = asyncio.ensure_future(listen())
        try:
            await asyncio.wait([stream, listener], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (stream, listener):
                t.cancel()
            await asyncio.gather(stream, listener, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()
            if self.on_close is not None:
                self.on_close()
        error = stream.exception() if stream.done() and not stream.cancelled() else None
        if error is not None and not isinstance(error, OSError):  # OSError: the client left
            raise error


class RequestBodyLimit:
    """Refuses a request body past max_bytes with 413, before reading it (Content-Length) or
    as soon as a chunked body passes the limit, so that no large body is ever held."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return (f"the request body is larger than the server's limit of {self.max_bytes} bytes "
                f"(--max-request-body-bytes)")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            response = error_response(self._message(), HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            return await response(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # FastAPI passes an HTTPException on as is
                    raise HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, self._message())
            return message

        await self.app(scope, limited_receive, send)


DEFAULT_MAX_REQUEST_BODY_BYTES = 16 << 20  # far above a max_model_len prompt, text or ids
_JSON_SLICE = 1 << 16


def json_response(content: dict) -> Response:
    """JSONResponse's bytes, with long top-level lists rendered a slice at a time: one
    json.dumps call holds the GIL throughout (250 ms for the 2.5M token ids of a 10 MB
    prompt), which would stall the event loop while a worker thread renders."""
    def dumps(value) -> str:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    parts = []
    for key, value in content.items():
        if isinstance(value, list) and len(value) > _JSON_SLICE:
            value = "[" + ",".join(dumps(value[i:i + _JSON_SLICE])[1:-1]
                                   for i in range(0, len(value), _JSON_SLICE)) + "]"
        else:
            value = dumps(value)
        parts.append(f"{dumps(key)}:{value}")
    return Response("{" + ",".join(parts) + "}", media_type="application/json")


def check_parser_flags(enable_auto_tool_choice: bool, tool_call_parser: str | None,
                       reasoning_parser: str | None):
    """The parser classes the flags name (vLLM's start-up checks)."""
    from vllmx.reasoning import get_reasoning_parser
    from vllmx.server.tool_parsers import get_tool_parser

    if enable_auto_tool_choice and not tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
    return (get_tool_parser(tool_call_parser) if tool_call_parser else None,
            get_reasoning_parser(reasoning_parser) if reasoning_parser else None)


def build_app(engine_client, served_model_names: list[str] | None = None,
              chat_template: str | None = None, api_key: str | None = None,
              allowed_origins: list[str] | None = None, log_requests: bool = False,
              log_stats_interval: float | None = 10.0, allow_credentials: bool = False,
              allowed_methods: list[str] | None = None, allowed_headers: list[str] | None = None,
              max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
              enable_tokenizer_info_endpoint: bool = False,
              enable_server_load_tracking: bool = False,
              return_tokens_as_token_ids: bool = False,
              enable_prompt_tokens_details: bool = False,
              enable_per_request_metrics: bool = False,
              enable_force_include_usage: bool = False,
              fingerprint_mode: str = "full", fingerprint_value: str | None = None,
              enable_auto_tool_choice: bool = False, tool_call_parser: str | None = None,
              reasoning_parser: str | None = None, lora_modules: list | None = None,
              allow_runtime_lora_updating: bool = False,
              max_stored_responses: int = DEFAULT_MAX_STORED_RESPONSES) -> FastAPI:
    """The app over an AsyncLLM. Several apps may share one AsyncLLM; each has its own
    metrics registry. CORS takes vLLM's flags and defaults (any origin, method and header,
    no credentials). app.state.draining (set when the server is asked to stop) makes /health
    503 and refuses new work with 503 while the requests in flight finish. vLLM's optional
    endpoints: /tokenizer_info (enable_tokenizer_info_endpoint; it exposes the chat template
    and special tokens), /load's count of requests in flight (enable_server_load_tracking;
    /load answers 0 without it, as vLLM's); usage's prompt_tokens_details with the prompt's
    prefix-cache hit (enable_prompt_tokens_details), responses' per-request timing metrics
    (enable_per_request_metrics), usage in every stream (enable_force_include_usage), and
    system_fingerprint by vLLM's fingerprint_mode (server/fingerprint.py). Tool calling and
    reasoning take vLLM's flags: enable_auto_tool_choice with a tool_call_parser name, a
    reasoning_parser name; an unknown name is a ValueError listing the known ones. LoRA (an
    engine with enable_lora): lora_modules (LoRAModulePath) are loaded at start-up and served
    by name; allow_runtime_lora_updating
    adds /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM gates them by its
    VLLM_ALLOW_RUNTIME_LORA_UPDATING). /v1/responses keeps at most
    max_stored_responses responses for GET and previous_response_id (0: none)."""
    tool_parser, reasoner = check_parser_flags(enable_auto_tool_choice, tool_call_parser,
                                               reasoning_parser)
    mc = engine_client.model_config
    names = served_model_names or [mc.model]
    models = OpenAIServingModels(engine_client, names, mc.path or mc.model, mc.max_model_len,
                                 lora_modules)
    if (lora_modules or allow_runtime_lora_updating) and (
            engine_client.vllm_config.lora_config is None):
        raise ValueError("--lora-modules and --allow-runtime-lora-updating need --enable-lora")
    metrics = ServerMetrics(engine_client, names[0])
    answer = {"return_tokens_as_token_ids": return_tokens_as_token_ids,
              "enable_prompt_tokens_details": enable_prompt_tokens_details,
              "enable_per_request_metrics": enable_per_request_metrics,
              "enable_force_include_usage": enable_force_include_usage,
              "system_fingerprint": build_system_fingerprint(
                  engine_client.vllm_config, fingerprint_mode, fingerprint_value)}
    completion = OpenAIServingCompletion(engine_client, names, metrics, log_requests, **answer)
    chat = OpenAIServingChat(engine_client, names, metrics, log_requests,
                             chat_template=chat_template, **answer,
                             enable_auto_tools=enable_auto_tool_choice, tool_parser=tool_parser,
                             reasoning_parser=reasoner)
    pooling = OpenAIServingPooling(engine_client, names, metrics, log_requests)
    completion.models = chat.models = models
    responses = OpenAIServingResponses(chat, max_stored_responses)
    is_pooling = mc.runner_type == "pooling"
    pooling_tasks = getattr(engine_client, "supported_tasks", ())
    stat_logger = StatLogger(metrics, log_stats_interval or 10.0)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await models.init_static_loras()  # a bad adapter stops the server with its error
        task = asyncio.ensure_future(stat_logger.run()) if log_stats_interval else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()

    app = FastAPI(title="vllmx", version=vllmx.__version__, lifespan=lifespan)
    app.state.metrics, app.state.stat_logger = metrics, stat_logger
    app.state.engine_client = engine_client
    app.state.draining = False
    app.state.server_load_metrics = 0
    app.add_middleware(CORSMiddleware, allow_origins=allowed_origins or ["*"],
                       allow_credentials=allow_credentials,
                       allow_methods=allowed_methods or ["*"],
                       allow_headers=allowed_headers or ["*"])
    app.add_middleware(RequestBodyLimit, max_bytes=max_request_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_, exc: RequestValidationError):
        message, param = pydantic_message(exc.errors())
        return error_response(message, HTTPStatus.BAD_REQUEST, param)

    @app.exception_handler(OpenAIError)
    async def _openai_error(_, exc: OpenAIError):
        return error_response(exc.message, exc.status, exc.param, exc.err_type)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_, exc: StarletteHTTPException):
        return error_response(str(exc.detail), HTTPStatus(exc.status_code))

    @app.exception_handler(Exception)
    async def _internal_error(_, exc: Exception):
        logger.exception("request failed")
        err = from_exception(exc)
        return error_response(err.message, err.status, err.param, err.err_type)

    expected_auth = f"Bearer {api_key}".encode() if api_key is not None else None

    async def check_api_key(request: Request) -> None:
        if expected_auth is None:
            return
        got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        # (Anthropic's clients send the key as x-api-key: accepted too, the same key)
        key = request.headers.get("x-api-key", "").encode("utf-8", "surrogateescape")
        if not (hmac.compare_digest(got, expected_auth)  # constant time: no timing oracle
                | hmac.compare_digest(b"Bearer " + key, expected_auth)):
            raise OpenAIError("Unauthorized", HTTPStatus.UNAUTHORIZED)

    def load_done() -> None:
        app.state.server_load_metrics -= 1

    async def respond(work: Coroutine, request: Request, on_error=error_response) -> Response:
        """work's answer: a dict as JSON, a stream as SSE, an exception as on_error's
        (OpenAI's error shape, or Anthropic's on /v1/messages)."""
        if app.state.draining:  # new work while the requests in flight finish
            work.close()
            return on_error("the server is shutting down", HTTPStatus.SERVICE_UNAVAILABLE)
        # /load: a request counts until its answer is sent (a stream: until it ends).
        tracked = enable_server_load_tracking
        if tracked:
            app.state.server_load_metrics += 1
        try:
            try:
                result = await run_cancellable(work, request)
            except Exception as e:  # one request fails, not the server
                err = from_exception(e)
                if err.status >= 500:
                    logger.exception("request failed")
                return on_error(err.message, err.status, err.param, err.err_type)
            if result is None:  # the client is gone
                return Response(status_code=499)
            if isinstance(result, AsyncIterator):
                response = SSEResponse(result, on_close=load_done if tracked else None)
                tracked = False  # the stream gives the count back when it ends
                return response
            return await asyncio.to_thread(JSONResponse, result)  # renders off the loop
        finally:
            if tracked:
                load_done()

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])

    def check_generative(api: str) -> None:
        if is_pooling:  # vLLM's answer on a pooling server
            raise OpenAIError(f"The model does not support {api} API")

    @v1.post("/completions")
    async def create_completion(body: CompletionRequest, request: Request):
        check_generative("Completions")
        return await respond(completion.create_completion(
            body, request.headers.get("X-Request-Id")), request)

    @v1.post("/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        check_generative("Chat Completions")
        return await respond(chat.create_chat_completion(
            body, request.headers.get("X-Request-Id")), request)

    add_responses_routes(v1, responses, respond, check_generative)
    add_messages_routes(v1, AnthropicServingMessages(chat), respond, check_generative)
    auth = [Depends(check_api_key)]
    pooling_handlers = add_pooling_routes(app, v1, auth, pooling, chat.render, respond)

    @v1.get("/models")
    async def show_available_models():
        return models.show_available_models()

    if allow_runtime_lora_updating:
        @v1.post("/load_lora_adapter")
        async def load_lora_adapter(body: LoadLoRAAdapterRequest):
            return PlainTextResponse(await models.load_lora_adapter(body))

        @v1.post("/unload_lora_adapter")
        async def unload_lora_adapter(body: UnloadLoRAAdapterRequest):
            return PlainTextResponse(await models.unload_lora_adapter(body))

    # SageMaker's route (vLLM's): the body's own shape says which API it is for.
    @app.post("/invocations", dependencies=[Depends(check_api_key)])
    async def invocations(request: Request):
        try:
            body = await request.json()
        except ValueError as e:
            raise OpenAIError(f"invocations: the body is not JSON ({e})") from None
        kind = invocation_kind(body, is_pooling)
        if kind is None:
            raise OpenAIError("invocations: the body must be a chat completion request "
                              "(with 'messages'), a completion request (with 'prompt'), or "
                              "on a pooling model an embeddings / classify ('input'), score "
                              "('text_1', 'text_2') or rerank ('query', 'documents') request")
        handlers = {"chat": (ChatCompletionRequest, create_chat_completion),
                    "completion": (CompletionRequest, create_completion), **pooling_handlers}
        if kind == "input":
            kind = "embed" if "embed" in pooling_tasks else "classify"
        request_cls, handler = handlers[kind]
        try:
            parsed = request_cls.model_validate(body)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None
        return await handler(parsed, request)

    @app.get("/load")
    async def get_server_load():
        return {"server_load": app.state.server_load_metrics}

    if enable_tokenizer_info_endpoint:
        @app.get("/tokenizer_info")
        async def tokenizer_info():
            return JSONResponse(completion.tokenizer.tokenizer_info(completion.max_model_len))

    app.include_router(v1)

    @app.get("/health")
    async def health():
        if engine_client.errored:
            return error_response(f"the engine has stopped: {engine_client.dead_error}",
                                  HTTPStatus.SERVICE_UNAVAILABLE)
        if app.state.draining:
            return error_response("the server is shutting down", HTTPStatus.SERVICE_UNAVAILABLE)
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": vllmx.__version__}

    def tokenize_sync(body: TokenizeRequest) -> Response:
        completion.check_model(body.model)
        tok = completion.tokenizer
        if hasattr(body, "messages"):
            _, ids = chat.render(body, body.tools)
        else:
            ids = tok.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        out = {"count": len(ids), "max_model_len": completion.max_model_len, "tokens": ids,
               "token_strs": None}
        if body.return_token_strs:
            out["token_strs"] = tok.convert_ids_to_tokens(ids)
        return json_response(out)

    def detokenize_sync(body: DetokenizeRequest) -> Response:
        completion.check_model(body.model)
        completion.check_prompt_ids(body.tokens, param="tokens")
        return JSONResponse({"prompt": completion.tokenizer.decode(body.tokens)})

    # Tokenizing is CPU work: it runs in a worker thread, never on the event loop, and so does
    # rendering its (possibly large) JSON answer.
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        return await asyncio.to_thread(tokenize_sync, body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        return await asyncio.to_thread(detokenize_sync, body)

    @app.get("/metrics")
    async def show_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
