"""The OpenAI-compatible HTTP server (`vllmx serve`): FastAPI + uvicorn over AsyncLLM."""

from vllmx.server.app import build_app

__all__ = ["build_app"]
