"""apply_token_bitmask on the GPU against the CPU op on the same inputs (bit for bit: both only
write -inf), with and without row indices; then the Sampler with grammar masks, device logits
against host logits."""
import numpy as np
import pytest

from tests.ops.test_token_bitmask import random_bitmask
from vllmx import _C, ops
from vllmx.device import DeviceArray
from vllmx.layers.sampler import Sampler, SamplingMetadata

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("B,V", [(1, 7), (5, 1000), (33, 49152), (4, 151_937)])
@pytest.mark.parametrize("with_indices", [False, True])
def test_bitmask_matches_the_cpu(B, V, with_indices):
    rng = np.random.default_rng(B * V)
    logits = (rng.standard_normal((B, V)) * 4).astype(np.float32)
    indices = rng.permutation(B)[:max(1, B // 2)].astype(np.int32) if with_indices else None
    bitmask = random_bitmask(rng, B if indices is None else len(indices), V)
    cpu = logits.copy()
    _C.ops.apply_token_bitmask(cpu, bitmask, indices)
    dev = DeviceArray.from_numpy(logits)
    ops.apply_token_bitmask(dev, bitmask, indices)
    np.testing.assert_array_equal(dev.numpy().view(np.uint32), cpu.view(np.uint32))


def test_bitmask_bad_shape_is_refused_on_the_gpu():
    dev = DeviceArray.from_numpy(np.zeros((2, 70), np.float32))
    with pytest.raises(ValueError, match=r"apply_token_bitmask.*ceil\(V / 32\)"):
        ops.apply_token_bitmask(dev, np.zeros((2, 2), np.int32))


@pytest.mark.parametrize("logprobs", [-1, 3])
def test_sampler_with_grammar_masks_on_device_gives_the_host_tokens(logprobs):
    """Masked greedy and seeded rows beside free ones: the same tokens, log-probs and
    generators as the host sampler, and every masked row's token allowed by its mask."""
    rng = np.random.default_rng(3)
    B, V = 12, 5000
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    rows = np.array([0, 3, 4, 9], np.int32)
    bitmask = random_bitmask(rng, len(rows), V)

    def md():
        t = np.where(np.arange(B) % 2 == 0, 0.0, 0.9).astype(np.float32)
        r = np.random.default_rng(1)
        return SamplingMetadata(t, np.zeros(B, np.int32), np.ones(B, np.float32),
                                np.zeros(B, np.float32),
                                r.integers(1, 2**63, (B, 2)).astype(np.uint64),
                                np.full(B, logprobs, np.int32), {}, bitmask, rows)

    host_md, dev_md = md(), md()
    host = Sampler()(logits.copy(), host_md)
    dev = Sampler()(DeviceArray.from_numpy(logits), dev_md)
    np.testing.assert_array_equal(dev.sampled_token_ids, host.sampled_token_ids)
    np.testing.assert_array_equal(dev_md.rng_state, host_md.rng_state)
    assert np.abs(dev.sampled_logprobs - host.sampled_logprobs).max() < 1e-5
    for r, row in enumerate(rows):
        t = int(host.sampled_token_ids[row])
        assert (bitmask[r, t // 32].view(np.uint32) >> (t % 32)) & 1


def test_sampler_steps_in_flight_keep_their_own_staging():
    """Three steps launched the way asynchronous scheduling does (the next launched before the
    last one's result is read), each with its own masks, processors and logprob counts staged
    in the sampler's pinned buffers: each gives the host sampler's tokens, log-probs, lists
    and generators, so no step reads another's uploads or downloads."""
    from tests.cuda.test_cuda_sampler_processors import assert_same_sample
    from tests.ops.test_sampler_processors import make_batch, op_args

    rng = np.random.default_rng(11)
    B, V = 10, 4000

    def md(s, rows, nl, bitmask, processors):
        t = np.where(np.arange(B) % 3 == 0, 0.0, 0.7).astype(np.float32)
        r = np.random.default_rng(s)
        return SamplingMetadata(t, np.zeros(B, np.int32), np.ones(B, np.float32),
                                np.zeros(B, np.float32),
                                r.integers(1, 2**63, (B, 2)).astype(np.uint64), nl.copy(),
                                dict(processors), bitmask, rows)

    steps = []
    for s in range(3):
        rows = np.sort(rng.choice(B, 3 + s, replace=False)).astype(np.int32)
        args = (s, rows, rng.integers(-1, 6, B).astype(np.int32),
                random_bitmask(rng, len(rows), V), op_args(make_batch(rng, B, V)))
        steps.append((args, (rng.standard_normal((B, V)) * 3).astype(np.float32)))
    sampler = Sampler()
    dev_mds = [md(*args) for args, _ in steps]
    launched = [sampler.launch(DeviceArray.from_numpy(x), m)
                for (_, x), m in zip(steps[:2], dev_mds)]
    results = [launched[0].result()]
    launched.append(sampler.launch(DeviceArray.from_numpy(steps[2][1]), dev_mds[2]))
    results += [launched[1].result(), launched[2].result()]
    for (args, x), dev_md, dev in zip(steps, dev_mds, results):
        host_md = md(*args)
        assert_same_sample(dev, Sampler()(x.copy(), host_md), dev_md, host_md)
