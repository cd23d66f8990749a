

def test_sse_chunks_write_what_json_dumps_writes():
    """The stream's chunk lines are byte for byte json.dumps of the whole body, with and
    without usage, non-ASCII text and quotes in the fields included."""
    import json

    from vllmx.server.serving_engine import sse_chunks

    rid, model = 'cmpl-"ü"\\x', "mödel/ü"
    chunk = sse_chunks(rid, "text_completion", 1733, model)
    for choices, usage in [([{"index": 0, "text": "héllo \"\n", "logprobs": None}], None),
                           ([], {"prompt_tokens": 3, "completion_tokens": 2,
                                 "total_tokens": 5}),
                           ([{"index": 1, "delta": {"content": "✓"}}], {"a": 1})]:
        body = {"id": rid, "object": "text_completion", "created": 1733, "model": model,
                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        assert chunk(choices, usage) == f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
