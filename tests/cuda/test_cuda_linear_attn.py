"""The hybrid mixers' CUDA ops (cuda/linear_attn.cu, rms_norm_gated among them)
against the CPU ops on the same rounded inputs: causal_conv1d, gated_delta_rule and mamba2_scan
over sequences and state slots (outputs within the dtype's tolerance, the updated f32 states
within f32 rounding or exactly), with some rows also saving their state into extra slots
(spec_state_indices, speculative decoding's rollback), and the gated RMSNorm."""
import numpy as np
import pytest

from vllmx import _C
from vllmx.device import BF16, DeviceArray

from .test_cuda_ops import ACT, F32, as_f32, assert_close, dev, rounded

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("K", [4, 2, 8])
@pytest.mark.parametrize("lens", [[7, 0, 1, 2, 30], [1, 0, 1, 2, 5]], ids=["prefill", "decode"])
def test_causal_conv1d(rng, dtype, K, lens):
    """The hybrids' depthwise causal convolution against the CPU op: sequences longer and
    shorter than the window, an empty one, decode rows, slots continued (has_initial_state) or
    started, a slot no sequence names left alone; a prefill batch (rows >= 2 sequences: the
    token-parallel kernel, 16-row tiles across sequences, then the windows) and a decode-like
    one (a thread a sequence and channel); outputs within the dtype's tolerance, the updated
    states (the last K - 1 inputs, as stored) exactly."""
    D, slots = 200, 8  # (6 and 7: rows' saved windows)
    init, idx = [1, 0, 1, 0, 1], [3, 0, 5, 1, 2]
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    spec = np.full(int(qsl[-1]), -1, np.int32)
    spec[qsl[4] + 3], spec[qsl[0]] = 6, 7
    init, idx = np.array(init, np.int32), np.array(idx, np.int32)
    x = rounded(rng.standard_normal((int(qsl[-1]), D)).astype(np.float32), dtype)
    w = rng.standard_normal((D, K)).astype(np.float32)
    bias = rng.standard_normal(D).astype(np.float32)
    state0 = rng.standard_normal((slots, D, K - 1)).astype(np.float32)
    for silu in (True, False):
        ref, ref_state = np.empty_like(x), state0.copy()
        _C.ops.causal_conv1d(ref, x, w, bias, ref_state, qsl, idx, init, spec, silu)
        out, state = DeviceArray.empty(x.shape, dtype), DeviceArray.from_numpy(state0.copy())
        _C.ops.causal_conv1d(out, dev(x, dtype), DeviceArray.from_numpy(w),
                             DeviceArray.from_numpy(bias), state, DeviceArray.from_numpy(qsl),
                             DeviceArray.from_numpy(idx), DeviceArray.from_numpy(init),
                             DeviceArray.from_numpy(spec), silu)
        assert_close(as_f32(out.numpy(), dtype), ref, dtype, "causal_conv1d")
        np.testing.assert_array_equal(state.numpy(), ref_state)


def saved_rows(T: int, qsl: np.ndarray) -> np.ndarray:
    """spec_state_indices for the recurrences' tests: the first sequence's row 2 saves its
    state into slot 6, rows 3, 10 and 39 of the 40-token one into 7, 8 and 8 (the later save
    stays), the others none."""
    spec = np.full(T, -1, np.int32)
    spec[qsl[0] + 2], spec[qsl[3] + 3], spec[qsl[3] + 10], spec[qsl[3] + 39] = 6, 7, 8, 8
    return spec


def check_gated_delta_rule(rng, dtype, hk, hv, dk, dv, lens, init, idx, spec, state_tol,
                           state_dtype=F32):
    """gated_delta_rule on the GPU against the CPU op on the same rounded inputs over `lens`
    tokens a sequence (slots idx, continued where init); outputs within the dtype's tolerance,
    states within state_tol of the largest, slots no sequence names untouched. state_dtype: the
    GPU's state in the activations' dtype (vLLM's mamba_ssm_cache_dtype), its start the f32
    reference's rounded, so that only the stores' rounding separates the two."""
    slots = 9
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    init, idx = np.array(init, np.int32), np.array(idx, np.int32)
    T = int(qsl[-1])
    spec = spec(T, qsl) if spec is not None else None

    def act(*shape, scale=1.0):
        return rounded(rng.standard_normal(shape).astype(np.float32) * scale, dtype)

    q, k, v = act(T, hk * dk), act(T, hk * dk), act(T, hv * dv)
    a, b = act(T, hv), act(T, hv, scale=2.0)
    A_log = rng.uniform(-1.0, 1.0, hv).astype(np.float32)
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    state0 = rounded((rng.standard_normal((slots, hv, dk, dv)) * 0.3).astype(np.float32),
                     state_dtype)
    ref, ref_state = np.empty((T, hv * dv), np.float32), state0.copy()
    _C.ops.gated_delta_rule(ref, ref_state, q, k, v, a, b, A_log, dt_bias, qsl, idx, init,
                            spec)
    out, state = DeviceArray.empty((T, hv * dv), dtype), dev(state0.copy(), state_dtype)
    on = DeviceArray.from_numpy
    _C.ops.gated_delta_rule(out, state, dev(q, dtype), dev(k, dtype), dev(v, dtype),
                            dev(a, dtype), dev(b, dtype), on(A_log), on(dt_bias), on(qsl),
                            on(idx), on(init), None if spec is None else on(spec))
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "gated_delta_rule")
    got = as_f32(state.numpy(), state_dtype)
    assert np.abs(got - ref_state).max() / np.abs(ref_state).max() < state_tol
    written = set(idx[np.diff(qsl) > 0]) | (set() if spec is None else set(spec[spec >= 0]))
    free = [s for s in range(slots) if s not in written]
    np.testing.assert_array_equal(got[free], state0[free])  # slots the call does not write


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("hk,hv,dk,dv", [(2, 4, 16, 24), (1, 2, 128, 128), (2, 6, 40, 72),
                                         (2, 4, 64, 32)])
