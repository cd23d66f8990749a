"""The sampler's processors and logprobs on the GPU against the CPU ops on the same inputs:
apply_logits_processors bit for bit (the penalties are the same f32 operations), and
compute_logprobs' token log-prob (1e-5), rank and top lists exactly; then the Sampler end to
end, device logits against host logits."""
import numpy as np
import pytest

from tests.ops.test_sampler_processors import make_batch, op_args
from vllmx import _C, ops
from vllmx.device import F32, I32, DeviceArray
from vllmx.layers.sampler import MAX_DEVICE_TOP_LOGPROBS, Sampler, SamplingMetadata

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("B,V", [(1, 50), (12, 1000), (33, 32000)])
def test_processors_match_the_cpu_bit_for_bit(B, V):
    rng = np.random.default_rng(B * V)
    args = op_args(make_batch(rng, B, V))
    logits = (rng.standard_normal((B, V)) * 4).astype(np.float32)
    cpu = logits.copy()
    _C.ops.apply_logits_processors(cpu, **args)
    dev = DeviceArray.from_numpy(logits)
    ops.apply_logits_processors(dev, **args)
    np.testing.assert_array_equal(dev.numpy().view(np.uint32), cpu.view(np.uint32))


@pytest.mark.parametrize("B,V,K", [(1, 10, 3), (9, 5000, 20), (40, 32000, MAX_DEVICE_TOP_LOGPROBS)])
def test_logprobs_match_the_cpu(B, V, K):
    rng = np.random.default_rng(V + K)
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    logits[:, 1::7] = logits[:, 0:1]  # ties: the lower id ranks first
    logits[0, 3] = np.nan  # NaN ranks as -inf, below everything
    tokens = rng.integers(0, V, B).astype(np.int32)
    counts = rng.integers(-1, K + 1, B).astype(np.int32)
    counts[0] = K
    want = ops.compute_logprobs(logits, tokens, counts)
    got = [a.numpy() for a in ops.compute_logprobs(DeviceArray.from_numpy(logits), tokens, counts)]
    assert np.abs(got[0] - want[0]).max() < 1e-5
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    finite = np.isfinite(want[3])
    np.testing.assert_array_equal(np.isfinite(got[3]), finite)
    assert np.abs(got[3][finite] - want[3][finite]).max() < 1e-5


def test_logprobs_past_the_device_limit_are_refused():
    logits = DeviceArray.from_numpy(np.zeros((1, 100), np.float32))
    k = MAX_DEVICE_TOP_LOGPROBS + 1
    out = [DeviceArray.empty((1,), F32), DeviceArray.empty((1,), I32),
           DeviceArray.empty((1, k), I32), DeviceArray.empty((1, k), F32)]
    with pytest.raises(ValueError, match=f"at most {MAX_DEVICE_TOP_LOGPROBS} top logprobs"):
        _C.ops.compute_logprobs(*out, logits, DeviceArray.from_numpy(np.zeros(1, np.int32)),
                                DeviceArray.from_numpy(np.full(1, k, np.int32)))


@pytest.mark.parametrize("logprobs", [-1, 5, MAX_DEVICE_TOP_LOGPROBS + 1])
def test_sampler_on_device_gives_the_host_tokens(logprobs):
    """Greedy and seeded rows with every processor: the device sampler's tokens, log-probs,
    logprob lists and advanced generators are the host sampler's."""
    rng = np.random.default_rng(7)
    B, V = 16, 3000
    processors = op_args(make_batch(rng, B, V))
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)

    def md():
        t = np.where(np.arange(B) % 2 == 0, 0.0, 0.8).astype(np.float32)
        nl = np.full(B, logprobs, np.int32)
        nl[::3] = -1
        r = np.random.default_rng(1)
        return SamplingMetadata(t, np.zeros(B, np.int32), np.ones(B, np.float32),
                                np.zeros(B, np.float32),
                                r.integers(1, 2**63, (B, 2)).astype(np.uint64), nl,
                                dict(processors))

    host_md, dev_md = md(), md()
    host = Sampler()(logits.copy(), host_md)
    dev = Sampler()(DeviceArray.from_numpy(logits), dev_md)
    assert_same_sample(dev, host, dev_md, host_md)


def assert_same_sample(dev, host, dev_md, host_md):
    """The device sampler's output is the host's: tokens, advanced generators, log-probs
    (1e-5) and logprob lists."""
    np.testing.assert_array_equal(dev.sampled_token_ids, host.sampled_token_ids)
    np.testing.assert_array_equal(dev_md.rng_state, host_md.rng_state)
    assert np.abs(dev.sampled_logprobs - host.sampled_logprobs).max() < 1e-5
    for d, h in zip(dev.logprobs, host.logprobs):
        assert (d is None) == (h is None)
        if d is not None:
            assert d.token_ids == h.token_ids and d.rank == h.rank
            assert np.allclose(d.logprobs, h.logprobs, atol=1e-5)
