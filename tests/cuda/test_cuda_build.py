"""Without a GPU (CI, laptops): vllmx imports, reports CUDA as unavailable, and every CUDA entry
point fails with a RuntimeError that says why instead of crashing."""
import numpy as np
import pytest

import vllmx
from vllmx import _C, ops
from vllmx.device import F32, DeviceArray


def test_import_and_probe():
    assert vllmx.__name__ == "vllmx"
    assert isinstance(_C.cuda_available(), bool)
    assert isinstance(_C.cuda_built(), bool)
    assert _C.cuda_device_count() >= (1 if _C.cuda_available() else 0)
    stats = _C.cuda_memory_stats()
    assert stats["reserved"] >= stats["allocated"] >= 0


@pytest.mark.skipif(_C.cuda_available(), reason="a GPU is present")
def test_cuda_ops_raise_clearly_without_a_gpu():
    with pytest.raises(RuntimeError, match="CUDA|GPU"):
        DeviceArray.empty((4, 4), F32)
    with pytest.raises(RuntimeError, match="CUDA|GPU"):
        DeviceArray.from_numpy(np.zeros(3, np.float32))
    with pytest.raises(RuntimeError, match="CUDA|GPU"):
        _C.cuda_op_rms_norm(None, None, None, 1e-6)
    with pytest.raises(RuntimeError, match="CUDA|GPU"):
        _C.cuda_op_sample(None, None, None, None, None, None, None, None)
    with pytest.raises(RuntimeError, match="CUDA|GPU"):
        _C.cuda_synchronize()
    assert not ops.cuda_available()


def test_cpu_ops_refuse_device_arrays():
    fake = _C.DeviceArrayBase()  # no memory behind it: only the type matters
    with pytest.raises(TypeError, match="CPU op"):
        _C.op_rms_norm(np.empty((2, 4), np.float32), fake, np.ones(4, np.float32), 1e-6)
