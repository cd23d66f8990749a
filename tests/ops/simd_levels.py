"""Running a script in a fresh process whose SIMD level is capped (VLLMX_ISA, read once at
start-up), for the tests that compare each level's kernels with the scalar twins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllmx import _C

SIMD_LEVELS = ["scalar", "avx2", "avx512", "vnni"]


def run_capped(isa: str, script: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c script *args` with the kernels capped at `isa` (skips where the CPU lacks it),
    importing the same vllmx as this process."""
    info = _C.cpu_info()
    have = {"scalar": True, "avx2": info["avx2"], "avx512": info["avx512"],
            "vnni": info["avx512_vnni"]}
    if not have[isa]:
        pytest.skip(f"CPU lacks {isa}")
    env = dict(os.environ, VLLMX_ISA=isa)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
