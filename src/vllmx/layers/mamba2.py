"""The Mamba2 mixer (Granite-4 / GraniteMoeHybrid's mamba layers): in_proj to the gate z, the
conv channels xBC = [x; B; C] and the per-head dt; the short causal convolution (silu) over
xBC; the selective state space over a [P, N] state per head (mamba2_scan, grouped B / C);
the gated RMSNorm in Mamba2's order (the norm of y * silu(z), per group of heads); out_proj.
Its conv window and SSM state live in request slots (AttentionMetadata.state_indices)."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import F32
from vllmx.layers import placement
from vllmx.layers.attention import AttentionMetadata
from vllmx.layers.linear import Linear, take_rows
from vllmx.ops import Weight


def time_step_limit(cfg: dict) -> tuple[float, float]:
    """A config's Mamba2 time_step_limit (dt's window; (0, inf) when absent), as floats: a
    config.json writes infinity as {"__float__": "Infinity"}."""
    limit = cfg.get("time_step_limit") or (0.0, float("inf"))
    return tuple(float(v["__float__"]) if isinstance(v, dict) else float(v) for v in limit)


class Mamba2Mixer:
    def __init__(self, w: dict[str, Weight], prefix: str, *, num_heads: int, head_dim: int,
                 state_size: int, n_groups: int, eps: float,
                 dt_limit: tuple[float, float] = (0.0, float("inf")), rms_norm: bool = True,
                 norm_before_gate: bool = False):
        p = prefix
        self.h, self.p, self.n, self.g = num_heads, head_dim, state_size, n_groups
        d_inner = num_heads * head_dim
        conv = d_inner + 2 * n_groups * state_size
        self.eps, self.dt_limit = eps, dt_limit
        inp, bias = w[p + "in_proj.weight"], w.get(p + "in_proj.bias")
        if inp.shape[0] != d_inner + conv + num_heads:
            raise ValueError(f"{p}in_proj.weight {inp.shape} is not [{d_inner + conv + num_heads}"
                             f", hidden] for {num_heads} heads of {head_dim}, state {state_size}, "
                             f"{n_groups} groups")

        def part(start: int, n: int) -> Linear:
            rows = start + np.arange(n)
            return Linear(take_rows(inp, rows), None if bias is None else take_rows(bias, rows))

        self.z_proj, self.xbc_proj = part(0, d_inner), part(d_inner, conv)
        self.dt_proj = part(d_inner + conv, num_heads)
        cw = w[p + "conv1d.weight"]  # [conv, 1, K]
        self.conv_weight = np.ascontiguousarray(cw.to_float32().reshape(cw.shape[0], -1))
        self.conv_bias = (np.ascontiguousarray(w[p + "conv1d.bias"].to_float32().reshape(-1))
                          if p + "conv1d.bias" in w else None)
        self.A_log, self.D, self.dt_bias = (
            np.ascontiguousarray(w[p + n].to_float32().reshape(-1)) for n in ("A_log", "D",
                                                                              "dt_bias"))
        # The gated norm (Mamba2's order by default; Falcon-H1 may norm before the gate, or
        # only gate: y * silu(z))
        self.norm_before_gate = norm_before_gate
        self.norm_weight = (np.ascontiguousarray(w[p + "norm.weight"].to_float32().reshape(-1))
                            if rms_norm else None)
        self.out_proj = Linear(w[p + "out_proj.weight"], w.get(p + "out_proj.bias"))
        self.conv_state = self.ssm_state = None
        # The mixer ops' f32 parameters where they run (the GPU's states go there too).
        self.on_gpu = placement.current().on_gpu
        self.state_dtype = placement.recurrent_state_dtype()  # the SSM state's
        self.conv_weight, self.A_log, self.D, self.dt_bias = (
            placement.upload_vector(a, F32) for a in (self.conv_weight, self.A_log, self.D,
                                                      self.dt_bias))
        self.conv_bias, self.norm_weight = (
            None if a is None else placement.upload_vector(a, F32)
            for a in (self.conv_bias, self.norm_weight))

    def allocate_states(self, num_slots: int) -> None:
        k = self.conv_weight.shape[1]
        self.conv_state = placement.state_zeros((num_slots, self.conv_weight.shape[0], k - 1), self.on_gpu)
        self.ssm_state = placement.state_zeros((num_slots, self.h, self.p, self.n), self.on_gpu,
                                               self.state_dtype)

    def state_arrays(self) -> list[np.ndarray]:
        """The per-request state this layer updates in place, slot first."""
        return [self.conv_state, self.ssm_state]

    def __call__(self, x, md: AttentionMetadata):
        idx, init, qsl = md.state_indices, md.has_initial_state, md.query_start_loc
        spec = md.spec_state_indices
        xbc = ops.causal_conv1d(self.xbc_proj(x), self.conv_weight, self.conv_bias,
                                self.conv_state, qsl, idx, init, True, spec)
        d_inner, gn = self.h * self.p, self.g * self.n
        xs, b, c = ops.split_columns(xbc, [d_inner, gn, gn])
        y = ops.mamba2_scan(xs, self.dt_proj(x), b, c, self.A_log, self.D, self.dt_bias,
                            self.ssm_state, qsl, idx, init, *self.dt_limit, spec)
        z = self.z_proj(x)
        if self.norm_weight is None:
            y = ops.silu_and_mul(ops.concat_columns([z, y]))
        else:
            y = ops.rms_norm_gated(y, z, self.norm_weight, self.eps, d_inner // self.g,
                                   norm_before_gate=self.norm_before_gate)
        return self.out_proj(y)
