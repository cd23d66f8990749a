"""The pooling endpoints over real HTTP: /v1/embeddings through the official openai client,
/pooling, /score, /rerank and /classify through httpx; answers checked against
sentence-transformers and transformers; bad input and the wrong runner get 4xx in OpenAI's
error shape."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from tests.models.pooling_checkpoints import make_hf_checkpoint
from tests.server.conftest import serving

TEXTS = ["The capital of France is Paris.", "A man is eating food.", "hello there"]
QUERY = "What is the capital of France?"
DOCS = ["Bananas are yellow.", "Paris is the capital of France.", "The Eiffel tower is tall."]


def _serve(path: str, name: str, **app_kwargs):
    from vllmx.engine.arg_utils import EngineArgs
    from vllmx.engine.factory import create_engine_client

    return serving(create_engine_client(EngineArgs(model=path, runner="pooling")), [name],
                   **app_kwargs)


@pytest.fixture(scope="module")
def minilm_server(minilm_dir):
    with _serve(minilm_dir, "minilm") as s:
        yield s


@pytest.fixture(scope="module")
def cross_encoder(minilm_dir, tmp_path_factory):
    path = make_hf_checkpoint("bert_cls", str(tmp_path_factory.mktemp("ce") / "ce"), minilm_dir)
    with _serve(path, "ce") as s:
        yield s, path


@pytest.fixture(scope="module")
def classifier(minilm_dir, tmp_path_factory):
    path = make_hf_checkpoint("xlmr_cls", str(tmp_path_factory.mktemp("cls") / "cls"),
                              minilm_dir)
    with _serve(path, "cls") as s:
        yield s, path


@pytest.fixture(scope="module")
def st_vectors(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_dir, device="cpu").encode(TEXTS, convert_to_numpy=True)


def _hf_logits(path: str, cls_name: str, texts: list[str], pairs: list[str] | None = None):
    """transformers' logits for texts (or text pairs), padded into one batch."""
    import torch
    import transformers as tf

    model = getattr(tf, cls_name).from_pretrained(path).eval()
    tok = tf.AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return model(**tok(texts, pairs, padding=True, return_tensors="pt")).logits


def _error(r: httpx.Response, status: int, match: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert match in err["message"], err["message"]


def test_embeddings_through_openai_client(minilm_server, st_vectors):
    client = openai.OpenAI(base_url=f"{minilm_server.url}/v1", api_key="EMPTY", max_retries=0)
    # the client asks for base64 unless told otherwise, and decodes it
    res = client.embeddings.create(model="minilm", input=TEXTS)
    got = np.array([d.embedding for d in res.data])
    np.testing.assert_allclose(got, st_vectors, atol=1e-5)
    assert [d.index for d in res.data] == [0, 1, 2] and res.model == "minilm"
    assert res.usage.prompt_tokens == res.usage.total_tokens > len(TEXTS)
    floats = client.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, st_vectors[0], atol=1e-5)


