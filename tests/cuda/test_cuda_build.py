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
        _C.cuda_synchronize()
    assert not ops.cuda_available()


def test_cuda_kernels_registered_as_built():
    """A CUDA build registers a CUDA kernel for the ops cuda/ implements; a CPU-only build none,
    and the op table then says so instead of running anything."""
    for name in ("embedding", "linear", "rms_norm", "paged_attention", "sample", "copy_columns",
                 "qk_norm_rope_cache", "rms_norm_linear", "apply_logits_processors",
                 "compute_logprobs", "topk_softmax", "softcap", "fill_uniform", "scale",
                 "fused_experts", "sigmoid_gate", "grouped_topk"):
        assert getattr(_C.ops, name).has_kernel("cuda") == _C.cuda_built(), name
    for name in ("dequantize", "quantize", "quantize_weight", "repack_weight"):
        assert not getattr(_C.ops, name).has_kernel("cuda"), name


def test_ops_refuse_a_device_array_without_memory():
    fake = _C.DeviceArrayBase()  # no buffer behind it
    with pytest.raises(ValueError, match="DeviceArray has no buffer"):
        _C.ops.rms_norm(np.empty((2, 4), np.float32), fake, np.ones(4, np.float32), 1e-6)
