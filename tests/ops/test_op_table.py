"""The op table itself: every op of csrc/ops.def is declared with parameters that parse and has
a kernel somewhere; the one binding maps arguments by position, name and default, and refuses
what does not fit with a message naming the op; the dispatcher checks required tensors and the
scalar twin's existence; a recorded tape replays generic entries."""
import re
from pathlib import Path

import numpy as np
import pytest

from vllmx import _C

OPS_DEF = Path(__file__).resolve().parents[2] / "csrc" / "ops.def"


def test_the_binding_lists_exactly_the_declared_ops():
    declared = sorted(re.findall(r"^VLLMX_OP\((\w+),", OPS_DEF.read_text(), re.MULTILINE))
    assert declared == _C.op_names()
    gpu_only = {"add_rms_norm", "linear_act_and_mul", "rms_norm_linear", "qk_norm_rope_cache"}
    assert {n for n in declared if not getattr(_C.ops, n).has_kernel("cpu")} == gpu_only
    for name in declared:
        op = getattr(_C.ops, name)
        assert op.has_kernel("cpu") or op.has_kernel("cuda") == _C.cuda_built(), name
        kinds = {k for _, k, *_ in op.schema}
        assert kinds <= {"tensor", "int", "float", "bool"}
        assert any(written for _, _, _, written, _ in op.schema), f"{name} writes nothing"


def test_arguments_by_position_name_and_default():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    _C.ops.rms_norm(a, x, w, 1e-6)
    _C.ops.rms_norm(out=b, x=x, w=w, eps=1e-6)
    assert np.array_equal(a, b)
    assert [p[0] for p in _C.ops.paged_attention.schema][-4:] == [
        "sliding_window", "logits_soft_cap", "max_query_len", "sinks"]  # defaulted, optional


@pytest.mark.parametrize("call,match", [
    (lambda x: _C.ops.rms_norm(x, x, x), "missing argument 'eps'"),
    (lambda x: _C.ops.rms_norm(x, x, x, 1e-6, 1), r"takes 4 arguments, got 5"),
    (lambda x: _C.ops.rms_norm(x, x, x, eps=1e-6, epsilon=1), "has no parameter 'epsilon'"),
    (lambda x: _C.ops.rms_norm(x, x, x, 1e-6, eps=1e-6), "got 'eps' twice"),
])
def test_bad_calls_are_type_errors_naming_the_op(call, match):
    with pytest.raises(TypeError, match=match):
        call(np.zeros((2, 4), np.float32))


def test_the_dispatcher_names_what_is_wrong():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="rms_norm: x is required"):
        _C.ops.rms_norm(x, None, np.ones(4, np.float32), 1e-6)
    with pytest.raises(ValueError, match="copy_columns: has no reference twin on the CPU"):
        _C.ops.copy_columns(x, 0, x, 0, 2, reference=True)
    with pytest.raises(AttributeError, match="vllmx has no op 'no_such_op'"):
        _C.ops.no_such_op  # noqa: B018
    with pytest.raises(TypeError, match=r"\(array, dtype id\)"):
        _C.ops.rms_norm(x, (x, 0, 1), np.ones(4, np.float32), 1e-6)
    if not _C.cuda_built():
        with pytest.raises(ValueError, match="has no kernel for the CPU"):
            _C.ops.qk_norm_rope_cache(*([x] * 6), 1e-6, x, x, x, 1, 1, True)


def test_a_recorded_tape_replays_its_generic_entries():
    """Two ops recorded, their inputs changed in place, one replay: the outputs follow."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    h, out = np.empty_like(x), np.empty((4, 8), np.float32)
    tape = _C.StepTape()
    _C.record_begin(tape)
    try:
        _C.ops.rms_norm(h, x, w, 1e-6)
        _C.ops.silu_and_mul(out, h)
    finally:
        _C.record_end()
    assert len(tape) == 2
    assert [c[0] for c in tape.calls] == ["rms_norm", "silu_and_mul"]
    x[:] = rng.standard_normal(x.shape)
    tape.replay()
    h2, out2 = np.empty_like(x), np.empty_like(out)
    _C.ops.rms_norm(h2, x, w, 1e-6)
    _C.ops.silu_and_mul(out2, h2)
    assert np.array_equal(out, out2)