def test_embeddings_token_ids_and_base64(minilm_server, st_vectors, minilm_dir):
    from vllmx.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained_dir(minilm_dir)
    tok.backend_tokenizer.no_padding()  # MiniLM's tokenizer.json pads to 128, as ST does not
    ids = [tok.encode(t) for t in TEXTS]
    r = httpx.post(f"{minilm_server.url}/v1/embeddings",
                   json={"input": ids, "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["id"].startswith("embd-")
    got = np.array([np.frombuffer(base64.b64decode(d["embedding"]), "<f4")
                    for d in body["data"]])
    np.testing.assert_allclose(got, st_vectors, atol=1e-5)
    one = httpx.post(f"{minilm_server.url}/v1/embeddings", json={"input": ids[1]}).json()
    np.testing.assert_allclose(one["data"][0]["embedding"], st_vectors[1], atol=1e-5)


def test_pooling_and_score_on_embedding_model(minilm_server, st_vectors):
    r = httpx.post(f"{minilm_server.url}/pooling", json={"input": TEXTS[:2]})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert data[0]["object"] == "pooling"
    np.testing.assert_allclose([d["data"] for d in data], st_vectors[:2], atol=1e-5)
    e = st_vectors.astype(np.float64)
    for path in ("/score", "/v1/score"):
        r = httpx.post(f"{minilm_server.url}{path}", json={"text_1": TEXTS[0],
                                                          "text_2": TEXTS[1:]})
        assert r.status_code == 200, r.text
        scores = [d["score"] for d in r.json()["data"]]
        ref = e[1:] @ e[0] / np.linalg.norm(e[1:], axis=1) / np.linalg.norm(e[0])
        np.testing.assert_allclose(scores, ref, atol=1e-5)


def test_embedding_bad_input(minilm_server):
    url = f"{minilm_server.url}/v1/embeddings"
    _error(httpx.post(url, json={"input": ""}), 400, "empty")
    _error(httpx.post(url, json={"input": []}), 400, "input")
    _error(httpx.post(url, json={"input": ["ok", ""]}), 400, "empty")
    _error(httpx.post(url, json={"input": "word " * 300}), 400, "maximum context length is 256")
    _error(httpx.post(url, json={"input": "hi", "dimensions": 8}), 400, "matryoshka")
    _error(httpx.post(url, json={"input": [[101, 10**7]]}), 400, "out of vocabulary")
    _error(httpx.post(url, json={"input": "hi", "model": "nope"}), 404, "does not exist")
    _error(httpx.post(url, json={"input": "hi", "encoding_format": "hex"}), 400,
           "encoding_format")
    ok = httpx.post(url, json={"input": "word " * 300, "truncate_prompt_tokens": 16})
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 16
    client = openai.OpenAI(base_url=f"{minilm_server.url}/v1", api_key="EMPTY", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="Completions API"):
        client.completions.create(model="minilm", prompt="hi", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="Chat Completions API"):
        client.chat.completions.create(model="minilm",
                                       messages=[{"role": "user", "content": "hi"}])
    _error(httpx.post(f"{minilm_server.url}/classify", json={"input": "hi"}), 400,
           "does not support Classification API")


def test_rerank_and_score_on_cross_encoder(cross_encoder):
    import torch

    server, path = cross_encoder
    ref = torch.sigmoid(_hf_logits(path, "BertForSequenceClassification", [QUERY] * len(DOCS),
                                   DOCS)[:, 0]).numpy()
    for route in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r = httpx.post(f"{server.url}{route}", json={"query": QUERY, "documents": DOCS,
                                                    "top_n": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("rerank-") and body["usage"]["total_tokens"] > 0
        order = np.argsort(-ref)[:2]
        assert [x["index"] for x in body["results"]] == order.tolist()
        for x in body["results"]:
            assert x["document"]["text"] == DOCS[x["index"]]
            assert x["relevance_score"] == pytest.approx(float(ref[x["index"]]), rel=1e-4)
    r = httpx.post(f"{server.url}/score", json={"text_1": [QUERY] * 3, "text_2": DOCS})
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], ref, rtol=1e-4)
    _error(httpx.post(f"{server.url}/score", json={"text_1": [QUERY] * 2, "text_2": DOCS}),
           400, "1:N")
    for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        r = httpx.post(f"{server.url}/v1/score", json={first: QUERY, second: DOCS})
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], ref, rtol=1e-4)
    _error(httpx.post(f"{server.url}/score", json={"queries": QUERY}), 400, "two sides")
    _error(httpx.post(f"{server.url}/rerank", json={"query": QUERY, "documents": []}), 400,
           "documents")
    _error(httpx.post(f"{server.url}/v1/embeddings", json={"input": "hi"}), 400,
           "does not support Embeddings API")


def test_classify(classifier):
    import torch

    server, path = classifier
    probs = torch.softmax(_hf_logits(path, "XLMRobertaForSequenceClassification", DOCS), -1)
    probs = probs.numpy()
    r = httpx.post(f"{server.url}/classify", json={"input": DOCS})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    np.testing.assert_allclose([d["probs"] for d in data], probs, rtol=1e-4, atol=1e-6)
    assert [d["label"] for d in data] == [f"LABEL_{i}" for i in probs.argmax(1)]
    assert all(d["num_classes"] == 3 for d in data)
    _error(httpx.post(f"{server.url}/rerank", json={"query": QUERY, "documents": DOCS}), 400,
           "does not support Rerank (Score) API")


def test_generate_server_refuses_pooling_endpoints(server):
    for path, body, api in (("/v1/embeddings", {"input": "hi"}, "Embeddings"),
                            ("/pooling", {"input": "hi"}, "Pooling"),
                            ("/score", {"text_1": "a", "text_2": "b"}, "Score"),
                            ("/v2/rerank", {"query": "a", "documents": ["b"]}, "Rerank"),
                            ("/classify", {"input": "hi"}, "Classification")):
        _error(httpx.post(f"{server.url}{path}", json=body), 400,
               f"does not support {api}")


