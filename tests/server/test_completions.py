"""/v1/completions through the official openai client."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL

PROMPT = "The capital of France is"


def greedy(client, prompt=PROMPT, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, temperature=0,
                                     max_tokens=kw.pop("max_tokens", 8), **kw)


def test_completion_text_and_usage(client, engine_client):
    out = greedy(client)
    assert "Paris" in out.choices[0].text
    assert out.object == "text_completion" and out.model == MODEL
    assert out.choices[0].finish_reason == "length"
    n_prompt = len(engine_client.tokenizer.encode(PROMPT))
    assert out.usage.prompt_tokens == n_prompt
    assert out.usage.completion_tokens == 8
    assert out.usage.total_tokens == n_prompt + 8


def test_stream_equals_full_and_usage(client):
    full = greedy(client, max_tokens=12).choices[0].text
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_continuous_usage_stats(client):
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
               for c in chunks)


def test_n_choices_with_seed(client):
    kw = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "n": 3,
          "temperature": 1.0, "seed": 7, "logprobs": 0}
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # seeded
    assert len({c.text for c in a.choices}) > 1  # the samples differ from each other
    assert a.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in a.choices)


def test_batch_of_prompts_matches_single(client):
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    batch = client.completions.create(model=MODEL, prompt=prompts, temperature=0, max_tokens=6)
    single = [greedy(client, p, max_tokens=6).choices[0].text for p in prompts]
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == single


def test_token_id_prompt(client, engine_client):
    ids = engine_client.tokenizer.encode(PROMPT)
    assert greedy(client, ids).choices[0].text == greedy(client).choices[0].text


def test_logprobs(client):
    out = greedy(client, logprobs=2, max_tokens=6).choices[0]
    lp = out.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == out.text
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert val <= 0 and top[tok] == val
        assert 2 <= len(top) <= 3
        assert val == max(top.values())  # greedy picks the most likely token
    offsets = [0]
    for t in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp.text_offset == offsets


def test_echo(client):
    out = greedy(client, echo=True, max_tokens=4).choices[0].text
    assert out.startswith(PROMPT) and out[len(PROMPT):] == greedy(
        client, max_tokens=4).choices[0].text


def test_stop_string(client):
    text = greedy(client, "1, 2, 3, 4,", max_tokens=16).choices[0].text
    assert " 7" in text
    out = greedy(client, "1, 2, 3, 4,", max_tokens=16, stop=[" 7"]).choices[0]
    assert out.text == text[:text.index(" 7")]
    assert out.finish_reason == "stop" and out.model_extra["stop_reason"] == " 7"
    inc = greedy(client, "1, 2, 3, 4,", max_tokens=16, stop=" 7",
                 extra_body={"include_stop_str_in_output": True}).choices[0]
    assert inc.text == text[:text.index(" 7") + 2]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=16, stop=[" 7"],
        stream=True))
    assert streamed == out.text


def test_extra_body_params(client, engine_client):
    base = greedy(client, max_tokens=8).choices[0]
    out = greedy(client, max_tokens=8, extra_body={
        "top_k": 5, "min_p": 0.05, "ignore_eos": True, "min_tokens": 8,
        "skip_special_tokens": True, "priority": 0, "request_id": "my-id-1"})
    assert out.id == "cmpl-my-id-1"
    assert out.choices[0].text == base.text  # greedy: the filters change nothing
    assert base.text.startswith(" Paris.")
    dot = engine_client.tokenizer.encode(".", add_special_tokens=False)
    assert len(dot) == 1
    stopped = greedy(client, max_tokens=8, extra_body={"stop_token_ids": dot}).choices[0]
    # As vLLM: the stop token's text is left out unless include_stop_str_in_output.
    assert stopped.text == " Paris" and stopped.finish_reason == "stop"
    kept = greedy(client, max_tokens=8, extra_body={"stop_token_ids": dot,
                                                    "include_stop_str_in_output": True})
    assert kept.choices[0].text == " Paris."
    assert stopped.model_extra["stop_reason"] == dot[0]


def test_use_beam_search(client):
    """use_beam_search (vLLM's): n distinct beams as the n choices; one beam is greedy
    decoding; streamed, the same texts; what beam search would leave unused is a 400 naming
    it. (The search itself: tests/engine/test_beam_search.py.)"""
    prompt = "The capital of France is"
    resp = client.completions.create(model=MODEL, prompt=prompt, n=3, max_tokens=5,
                                     temperature=0,
                                     extra_body={"use_beam_search": True, "ignore_eos": True})
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert len({c.text for c in resp.choices}) == 3
    assert resp.usage.completion_tokens == 15
    assert all(c.finish_reason == "length" for c in resp.choices)

    greedy = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                       extra_body={"use_beam_search": True, "ignore_eos": True})
    assert len(greedy.choices) == 1
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert greedy.choices[0].text == plain.choices[0].text  # one beam is greedy decoding
    chunks = list(client.completions.create(
        model=MODEL, prompt=prompt, n=3, max_tokens=5, temperature=0, stream=True,
        extra_body={"use_beam_search": True, "ignore_eos": True}))
    streamed = {}
    for ch in chunks:
        for c in ch.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(3)] == [c.text for c in resp.choices]
    for field, value in (("logprobs", 2), ("stop", ["x"]), ("top_p", 0.5)):
        with pytest.raises(openai.BadRequestError, match=f"{field} is not supported with "
                                                         "use_beam_search"):
            client.completions.create(model=MODEL, prompt=prompt, n=2, max_tokens=3,
                                      **{field: value}, extra_body={"use_beam_search": True})


def test_response_keys_are_vllms(server):
    """Every key of vLLM 0.26's completion and chat response models (its model_dump; null where
    vllmx has nothing to say), so that a client comparing /invocations' raw JSON with the openai
    client's parsed object, or reading a key vLLM always sends, finds the same shape."""
    import httpx

    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}).json()
    assert set(r) == {"id", "object", "created", "model", "choices", "service_tier",
                      "system_fingerprint", "usage", "kv_transfer_params", "ec_transfer_params",
                      "metrics"}
    assert r["service_tier"] is None and r["system_fingerprint"].startswith("vllmx-")
    assert set(r["choices"][0]) == {"index", "text", "logprobs", "finish_reason", "stop_reason",
                                    "token_ids", "prompt_logprobs", "prompt_token_ids",
                                    "routed_experts"}
    assert set(r["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens",
                               "prompt_tokens_details"}
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                         "max_tokens": 2}).json()
    assert set(r) == {"id", "object", "created", "model", "choices", "service_tier",
                      "system_fingerprint", "usage", "prompt_logprobs", "prompt_token_ids",
                      "prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics"}
    assert set(r["choices"][0]) == {"index", "message", "logprobs", "finish_reason",
                                    "stop_reason", "token_ids", "routed_experts"}
    # (tool_calls only when there are calls, as vLLM's serializer drops an empty list)
    assert set(r["choices"][0]["message"]) == {"role", "content", "refusal", "annotations",
                                               "audio", "function_call", "reasoning"}


