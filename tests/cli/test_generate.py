"""`vllmx generate` with no --model runs the built-in default model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "vllmx.cli.main", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_default_model_knows_paris(smollm2_gguf):
    out = run_cli("generate", "The capital of France is", "--temperature", "0", "--max-tokens", "8")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_sampling_flags_and_seed_reproduce(smollm2_gguf):
    args = ("generate", "Once upon a time", "--model", smollm2_gguf, "--temperature", "0.9",
            "--top-p", "0.9", "--seed", "3", "--max-tokens", "12")
    a, b = run_cli(*args), run_cli(*args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.strip()


def test_missing_model_is_a_clear_error():
    out = run_cli("generate", "hi", "--model", "/no/such/model.gguf")
    assert out.returncode == 2
    assert "not found" in out.stderr


def test_chat_keeps_history(smollm2_gguf):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-m", "vllmx.cli.main", "chat", "--model", smollm2_gguf,
         "--temperature", "0", "--max-tokens", "8"],
        input="Hello!\nWhat did I just say?\n/exit\n", capture_output=True, text=True, env=env,
        timeout=300)
    assert out.returncode == 0, out.stderr
    assert len([line for line in out.stdout.splitlines() if line.strip()]) >= 2


def test_bench_throughput(smollm2_gguf):
    out = run_cli("bench", "throughput", "--model", smollm2_gguf, "--num-prompts", "4",
                  "--input-len", "16", "--output-len", "4")
    assert out.returncode == 0, out.stderr
    assert "requests/s" in out.stdout and "output tokens/s" in out.stdout
