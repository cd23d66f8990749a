"""The sm_80 kernels (mma.sync GEMM and prefill attention) on a Hopper GPU, where the sm_90a
ones (CUTLASS GEMM, wgmma prefill attention, the grouped wgmma GEMM of fused_experts) would
otherwise take their shapes: the same linear, attention and fused_experts tests in a process
with VLLMX_CUDA_SM90=0 (read once at start-up), so both families keep running against the
float64 references on one machine."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllmx import _C

pytestmark = pytest.mark.gpu


def test_sm80_kernels_on_hopper():
    if not (_C.cuda_built() and _C.cuda_available()):
        pytest.skip("needs a CUDA GPU")
    if not _C.cuda_sm90_kernels():
        pytest.skip("the sm_90a kernels are not in use here: the main suite runs the sm_80 ones")
    env = dict(os.environ, VLLMX_CUDA_SM90="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    probe = subprocess.run([sys.executable, "-c",
                            "from vllmx import _C; print(_C.cuda_sm90_kernels())"],
                           env=env, capture_output=True, text=True, timeout=120, check=False)
    assert probe.stdout.strip() == "False", probe.stdout + probe.stderr
    here = os.path.dirname(os.path.abspath(__file__))
    tests = ("linear_dense or linear_skinny or (attention and (prefill or chunked or long)) or "
             "fused_experts")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", os.path.join(here, "test_cuda_linear.py"),
         os.path.join(here, "test_cuda_attention.py"), os.path.join(here, "test_cuda_moe.py"),
         "-q", "-x", "-p", "no:cacheprovider", "-m",
         "gpu", "-k", tests],
        env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
