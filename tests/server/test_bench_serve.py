"""`vllmx bench serve` against the test server: exact token counts, vLLM's metric keys."""

from __future__ import annotations

import json

from vllmx.cli.main import main


def test_bench_serve_random(server, smollm2_gguf, tmp_path, capsys):
    out_file = tmp_path / "result.json"
    rc = main(["bench", "serve", "--base-url", server.url, "--tokenizer", smollm2_gguf,
               "--dataset-name", "random", "--num-prompts", "8", "--random-input-len", "32",
               "--random-output-len", "8", "--max-concurrency", "4", "--ignore-eos",
               "--request-rate", "50", "--save-result", "--result-filename", str(out_file)])
    assert rc == 0
    table = capsys.readouterr().out
    for label in ("Successful requests:", "Request throughput (req/s):",
                  "Output token throughput (tok/s):", "Mean TTFT (ms):", "P99 TPOT (ms):",
                  "Median ITL (ms):", "Mean E2EL (ms):"):
        assert label in table
    r = json.loads(out_file.read_text())
    assert r["completed"] == 8 and r["failed"] == 0
    assert r["total_input_tokens"] == 8 * 32 and r["total_output_tokens"] == 8 * 8
    assert r["output_lens"] == [8] * 8
    # One gap per streamed chunk: 7 for 8 tokens, fewer where a lagging stream's tokens
    # were merged into one chunk (engine/output_collector.py), as vLLM's server does.
    assert all(1 <= len(itl) <= 7 for itl in r["itls"])
    assert 0 < r["mean_ttft_ms"] <= r["mean_e2el_ms"]
    assert r["median_tpot_ms"] > 0 and r["request_throughput"] > 0


def test_bench_serve_sharegpt(server, smollm2_gguf, tmp_path, capsys):
    conv = [{"conversations": [{"from": "human", "value": f"Tell me about the number {i}, "
                                "please, in a few words."},
                               {"from": "gpt", "value": "It is a number that is nice."}]}
            for i in range(6)]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conv))
    rc = main(["bench", "serve", "--base-url", server.url, "--tokenizer", smollm2_gguf,
               "--dataset-name", "sharegpt", "--dataset-path", str(path), "--num-prompts", "4",
               "--sharegpt-output-len", "5", "--ignore-eos"])
    assert rc == 0
    assert "Successful requests:                     4" in capsys.readouterr().out
