"""Running a benchmark's engines in processes of their own beside the gpu-peers bundle
(../shared/gpu-peers): vLLM's site folder and settings for vLLM's process only, and a worker's
result read back from its output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# vLLM's env.sh (gpu-peers): flashinfer is not bundled, so its sampler must stay off.
VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1"}


def engine_env(engine: str, vllm_site: str) -> dict:
    """The environment of an engine's process: vLLM's site folder and settings for vLLM only."""
    env = dict(os.environ)
    site = os.path.abspath(vllm_site)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and
             os.path.abspath(p) != site]
    if engine == "vllm":
        paths.insert(0, site)
        env.update(VLLM_ENV)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def worker_result(cmd: list[str], env: dict, timeout: float) -> dict:
    """Runs a worker process; its result is the last stdout line "RESULT {json}", or
    {"error": ...} when it failed or ran past timeout (its output's tail printed either way)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        sys.stdout.write(out[-3000:])
        return {"error": f"timed out after {timeout} s"}
    sys.stdout.write(proc.stdout[-3000:])
    # vLLM's engine process shares the pipe and may log after the result: take the last one.
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        sys.stdout.write(proc.stderr[-5000:])
        return {"error": proc.stderr[-2000:]}
    return json.loads(results[-1][len("RESULT "):])