def test_gated_delta_rule(rng, dtype, hk, hv, dk, dv):
    """Gated DeltaNet's recurrence token by token against the CPU op on the same rounded
    inputs: sequences of 5, 0, 1 and 40 tokens over permuted slots, continued or started, some
    rows saving their state into extra slots (Qwen3.5's 128 x 128 states in eight warps of 16
    columns, each column's rows in two lanes' registers; 24 and 72 columns: warps with idle
    lanes; dk 16, 40, 64: the kernel for any key head size up to 128, its rows past dk zero, 64
    leaving the second lanes' halves empty); the updated f32 states within f32 rounding over 40
    steps."""
    check_gated_delta_rule(rng, dtype, hk, hv, dk, dv, [5, 0, 1, 40], [1, 0, 0, 1],
                           [4, 0, 2, 5], saved_rows, 1e-4)


@pytest.mark.parametrize("dtype", ACT[1:])
@pytest.mark.parametrize("lens,init,spec", [
    ([5, 0, 1, 40], [1, 0, 0, 1], saved_rows),          # token by token, rows saved
    ([200, 7, 64, 0, 1, 8], [1, 1, 0, 0, 1, 0], None),  # the chunked kernel's sequences too
], ids=["recurrent", "chunked"])
def test_gated_delta_rule_states_in_the_activations_dtype(rng, dtype, lens, init, spec):
    """Recurrent states kept in f16 / bf16 (vLLM's mamba_ssm_cache_dtype "auto"): read into f32,
    stored rounded, by both kernels and the saved rows; within the dtype's rounding of the f32
    reference's (2^-8 relative for bf16, 2^-11 for f16, plus the chunked kernel's TF32 3e-3)."""
    idx = [4, 0, 2, 5, 6, 8][:len(lens)]
    tol = (5e-3 if dtype == BF16 else 1e-3) + (3e-3 if spec is None else 0.0)
    check_gated_delta_rule(rng, dtype, 1, 2, 128, 128, lens, init, idx, spec, tol, dtype)


@pytest.mark.parametrize("dtype", ACT[1:])
@pytest.mark.parametrize("hk,hv,dk,dv", [(1, 2, 128, 128), (1, 2, 16, 12), (2, 2, 64, 72)])
def test_gated_delta_rule_chunked_prefill(rng, dtype, hk, hv, dk, dv):
    """A prefill batch in f16 / bf16 without speculative rows: its sequences of 8 tokens or more
    in chunks of 64 on the tensor cores (gated_delta_chunked.cu, TF32 products), the shorter
    token by token, in one call: 200 tokens (four chunks, the last partial) from a slot's
    state, 64 (one whole chunk) and 8 (the fewest) from zeros, 7, 1 and 0 tokens for the other
    kernel; Qwen3.5's head sizes, dk 16 and dv 12 (the chunk's rows and columns past them zero),
    72 columns (a second CTA of 8 live ones). States within TF32's rounding (3e-3 of the
    largest)."""
    check_gated_delta_rule(rng, dtype, hk, hv, dk, dv, [200, 7, 64, 0, 1, 8],
                           [1, 1, 0, 0, 1, 0], [4, 0, 2, 5, 6, 8], None, 3e-3)