def test_concurrent_requests_share_forwards(minilm_server, st_vectors, monkeypatch):
    """Requests arriving together are batched into shared forwards, each answer its own."""
    import asyncio

    async def run():
        async with httpx.AsyncClient(base_url=minilm_server.url, timeout=60) as c:
            return await asyncio.gather(*[
                c.post("/v1/embeddings", json={"input": TEXTS[i % 3]}) for i in range(24)])

    engine = minilm_server.app.state.engine_client.engine
    calls = []
    execute = engine.execute
    monkeypatch.setattr(engine, "execute", lambda inputs: calls.append(len(inputs))
                        or execute(inputs))
    responses = asyncio.run(run())
    for i, r in enumerate(responses):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], st_vectors[i % 3],
                                   atol=1e-5)
    assert sum(calls) == 24 and len(calls) < 24  # some forwards held several requests


def test_invocations_route_pooling_bodies(minilm_server, st_vectors):
    """SageMaker's /invocations: an embeddings body embeds, a score body scores."""
    r = httpx.post(f"{minilm_server.url}/invocations", json={"input": TEXTS[0]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], st_vectors[0], atol=1e-5)
    r = httpx.post(f"{minilm_server.url}/invocations", json={"text_1": TEXTS[0],
                                                            "text_2": TEXTS[0]})
    assert r.status_code == 200 and r.json()["data"][0]["score"] == pytest.approx(1, abs=1e-5)
    _error(httpx.post(f"{minilm_server.url}/invocations", json={"prompt": "hi"}), 400,
           "Completions API")
    _error(httpx.post(f"{minilm_server.url}/invocations", json={"foo": 1}), 400, "rerank")


def test_pooling_server_shared_routes(minilm_server):
    """/health, /v1/models, /tokenize and /metrics answer on a pooling server too."""
    url = minilm_server.url
    assert httpx.get(f"{url}/health").status_code == 200
    models = httpx.get(f"{url}/v1/models").json()["data"]
    assert models[0]["id"] == "minilm" and models[0]["max_model_len"] == 256
    tok = httpx.post(f"{url}/tokenize", json={"prompt": "hello world"}).json()
    assert tok["tokens"] == [101, 7592, 2088, 102]
    assert httpx.get(f"{url}/metrics").status_code == 200


def test_embeddings_chat_form(minilm_dir):
    """vLLM's chat form of /v1/embeddings: the messages rendered by the chat template, then
    embedded as those tokens (no special tokens added: the template's own)."""
    template = "{% for m in messages %}[CLS] {{ m['content'] }} [SEP]{% endfor %}"
    with _serve(minilm_dir, "m", chat_template=template) as s:
        msgs = [{"role": "user", "content": "hello there"}]
        r = httpx.post(f"{s.url}/v1/embeddings", json={"messages": msgs})
        assert r.status_code == 200, r.text
        ids = httpx.post(f"{s.url}/tokenize", json={"prompt": "hello there"}).json()["tokens"]
        want = httpx.post(f"{s.url}/v1/embeddings", json={"input": ids}).json()
        np.testing.assert_allclose(r.json()["data"][0]["embedding"],
                                   want["data"][0]["embedding"], atol=1e-6)
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
        _error(httpx.post(f"{s.url}/v1/embeddings", json={"messages": []}), 400, "messages")


def test_matryoshka_dimensions_through_openai_client(minilm_dir, tmp_path):
    from tests.models.pooling_checkpoints import make_st_checkpoint

    path = make_st_checkpoint("bert", str(tmp_path / "m"), minilm_dir, is_matryoshka=True)
    with _serve(path, "m") as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="EMPTY", max_retries=0)
        full = np.array(client.embeddings.create(model="m", input=TEXTS).data[0].embedding)
        short = client.embeddings.create(model="m", input=TEXTS, dimensions=16).data[0]
        assert len(short.embedding) == 16
        np.testing.assert_allclose(short.embedding, full[:16] / np.linalg.norm(full[:16]),
                                   atol=1e-6)
        with pytest.raises(openai.BadRequestError, match="dimensions"):
            client.embeddings.create(model="m", input="hi", dimensions=65)
