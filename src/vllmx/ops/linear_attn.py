"""The hybrid models' mixer ops (Gated DeltaNet and Mamba2 layers): the short causal convolution,
the gated delta rule and the selective scan over per-request state slots, the gated RMSNorm."""

from __future__ import annotations

from vllmx import _C
from vllmx.ops._base import _empty


def causal_conv1d(x, weight, bias, conv_state, query_start_loc, state_indices,
                  has_initial_state, silu: bool = True, spec_state_indices=None):
    """The hybrid mixers' short depthwise convolution with its window carried in conv_state
    slots (contract in csrc/ops.def): out [T, D]. spec_state_indices: a slot a row (or -1)
    that also gets the window after it."""
    out = _empty(x, x.shape)
    _C.ops.causal_conv1d(out, x, weight, bias, conv_state, query_start_loc, state_indices,
                         has_initial_state, spec_state_indices, silu)
    return out


def gated_delta_rule(q, k, v, a, b, A_log, dt_bias, recurrent_state, query_start_loc,
                     state_indices, has_initial_state, spec_state_indices=None):
    """Gated DeltaNet's recurrence over each sequence's state slot (contract in csrc/ops.def):
    out [T, Hv * dv]. spec_state_indices: a slot a row (or -1) that also gets the state
    after it."""
    out = _empty(v, v.shape)
    _C.ops.gated_delta_rule(out, recurrent_state, q, k, v, a, b, A_log, dt_bias,
                            query_start_loc, state_indices, has_initial_state,
                            spec_state_indices)
    return out


def rms_norm_gated(x, z, w, eps: float, group_size: int | None = None,
                   norm_before_gate: bool = True):
    """Gated RMSNorm over each group of group_size (default w.shape[0]) values:
    x / rms(x) * w * silu(z), or with norm_before_gate False (Mamba2's) the norm of
    x * silu(z), times w."""
    out = _empty(x, x.shape)
    _C.ops.rms_norm_gated(out, x, z, w, eps, group_size or w.shape[0], norm_before_gate)
    return out


def mamba2_scan(x, dt, B, C, A_log, D, dt_bias, ssm_state, query_start_loc, state_indices,
                has_initial_state, dt_min: float = 0.0, dt_max: float = float("inf"),
                spec_state_indices=None):
    """Mamba2's selective state space over each sequence's state slot (contract in
    csrc/ops.def): out [T, H * P]. spec_state_indices: a slot a row (or -1) that also gets the
    state after it."""
    out = _empty(x, x.shape)
    _C.ops.mamba2_scan(out, ssm_state, x, dt, B, C, A_log, D, dt_bias, query_start_loc,
                       state_indices, has_initial_state, spec_state_indices, dt_min, dt_max)
    return out


def sigmoid_gate_(x, gate) -> None:
    """In place x *= sigmoid(gate) (gate like x, or one column)."""
    _C.ops.sigmoid_gate(x, gate)
