"""The schemathesis fuzzing of test_schemathesis.py against a pooling server (the real MiniLM,
a short context): every pooling route and the generation routes it refuses, within and outside
the schema, never answer 5xx, and the server embeds correctly afterwards."""

from __future__ import annotations

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

from tests.server.conftest import serving  # noqa: E402
from tests.server.test_schemathesis import fuzz  # noqa: E402

POOLING_ROUTES = {"/v1/embeddings", "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank",
                  "/v2/rerank", "/classify", "/v1/completions", "/v1/chat/completions",
                  "/tokenize"}


@pytest.fixture(scope="module")
def pooling_fuzz_server(minilm_dir):
    from vllmx.engine.arg_utils import EngineArgs
    from vllmx.engine.factory import create_engine_client

    engine = create_engine_client(EngineArgs(model=minilm_dir, max_model_len=48))
    with serving(engine, max_request_body_bytes=1 << 20) as s:
        yield s


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_server_errors(pooling_fuzz_server, mode):
    schema = schemathesis.openapi.from_url(f"{pooling_fuzz_server.url}/openapi.json")
    operations = {op.path: op for op in (r.ok() for r in schema.get_all_operations())
                  if op.path in POOLING_ROUTES}
    assert set(operations) == POOLING_ROUTES
    statuses = {path: fuzz(op, GenerationMode(mode)) for path, op in operations.items()}
    if mode == "positive":  # valid requests reached the model
        assert statuses["/v1/embeddings"][200] > 0, statuses
        assert statuses["/rerank"][200] > 0, statuses


def test_healthy_after_fuzzing(pooling_fuzz_server):
    assert httpx.get(f"{pooling_fuzz_server.url}/health").status_code == 200
    r = httpx.post(f"{pooling_fuzz_server.url}/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
