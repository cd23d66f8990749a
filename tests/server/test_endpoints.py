"""/v1/models, /health, /version, /tokenize, /detokenize, /metrics, --api-key."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import vllmx
from tests.server.conftest import MODEL, ServerThread
from vllmx.config import ObservabilityConfig
from vllmx.engine.arg_utils import EngineArgs
from vllmx.server.app import build_app
from vllmx.server.metrics import HIDDEN_METRICS, ServerMetrics


def test_models_version_health(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] == 512
    assert httpx.get(f"{server.url}/version").json() == {"version": vllmx.__version__}
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_tokenize_detokenize(server, engine_client):
    text = "Hello, world! Tokenize me."
    r = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "prompt": text,
                                                  "return_token_strs": True}).json()
    assert r["tokens"] == engine_client.tokenizer.encode(text)
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 512
    assert len(r["token_strs"]) == r["count"]
    back = httpx.post(f"{server.url}/detokenize", json={"model": MODEL, "tokens": r["tokens"]})
    assert back.json() == {"prompt": text}
    bad = httpx.post(f"{server.url}/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]
    chat = httpx.post(f"{server.url}/tokenize", json={
        "messages": [{"role": "user", "content": "hi"}]}).json()
    ids = engine_client.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert chat["tokens"] == ids


def test_metrics_after_traffic(client, server):
    before = {name: server.metric(f"vllm:{name}") for name in
              ("prompt_tokens_total", "generation_tokens_total",
               "time_to_first_token_seconds_count", "e2e_request_latency_seconds_count",
               "request_queue_time_seconds_count", "inter_token_latency_seconds_count",
               "prefix_cache_queries_total")}
    length_before = server.metric("vllm:request_success_total", finished_reason="length")
    out = client.completions.create(model=MODEL, prompt="Metrics are", temperature=0,
                                    max_tokens=5)
    after = {name: server.metric(f"vllm:{name}") for name in before}
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == out.usage.prompt_tokens
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 5
    for name in ("time_to_first_token_seconds_count", "e2e_request_latency_seconds_count",
                 "request_queue_time_seconds_count"):
        assert after[name] - before[name] == 1
    assert after["inter_token_latency_seconds_count"] - before[
        "inter_token_latency_seconds_count"] == 4
    assert after["prefix_cache_queries_total"] >= before["prefix_cache_queries_total"]
    assert server.metric("vllm:request_success_total", finished_reason="length") == \
        length_before + 1
    text = server.metrics_text()
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_hits_total", "num_preemptions_total"):
        assert f'vllm:{name}{{model_name="{MODEL}"}}' in text
    assert server.metric("vllm:num_requests_running") == 0


# vLLM's metric families (its tests/entrypoints/openai/test_metrics.py reads these), besides
# the ones test_metrics_after_traffic checks.
VLLM_HISTOGRAMS = ("request_prompt_tokens", "request_generation_tokens", "request_params_n",
                   "request_params_max_tokens", "request_inference_time_seconds",
                   "request_prefill_time_seconds", "request_decode_time_seconds",
                   "iteration_tokens_total", "time_to_first_token_seconds",
                   "inter_token_latency_seconds", "e2e_request_latency_seconds",
                   "request_queue_time_seconds")


def test_metrics_counts_as_vllm(client, server, engine_client):
    """vLLM's expected values for N sequential requests of P prompt tokens and M new tokens:
    per-request histograms count N with sums N * P and N * M; iteration_tokens_total observes
    each step's completed prompts plus generated tokens (M steps a request, summing P + M)."""
    def sample(name):
        return {k: server.metric(f"vllm:{name}_{k}") for k in ("count", "sum")}

    before = {h: sample(h) for h in VLLM_HISTOGRAMS}
    prompt = engine_client.tokenizer.encode("Hello my name is Robert and I love magic")
    n_req, max_tokens = 4, 6
    for _ in range(n_req):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                        temperature=0, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == max_tokens
    d = {h: {k: sample(h)[k] - before[h][k] for k in ("count", "sum")} for h in VLLM_HISTOGRAMS}
    P = len(prompt)
    for h in VLLM_HISTOGRAMS:
        if h not in ("iteration_tokens_total", "inter_token_latency_seconds"):
            assert d[h]["count"] == n_req, h
    assert d["request_prompt_tokens"]["sum"] == n_req * P
    assert d["request_generation_tokens"]["sum"] == n_req * max_tokens
    assert d["request_params_n"]["sum"] == n_req
    assert d["request_params_max_tokens"]["sum"] == n_req * max_tokens
    assert d["iteration_tokens_total"]["count"] == n_req * max_tokens
    assert d["iteration_tokens_total"]["sum"] == n_req * (P + max_tokens)
    for h in ("request_inference_time_seconds", "request_prefill_time_seconds",
              "request_decode_time_seconds"):
        assert d[h]["sum"] > 0, h
    # Cumulative buckets: the +Inf one is the count, and they never decrease.
    text = server.metrics_text()
    buckets = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:iteration_tokens_total_bucket")]
    assert buckets == sorted(buckets)
    assert buckets[-1] == server.metric("vllm:iteration_tokens_total_count")
    cc = engine_client.vllm_config.cache_config
    assert server.metric("vllm:cache_config_info", block_size=str(cc.block_size),
                         num_gpu_blocks=str(cc.num_blocks), cpu_offload_gb="0",
                         swap_space_bytes="0", num_cpu_blocks="None",
                         sliding_window="None") == 1.0


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, labels) -> value of a /metrics page."""
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


def _renamed(samples: dict, old: str, new: str) -> dict:
    """The samples of metric `old`, named as `new` (vLLM's hidden metric and its replacement)."""
    return {(name.replace(old, new, 1), labels): v for (name, labels), v in samples.items()
            if name.startswith(old)}


def test_hidden_metrics_absent_by_default(client, server):
    client.completions.create(model=MODEL, prompt="Hidden", temperature=0, max_tokens=3)
    text = server.metrics_text()
    assert "vllm:kv_cache_usage_perc" in text
    for name in HIDDEN_METRICS:
        assert name not in text, name


def test_hidden_metrics_shown_with_the_flag(engine_client, monkeypatch):
    """--show-hidden-metrics-for-version 0.10 (vLLM 0.11's escape hatch; vllmx's own previous
    minor version 0.0 the same): vLLM's deprecated names, each with exactly its replacement's
    samples, scraped while a request holds KV blocks and after a prefix cache hit."""
    monkeypatch.setattr(engine_client.vllm_config, "observability_config",
                        ObservabilityConfig("0.10"))
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None)) as s:
        c = s.openai_client()
        prompt = "The prefix cache counts this prompt's blocks the second time. " * 4
        for _ in range(2):
            c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
        stream = c.completions.create(model=MODEL, prompt="Keep going", max_tokens=12,
                                      stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        during = _samples(s.metrics_text())
        for _ in stream:
            pass
        after = _samples(s.metrics_text())
    key = ("vllm:gpu_cache_usage_perc", (("model_name", MODEL),))
    assert during[key] > 0  # blocks held by the stream
    for old, (new, _) in HIDDEN_METRICS.items():
        for samples in (during, after):
            mirrored = _renamed(samples, old, new)
            assert mirrored and mirrored == _renamed(samples, new, new), old
    assert after[("vllm:gpu_prefix_cache_hits_total", (("model_name", MODEL),))] > 0
    # this app's requests: 1 + 1 + 11 gaps between tokens
    assert after[("vllm:time_per_output_token_seconds_count", (("model_name", MODEL),))] == 13


def test_hidden_metrics_by_version(engine_client, monkeypatch):
    """Each hidden metric is shown for the versions before the vLLM release that hid it."""
    for version, shown in (("0.11", {"vllm:time_per_output_token_seconds"}),
                           ("0.0", set(HIDDEN_METRICS)), ("0.12", set()), ("1.0", set())):
        monkeypatch.setattr(engine_client.vllm_config, "observability_config",
                            ObservabilityConfig(version))
        text = ServerMetrics(engine_client, MODEL).render().decode()
        assert {n for n in HIDDEN_METRICS if n in text} == shown, version


@pytest.mark.parametrize("value", ["abc", "latest", "0.x", "", "0..10"])
def test_hidden_metrics_version_must_be_a_version(value):
    with pytest.raises(ValueError, match=f"Invalid version: '{value}'"):
        EngineArgs(show_hidden_metrics_for_version=value).create_engine_config()


def test_stat_logger_line(client, server):
    client.completions.create(model=MODEL, prompt="Log me", temperature=0, max_tokens=3)
    line = server.app.state.stat_logger.log()  # tokens since the last line: one is printed
    assert "Avg generation throughput" in line and "Running: 0 reqs" in line
    assert "KV cache usage: 0.0%" in line


def test_api_key_protects_v1(engine_client):
    with ServerThread(build_app(engine_client, [MODEL], api_key="sekrit",
                                log_stats_interval=None)) as s:
        bad = openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=f"{s.url}/v1", api_key="sekrit", max_retries=0)
        assert good.models.list().data[0].id == MODEL
        assert httpx.get(f"{s.url}/health").status_code == 200  # outside /v1: open


