"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, with the HTTP
status that matches (vLLM's ErrorResponse)."""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

from vllmx.engine.exceptions import EngineDeadError, EngineGenerateError


class OpenAIError(Exception):
    """An error to return to the client as it is (raised anywhere in a handler)."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                 param: str | None = None, err_type: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.err_type = err_type or _TYPES.get(status, "InternalServerError")


_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.UNAUTHORIZED: "AuthenticationError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "RequestEntityTooLargeError",
    HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
}


def error_body(message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
               param: str | None = None, err_type: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type or _TYPES.get(status, "InternalServerError"),
                      "param": param, "code": int(status)}}


def error_response(message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                   param: str | None = None, err_type: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, err_type), status_code=int(status))


def from_exception(e: BaseException) -> OpenAIError:
    """Maps what the engine and SamplingParams raise to the error the client sees: bad input
    (ValueError, TypeError, NotImplementedError for what is not supported yet) is a 400; a
    request that failed inside the engine, a dead engine or anything else is a 500."""
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, (EngineDeadError, EngineGenerateError)):
        return OpenAIError(str(e), HTTPStatus.INTERNAL_SERVER_ERROR)
    if isinstance(e, (ValueError, TypeError, NotImplementedError)):
        return OpenAIError(str(e) or type(e).__name__)
    return OpenAIError(f"{type(e).__name__}: {e}", HTTPStatus.INTERNAL_SERVER_ERROR)


def pydantic_message(errors: list[dict]) -> tuple[str, str | None]:
    """One readable line from pydantic/FastAPI validation errors, and the offending field. Each
    error keeps pydantic's type in brackets as pydantic prints it (vLLM's messages carry pydantic's
    own text, and clients match on e.g. "greater_than_equal")."""
    parts, param = [], None
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            return f"Invalid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}", None
        where = ".".join(loc)
        param = param or (where or None)
        text = f"{where}: {err.get('msg')}" if where else str(err.get("msg"))
        parts.append(f"{text} [type={err['type']}]" if err.get("type") else text)
    return "; ".join(parts) or "invalid request", param


def sse_error(e: BaseException) -> str:
    """An error inside a stream (the status line is already sent): one SSE event, as vLLM does."""
    import json

    err = from_exception(e)
    return f"data: {json.dumps(error_body(err.message, err.status, err.param, err.err_type))}\n\n"
