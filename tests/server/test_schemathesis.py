"""Property-based fuzzing of every route from the live /openapi.json (schemathesis): whatever
it sends, within or outside the schema, the answer is never a 5xx, and the server is healthy
afterwards. A short context bounds what any generated request can ask the engine to do."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from tests.server.conftest import MODEL, serving  # noqa: E402


@pytest.fixture(scope="module")
def fuzz_server(smollm2_gguf):
    from vllmx.engine.arg_utils import EngineArgs
    from vllmx.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(EngineArgs(
        model=smollm2_gguf, max_model_len=48, max_num_seqs=16, kv_cache_memory_bytes=8 << 20))
    with serving(engine, max_request_body_bytes=1 << 20) as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")


def steer(body: dict) -> None:
    """Past the checks a schema cannot state, so that valid cases reach the engine: the served
    model's name, and chat messages with a role and plain text."""
    if "model" in body:
        body["model"] = MODEL
    if isinstance(body.get("messages"), list):
        body["messages"] = [{"role": "user", "content": str(m.get("content") or "Hi")}
                            for m in body["messages"] if isinstance(m, dict)] or [
            {"role": "user", "content": "Hi"}]


def fuzz(operation, mode: GenerationMode) -> Counter:
    """Runs one route's examples; returns how many answers had each status."""
    statuses: Counter = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        if mode == GenerationMode.POSITIVE and isinstance(case.body, dict):
            steer(case.body)
        response = case.call(timeout=120)
        statuses[response.status_code] += 1
        assert response.status_code < 500, (case.as_curl_command(), response.text[:2000])
        if response.status_code >= 400 and operation.path.startswith("/v1/messages"):
            err = response.json()  # Anthropic's API: Anthropic's shape
            assert err["type"] == "error" and set(err["error"]) == {"type", "message"}
        elif response.status_code >= 400 and operation.path != "/metrics":  # OpenAI's shape
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    try:
        run()
    except Unsatisfiable:  # a route without parameters has no invalid form
        assert mode == GenerationMode.NEGATIVE and not operation.body
    return statuses


EXAMPLES = 100  # per route and mode: about a minute in all on two cores


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_server_errors(api_schema, mode):
    """Valid requests (positive) and requests that break the schema (negative), per route."""
    operations = {op.path: op for op in (r.ok() for r in api_schema.get_all_operations())}
    assert set(operations) >= {"/v1/completions", "/v1/chat/completions", "/tokenize",
                               "/detokenize", "/health"}
    statuses = {path: fuzz(op, GenerationMode(mode)) for path, op in operations.items()}
    if mode == "positive":  # the fuzzer got past validation into the engine, too
        assert statuses["/v1/completions"][200] > 0, statuses
        assert statuses["/v1/chat/completions"][200] > 0, statuses


def test_healthy_after_fuzzing(fuzz_server):
    assert httpx.get(f"{fuzz_server.url}/health").status_code == 200
    r = httpx.post(f"{fuzz_server.url}/v1/completions", json={
        "model": MODEL, "prompt": "The capital of France is", "max_tokens": 4,
        "temperature": 0}, timeout=60)
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"]