def test_cors(engine_client):
    with ServerThread(build_app(engine_client, [MODEL], allowed_origins=["*"],
                                log_stats_interval=None)) as s:
        r = httpx.options(f"{s.url}/v1/models", headers={
            "Origin": "http://example.com", "Access-Control-Request-Method": "GET"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] in (
            "*", "http://example.com")


def test_invocations_routes_by_body(client, server):
    """SageMaker's /invocations (vLLM's): 'messages' is a chat completion, 'prompt' a
    completion; the answers are those of the routes themselves."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 6, "temperature": 0}
    got = httpx.post(f"{server.url}/invocations", json=chat, timeout=60).json()
    want = client.chat.completions.create(**chat)
    assert got["object"] == "chat.completion"
    assert got["choices"][0]["message"]["content"] == want.choices[0].message.content
    comp = {"model": MODEL, "prompt": "The sky is", "max_tokens": 6, "temperature": 0}
    got = httpx.post(f"{server.url}/invocations", json=comp, timeout=60).json()
    assert got["object"] == "text_completion"
    assert got["choices"][0]["text"] == client.completions.create(**comp).choices[0].text
    for body, needle in (({"model": MODEL, "input": "x"}, "'messages'"),
                         ([1, 2], "'messages'"),
                         ({"model": MODEL, "prompt": "x", "max_tokens": -3}, "max_tokens")):
        r = httpx.post(f"{server.url}/invocations", json=body)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    r = httpx.post(f"{server.url}/invocations", content=b"{not json",
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"


def test_load_endpoint(engine_client, server):
    assert httpx.get(f"{server.url}/load").json() == {"server_load": 0}  # tracking off
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                enable_server_load_tracking=True)) as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="EMPTY", max_retries=0)
        stream = c.completions.create(model=MODEL, prompt="Count", max_tokens=20, stream=True,
                                      extra_body={"ignore_eos": True})
        next(iter(stream))  # in flight until the stream ends
        assert httpx.get(f"{s.url}/load").json() == {"server_load": 1}
        for _ in stream:
            pass
        s.wait_for(lambda: httpx.get(f"{s.url}/load").json()["server_load"] == 0)
        c.completions.create(model=MODEL, prompt="Once", max_tokens=2)
        assert httpx.get(f"{s.url}/load").json() == {"server_load": 0}
        bad = httpx.post(f"{s.url}/v1/completions", json={"model": "nope", "prompt": "x"})
        assert bad.status_code == 404
        assert httpx.get(f"{s.url}/load").json() == {"server_load": 0}  # failures give it back


def test_tokenizer_info_endpoint(engine_client, server):
    assert httpx.get(f"{server.url}/tokenizer_info").status_code == 404  # off by default
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                enable_tokenizer_info_endpoint=True)) as s:
        info = httpx.get(f"{s.url}/tokenizer_info").json()
        tok = engine_client.tokenizer
        assert info["tokenizer_class"] and isinstance(info["tokenizer_class"], str)
        assert info["eos_token"] == tok.eos_token
        assert isinstance(info["chat_template"], str) and info["chat_template"].strip()
        count = httpx.post(f"{s.url}/tokenize", json={"model": MODEL, "prompt": "Hi"}).json()
        assert info["model_max_length"] >= count["max_model_len"]
        assert info["added_tokens_decoder"]
        for token_id, entry in info["added_tokens_decoder"].items():
            assert tok.convert_ids_to_tokens(int(token_id)) == entry["content"]
            assert isinstance(entry["special"], bool)
