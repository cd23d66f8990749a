"""The sampler on the GPU against the CPU ops on the same inputs: sample's tokens and generator
states (greedy, seeded, ties at the cuts, rows without a finite max), apply_logits_processors
bit for bit (the penalties are the same f32 operations), and
compute_logprobs' token log-prob (1e-5), rank and top lists exactly; then the Sampler end to
end, device logits against host logits."""
import numpy as np
import pytest

from tests.ops.test_sampler_processors import make_batch, op_args
from vllmx import _C, ops
from vllmx.device import F32, I32, DeviceArray
from vllmx.layers.sampler import MAX_DEVICE_TOP_LOGPROBS, Sampler, SamplingMetadata

pytestmark = pytest.mark.gpu


# ---- sampler ----
def sample_both(logits, temperature, top_k=0, top_p=1.0, min_p=0.0, seed=0):
    B = logits.shape[0]
    t = np.full(B, temperature, np.float32)
    k = np.full(B, top_k, np.int32)
    p = np.full(B, top_p, np.float32)
    m = np.full(B, min_p, np.float32)
    state = np.random.default_rng(seed).integers(1, 2**63, size=(B, 2), dtype=np.uint64)
    cpu_state = state.copy()
    ids = np.empty(B, np.int32)
    lps = np.empty(B, np.float32)
    _C.ops.sample(ids, lps, logits.copy(), t, k, p, m, cpu_state)
    d_state = DeviceArray.from_numpy(state)
    d_ids, d_lps = DeviceArray.empty(B, I32), DeviceArray.empty(B, F32)
    _C.ops.sample(d_ids, d_lps, DeviceArray.from_numpy(logits), DeviceArray.from_numpy(t),
                  DeviceArray.from_numpy(k), DeviceArray.from_numpy(p), DeviceArray.from_numpy(m),
                  d_state)
    return (ids, lps, cpu_state), (d_ids.numpy(), d_lps.numpy(), d_state.numpy())


@pytest.mark.parametrize("V", [7, 1000, 151936])
def test_sample_greedy_matches_cpu(rng, V):
    B = 16
    logits = rng.standard_normal((B, V)).astype(np.float32) * 4
    logits[1, [3, 5]] = logits[1].max() + 1  # a tie: the lower index wins
    logits[2, 0] = np.nan
    logits[3] = -np.inf
    (ids, lps, s_cpu), (g_ids, g_lps, s_gpu) = sample_both(logits, 0.0)
    np.testing.assert_array_equal(g_ids, ids)
    assert g_ids[1] == 3
    np.testing.assert_array_equal(s_gpu, s_cpu)  # greedy rows never advance the generator
    ok = np.isfinite(lps)
    np.testing.assert_allclose(g_lps[ok], lps[ok], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("V", [50, 32000])
@pytest.mark.parametrize("params", [
    {"temperature": 1.0},
    {"temperature": 0.7, "min_p": 0.05},
    {"temperature": 1.0, "top_k": 1},
    {"temperature": 0.9, "top_k": 40},
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 1.3, "top_k": 100, "top_p": 0.8},
    {"temperature": 1.0, "top_k": 20, "top_p": 0.95, "min_p": 0.01},
    {"temperature": 2.0, "top_p": 0.01},
])
def test_sample_seeded_matches_cpu(rng, V, params):
    B = 128
    logits = rng.standard_normal((B, V)).astype(np.float32) * 3
    (ids, lps, s_cpu), (g_ids, g_lps, s_gpu) = sample_both(logits, seed=V, **params)
    np.testing.assert_array_equal(g_ids, ids)
    np.testing.assert_array_equal(s_gpu, s_cpu)  # one generator output per row
    np.testing.assert_allclose(g_lps, lps, rtol=1e-5, atol=1e-5)


def test_sample_ties_at_the_cuts_match_cpu(rng):
    # Few distinct logit values: top_k and top_p cuts fall inside runs of equal weights.
    B, V = 64, 4096
    logits = rng.integers(0, 6, (B, V)).astype(np.float32)
    for params in ({"top_k": 7}, {"top_p": 0.3}, {"top_k": 500, "top_p": 0.5}):
        (ids, _, s_cpu), (g_ids, _, s_gpu) = sample_both(logits, 1.0, seed=7, **params)
        np.testing.assert_array_equal(g_ids, ids, err_msg=str(params))
        np.testing.assert_array_equal(s_gpu, s_cpu)


def test_sample_deterministic_and_distribution(rng):
    B, V = 4096, 8
    logits = np.tile(np.log(np.array([0.4, 0.3, 0.1, 0.1, 0.05, 0.03, 0.01, 0.01], np.float32)),
                     (B, 1))
    (_, _, _), (g1, _, _) = sample_both(logits, 1.0, top_k=3, seed=3)
    (_, _, _), (g2, _, _) = sample_both(logits, 1.0, top_k=3, seed=3)
    np.testing.assert_array_equal(g1, g2)
    assert set(np.unique(g1)) <= {0, 1, 2}
    freq = np.bincount(g1, minlength=V)[:3] / B
    np.testing.assert_allclose(freq, np.array([0.4, 0.3, 0.1]) / 0.8, atol=0.04)


def test_sample_random_rows_without_a_finite_max_take_one_draw(rng):
    V = 500
    logits = rng.standard_normal((4, V)).astype(np.float32)
    logits[0] = -np.inf
    logits[1] = np.nan
    (ids, _, s_cpu), (g_ids, _, s_gpu) = sample_both(logits, 0.9, seed=3)
    np.testing.assert_array_equal(g_ids, ids)
    np.testing.assert_array_equal(s_gpu, s_cpu)


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
