"""Gated DeltaNet, the linear-attention mixer of Qwen3-Next and Qwen3.5: projections to
q, k, v (through a short causal convolution), the output gate z and the per-head b, a; the
gated delta rule over a [dk, dv] state per value head; a gated RMSNorm; the output projection.
Its state lives in two tensors of request slots (conv window, recurrent state), carried from
step to step; AttentionMetadata says which slot each sequence owns and whether it continues.

Qwen3.5 stores in_proj_qkv (the convolution's channels, [q; k; v]), in_proj_z, in_proj_b and
in_proj_a apart. Qwen3-Next's in_proj_qkvz / in_proj_ba interleave per key-head group g:
[q_g (dk), k_g (dk), v_g (r dv), z_g (r dv)] and [b_g (r), a_g (r)], r = Hv / Hk value heads per
key head; their rows are regrouped at load into the same four."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import F32
from vllmx.layers import placement
from vllmx.layers.attention import AttentionMetadata
from vllmx.layers.linear import Linear, RowParallelLinear, take_rows
from vllmx.ops import Weight


class GatedDeltaNet:
    def __init__(self, cfg: dict, w: dict[str, Weight], prefix: str):
        hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        if hv % hk:
            raise ValueError(f"{prefix[:-1]}: linear_num_value_heads {hv} is not a multiple of "
                             f"linear_num_key_heads {hk}")
        r = hv // hk
        self.hk, self.hv, self.dk, self.dv = hk, hv, dk, dv
        self.eps = cfg["rms_norm_eps"]
        p = prefix
        group = 2 * dk + 2 * r * dv
        g0 = np.arange(hk)[:, None] * group

        def rows(start: int, n: int) -> np.ndarray:
            return (g0 + start + np.arange(n)).ravel()

        if p + "in_proj_qkv.weight" in w:  # Qwen3.5
            self.qkv_proj, self.z_proj, self.b_proj, self.a_proj = (
                Linear(w[f"{p}in_proj_{n}.weight"]) for n in ("qkv", "z", "b", "a"))
        else:
            qkvz = w[p + "in_proj_qkvz.weight"]
            self.qkv_proj = Linear(take_rows(qkvz, np.concatenate(
                [rows(0, dk), rows(dk, dk), rows(2 * dk, r * dv)])))
            self.z_proj = Linear(take_rows(qkvz, rows(2 * dk + r * dv, r * dv)))
            ba = w[p + "in_proj_ba.weight"]
            gb = np.arange(hk)[:, None] * 2 * r
            self.b_proj = Linear(take_rows(ba, (gb + np.arange(r)).ravel()))
            self.a_proj = Linear(take_rows(ba, (gb + r + np.arange(r)).ravel()))
        conv = w[p + "conv1d.weight"]  # [channels, 1, K]
        self.conv_weight = np.ascontiguousarray(
            conv.to_float32().reshape(conv.shape[0], conv.shape[-1]))
        self.conv_bias = (w[p + "conv1d.bias"].to_float32().reshape(-1)
                          if p + "conv1d.bias" in w else None)
        self.A_log = np.ascontiguousarray(w[p + "A_log"].to_float32().reshape(-1))
        self.dt_bias = np.ascontiguousarray(w[p + "dt_bias"].to_float32().reshape(-1))
        self.norm_weight = np.ascontiguousarray(w[p + "norm.weight"].to_float32().reshape(-1))
        self.out_proj = RowParallelLinear(w[p + "out_proj.weight"])
        self.conv_state = self.recurrent_state = None
        # The mixer ops' f32 parameters where they run (the GPU's states go there too).
        self.on_gpu = placement.current().on_gpu
        self.state_dtype = placement.recurrent_state_dtype()
        self.conv_weight, self.A_log, self.dt_bias, self.norm_weight = (
            placement.upload_vector(a, F32) for a in (self.conv_weight, self.A_log,
                                                      self.dt_bias, self.norm_weight))
        if self.conv_bias is not None:
            self.conv_bias = placement.upload_vector(np.ascontiguousarray(self.conv_bias), F32)

    def allocate_states(self, num_slots: int) -> None:
        """The conv window and recurrent state of num_slots requests (pages committed as slots
        are first written)."""
        k = self.conv_weight.shape[1]
        self.conv_state = placement.state_zeros((num_slots, self.conv_weight.shape[0], k - 1), self.on_gpu)
        self.recurrent_state = placement.state_zeros((num_slots, self.hv, self.dk, self.dv),
                                                     self.on_gpu, self.state_dtype)

    def state_arrays(self) -> list[np.ndarray]:
        """The per-request state this layer updates in place, slot first."""
        return [self.conv_state, self.recurrent_state]

    def __call__(self, x, md: AttentionMetadata):
        kd, vd = self.hk * self.dk, self.hv * self.dv
        idx, init, qsl = md.state_indices, md.has_initial_state, md.query_start_loc
        spec = md.spec_state_indices
        mixed = ops.causal_conv1d(self.qkv_proj(x), self.conv_weight, self.conv_bias,
                                  self.conv_state, qsl, idx, init, True, spec)
        q, k, v = ops.split_columns(mixed, [kd, kd, vd])
        core = ops.gated_delta_rule(q, k, v, self.a_proj(x), self.b_proj(x), self.A_log,
                                    self.dt_bias, self.recurrent_state, qsl, idx, init, spec)
        return self.out_proj(ops.rms_norm_gated(core, self.z_proj(x), self.norm_weight,
                                                self.eps))