def test_gated_delta_rule_key_head_size_past_the_kernel():
    """A key head size over 128 (the rows a state column keeps in two lanes' registers) is an
    error naming it, not a wrong answer."""
    T, hv, dk, dv = 2, 1, 160, 16
    on = DeviceArray.from_numpy
    f = np.ones((T, dk), np.float32)
    with pytest.raises(ValueError, match="key head size of 160"):
        _C.ops.gated_delta_rule(DeviceArray.empty((T, dv), F32),
                                on(np.zeros((1, hv, dk, dv), np.float32)), on(f), on(f),
                                on(np.ones((T, dv), np.float32)), on(np.ones((T, hv), np.float32)),
                                on(np.ones((T, hv), np.float32)), on(np.zeros(hv, np.float32)),
                                on(np.zeros(hv, np.float32)), on(np.array([0, T], np.int32)),
                                on(np.zeros(1, np.int32)), on(np.zeros(1, np.int32)), None)

@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("H,G,P,N", [(4, 2, 8, 16), (2, 1, 64, 128), (2, 2, 40, 32)])
@pytest.mark.parametrize("act_state", [False, True], ids=["f32_state", "act_state"])
def test_mamba2_scan(rng, dtype, H, G, P, N, act_state):
    """Mamba2's selective scan token by token against the CPU op on the same rounded inputs
    (dt clamped into [dt_min, dt_max] for some tokens), the sequences and slots as the gated
    delta rule's test; outputs within the dtype's tolerance, states within f32 rounding, or
    kept in the activations' f16 / bf16 (vLLM's mamba_ssm_cache_dtype "auto": the start the
    reference's rounded, the stores rounded) within that dtype's."""
    if act_state and dtype == F32:
        pytest.skip("f32 activations: the state is f32 either way")
    sdt = dtype if act_state else F32
    slots, lens, init, idx = 9, [5, 0, 1, 40], [1, 0, 0, 1], [4, 0, 2, 5]
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    init, idx = np.array(init, np.int32), np.array(idx, np.int32)
    T = int(qsl[-1])
    spec = saved_rows(T, qsl)

    def act(*shape, scale=1.0):
        return rounded(rng.standard_normal(shape).astype(np.float32) * scale, dtype)

    x, dt = act(T, H * P), act(T, H, scale=2.0)
    Bm, Cm = act(T, G * N), act(T, G * N)
    A_log = rng.uniform(-1.0, 1.0, H).astype(np.float32)
    Dp, dt_bias = rng.standard_normal(H).astype(np.float32), rng.standard_normal(H).astype(
        np.float32)
    state0 = rounded((rng.standard_normal((slots, H, P, N)) * 0.3).astype(np.float32), sdt)
    ref, ref_state = np.empty((T, H * P), np.float32), state0.copy()
    _C.ops.mamba2_scan(ref, ref_state, x, dt, Bm, Cm, A_log, Dp, dt_bias, qsl, idx, init, spec,
                       0.01, 2.0)
    out, state = DeviceArray.empty((T, H * P), dtype), dev(state0.copy(), sdt)
    on = DeviceArray.from_numpy
    _C.ops.mamba2_scan(out, state, dev(x, dtype), dev(dt, dtype), dev(Bm, dtype),
                       dev(Cm, dtype), on(A_log), on(Dp), on(dt_bias), on(qsl), on(idx),
                       on(init), on(spec), 0.01, 2.0)
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "mamba2_scan")
    got = as_f32(state.numpy(), sdt)
    tol = 1e-4 if sdt == F32 else 5e-3 if sdt == BF16 else 1e-3
    assert np.abs(got - ref_state).max() / np.abs(ref_state).max() < tol
    np.testing.assert_array_equal(got[[1, 3]], state0[[1, 3]])  # slots no sequence names


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["gdn", "mamba2"])
@pytest.mark.parametrize("groups,d,shared", [(4, 128, True), (8, 64, False), (3, 40, False),
                                            (2, 256, True), (1, 1000, True)])
def test_rms_norm_gated(rng, dtype, norm_before_gate, groups, d, shared):
    """The hybrids' gated RMSNorm (Gated DeltaNet's norm before the gate, Mamba2's after it),
    w shared by the groups or one per group, against the CPU op on the same rounded inputs;
    groups of at most 256 on the warp kernel (40: lanes past the group; 27 groups: a block's
    last warps idle), 1000 on the block kernel."""
    T = 9
    x = rounded(rng.standard_normal((T, groups * d)).astype(np.float32) * 2, dtype)
    z = rounded(rng.standard_normal((T, groups * d)).astype(np.float32) * 2, dtype)
    w = rng.normal(1.0, 0.3, d if shared else groups * d).astype(np.float32)
    ref = np.empty_like(x)
    _C.ops.rms_norm_gated(ref, x, z, w, 1e-6, d, norm_before_gate)
    out = DeviceArray.empty(x.shape, dtype)
    _C.ops.rms_norm_gated(out, dev(x, dtype), dev(z, dtype), DeviceArray.from_numpy(w), 1e-6, d,
                          norm_before_gate)
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "rms_norm_gated")
