"""The CUDA kernel tests' shared fixture."""
import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A generator seeded by the test's own name (its parameters included): fresh inputs per
    case, the same ones every run."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))