def test_vllm_response_fields(client, server, engine_client):
    """vLLM's: completions always carry prompt_logprobs (null unless asked); chat answers
    prompt_logprobs at the top level; return_tokens_as_token_ids names logprob tokens
    'token_id:<id>' (request field, or the server's --return-tokens-as-token-ids); any chat role
    reaches the template."""
    import httpx

    from tests.server.conftest import ServerThread
    from vllmx.server.app import build_app

    url = server.url
    r = httpx.post(f"{url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}).json()
    assert "prompt_logprobs" in r["choices"][0] and r["choices"][0]["prompt_logprobs"] is None
    msgs = [{"role": "user", "content": "Hi"}]
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": msgs, "max_tokens": 2,
                         "prompt_logprobs": 0}).json()
    ids = engine_client.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    plp = r["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    assert all(list(step) == [str(t)] for step, t in zip(plp[1:], ids[1:]))
    r = httpx.post(f"{url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 3, "logprobs": 1,
                         "return_tokens_as_token_ids": True}).json()
    toks = r["choices"][0]["logprobs"]["tokens"]
    assert len(toks) == 3 and all(t.startswith("token_id:") for t in toks)
    ids_out = [int(t.split(":")[1]) for t in toks]
    assert engine_client.tokenizer.decode(ids_out) == r["choices"][0]["text"]
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": msgs, "max_tokens": 2, "logprobs": True,
                         "top_logprobs": 2, "return_tokens_as_token_ids": True}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert all(c["token"].startswith("token_id:") for c in content)
    assert all(t["token"].startswith("token_id:") for c in content for t in c["top_logprobs"])
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                return_tokens_as_token_ids=True)) as s:
        got = httpx.post(f"{s.url}/v1/completions", timeout=60,
                         json={"model": MODEL, "prompt": "Hi", "max_tokens": 2,
                               "logprobs": 0}).json()
        assert all(t.startswith("token_id:") for t in got["choices"][0]["logprobs"]["tokens"])
        got = httpx.post(f"{s.url}/v1/completions", timeout=60,
                         json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, "logprobs": 0,
                               "return_tokens_as_token_ids": False}).json()
        assert not any(t.startswith("token_id:")
                       for t in got["choices"][0]["logprobs"]["tokens"])
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "max_tokens": 2,
                         "messages": [{"role": "narrator", "content": "Once"},
                                      {"role": "user", "content": "Go on"}]})
    assert r.status_code == 200, r.text


def test_chat_top_logprobs_minus_one_is_the_vocabulary(server, engine_client):
    """vLLM's top_logprobs = -1: every token of the vocabulary, allowed only where
    --max-logprobs allows that many (else the engine's "greater than max allowed" 400)."""
    import httpx

    from tests.server.conftest import ServerThread
    from vllmx.server.app import build_app

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "logprobs": True, "top_logprobs": -1}
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json=body)
    assert r.status_code == 400 and "greater than max allowed" in r.json()["error"]["message"]
    mc = engine_client.vllm_config.model_config
    old, mc.max_logprobs = mc.max_logprobs, -1
    try:
        with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None)) as s:
            r = httpx.post(f"{s.url}/v1/chat/completions", timeout=120, json=body)
            # Without max_tokens the answer may run to the context's end: the whole vocabulary
            # at each of those positions is more than a request may hold (it had taken the
            # server past 24 GB), a 400 naming the bound, and the server goes on.
            long = httpx.post(f"{s.url}/v1/chat/completions", timeout=60,
                              json={**body, "max_tokens": None})
            again = httpx.post(f"{s.url}/v1/chat/completions", timeout=60,
                               json={**body, "top_logprobs": 2})
    finally:
        mc.max_logprobs = old
    assert long.status_code == 400 and "max_logprob_entries" in long.json()["error"]["message"]
    assert again.status_code == 200, again.text
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 2
    assert all(len(c["top_logprobs"]) == mc.vocab_size for c in content)
