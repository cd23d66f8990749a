"""topk_softmax on the GPU against the float64 reference (f32 router logits exactly; bf16 / f16
logits are compared with the reference on the same rounded values)."""
import numpy as np
import pytest

from tests.ops.test_moe_routing import reference
from vllmx import _C
from vllmx.device import BF16, F16, F32, I32, DeviceArray

from .test_cuda_ops import as_f32, host

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("shape", [(1, 8, 2), (37, 64, 6), (130, 128, 8), (5, 384, 8), (3, 7, 7)])
def test_topk_softmax(shape, renormalize, dtype):
    t, e, k = shape
    rng = np.random.default_rng(t + e + k)
    g = host((rng.standard_normal((t, e)) * 3).astype(np.float32), dtype)
    w = DeviceArray.empty((t, k), F32)
    ids = DeviceArray.empty((t, k), I32)
    _C.ops.topk_softmax(w, ids, DeviceArray.from_numpy(g, dtype), renormalize)
    w_ref, ids_ref = reference(as_f32(g, dtype), k, renormalize)
    np.testing.assert_array_equal(ids.numpy(), ids_ref)
    assert np.abs(w.numpy() - w_ref).max() < 1e-6
