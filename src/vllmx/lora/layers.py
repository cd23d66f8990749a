"""LoRA around a Linear or a MergedLinear (vLLM's RowParallelLinearWithLoRA /
MergedColumnParallelLinearWithLoRA / MergedQKVParallelLinearWithLoRA): the base output plus
each row's adapter product. The adapters sit in max_loras slots of two stacks (vLLM's
lora_a_stacked / lora_b_stacked): A [slots, S * max_rank, in] for S slices (q, k, v or gate,
up), each slice's rows in its own max_rank band, and B [slots, out, max_rank], each slice's
rows those of its output columns, a smaller rank padded with zeros; so each projection costs
one add_lora_linear whatever slices an adapter targets. On the CPU each part in lora_dtype, in
linear's 16-row panels; on the GPU the stacks are device arrays in the activation dtype."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import DeviceArray
from vllmx.layers import placement
from vllmx.layers.linear import Linear, MergedLinear
from vllmx.layers.placement import Placement
from vllmx.lora.models import LoRALayerWeights
from vllmx.lora.punica import PunicaWrapper
from vllmx.ops import Weight

_HOST = {ops.F32: np.float32, ops.F16: np.float16, ops.BF16: np.uint16}  # storage per dtype


def _stack(slots: int, rows: int, cols: int, min_rows: int, dtype: int,
           place: Placement) -> Weight | DeviceArray:
    """Zeros [slots, rows, cols] of dtype (f32, f16 or bf16) for adapter matrices whose parts
    (a slot, or its slices of rows [o_i, o_i+1)) are written in the layout repack_weight gives
    a part: linear's 16-row panels (F32_X16 / F16_X16 / BF16_X16) where this CPU has them and
    every part (min_rows) fills one, the rank being small (short dot products for the row
    kernel); on 64-byte boundaries (the panels' loads). Pages untouched until a slot is
    written. On the GPU a device array in the activation dtype (the CUDA op's stacks are x's
    dtype)."""
    if place.on_gpu:
        return DeviceArray.zeros((slots, rows, cols), place.dtype)
    host = np.dtype(_HOST[dtype])
    nbytes = slots * rows * cols * host.itemsize
    raw = np.zeros(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    data = raw[start:start + nbytes].view(host).reshape(slots, rows, cols)
    return Weight(data, ops.packed_dtype(dtype, (min_rows, cols)), (slots, rows, cols))


def _write(stack: Weight | DeviceArray, dtype: int, slot: int, row0: int,
           part: np.ndarray) -> None:
    """part (f32 [rows, cols]) into the stack's slot at row0, in dtype (rounded to nearest
    even) and the stack's layout; on the GPU in the device array's dtype."""
    if isinstance(stack, DeviceArray):
        at = stack.offset + (slot * stack.shape[1] + row0) * part.shape[1] * stack.itemsize
        DeviceArray(stack.buffer, stack.dtype, part.shape, at).copy_from(
            placement.host_as(part, stack.dtype))
        return
    w = Weight(placement.host_as(part, dtype), dtype, part.shape)
    if stack.dtype != dtype:
        w = ops.repack_weight(w)
        assert w.dtype == stack.dtype  # (_stack's rule is repack_weight's)
    stack.data[slot, row0:row0 + part.shape[0]] = w.data.reshape(part.shape)


class LinearWithLoRA:
    def __init__(self, base: Linear | MergedLinear, slices: list[str], punica: PunicaWrapper,
                 max_loras: int, max_lora_rank: int, dtype: int = ops.F32,
                 place: Placement | None = None):
        self.base_layer = base
        self.punica = punica
        self.slices = slices  # module names, in the order of the base layer's output columns
        if isinstance(base, MergedLinear):
            self.output_sizes = list(base.output_sizes)
            self.input_size = base.parts[0].weight.shape[-1]
        else:
            self.output_sizes = [base.weight.shape[0]]
            self.input_size = base.weight.shape[-1]
        self.max_lora_rank = max_lora_rank
        offsets = np.cumsum([0] + self.output_sizes)
        place = place or Placement()
        # (read by every step's op: long-lived; on the GPU a device copy, as an op's tensors
        # all live on one device)
        self.output_slices = offsets.astype(np.int32)
        if place.on_gpu:
            self.output_slices = DeviceArray.from_numpy(self.output_slices)
        # The adapters' weights as applied: lora_dtype on the CPU, the activations' on the GPU.
        self.dtype = place.dtype if place.on_gpu else dtype
        self.lora_a_stacked = _stack(max_loras, len(slices) * max_lora_rank, self.input_size,
                                     len(slices) * max_lora_rank, dtype, place)
        self.lora_b_stacked = _stack(max_loras, int(offsets[-1]), max_lora_rank,
                                     min(self.output_sizes), dtype, place)

    def check_lora(self, name: str, module: str, w: LoRALayerWeights) -> None:
        out = self.output_sizes[self.slices.index(module)]
        if w.lora_a.shape[1] != self.input_size or w.lora_b.shape[0] != out:
            raise ValueError(f"LoRA adapter {name!r}: {module} lora_A {w.lora_a.shape} / lora_B "
                             f"{w.lora_b.shape} do not fit the base model's {module} "
                             f"({out} x {self.input_size})")

    def set_lora(self, slot: int, per_slice: dict[str, LoRALayerWeights]) -> None:
        """Slot `slot` holds an adapter's matrices for the slices it targets (zeros for the
        others: the slot may have held another adapter)."""
        r = self.max_lora_rank
        a = np.zeros(self.lora_a_stacked.shape[1:], np.float32)
        offsets = np.cumsum([0] + self.output_sizes)
        for i, m in enumerate(self.slices):
            w = per_slice.get(m)
            b = np.zeros((offsets[i + 1] - offsets[i], r), np.float32)
            if w is not None:
                rank = w.lora_a.shape[0]
                a[i * r:i * r + rank] = w.lora_a
                b[:, :rank] = w.lora_b
            _write(self.lora_b_stacked, self.dtype, slot, int(offsets[i]), b)
        _write(self.lora_a_stacked, self.dtype, slot, 0, a)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        group = getattr(self.base_layer, "tp_group", None)
        if group is None:
            y = self.base_layer(x)
        else:  # row-parallel: the adapters' partial products join the base's before the sum
            y = ops.linear(x, self.base_layer.weight, self.base_layer.bias)
        self.punica.add_lora_linear(y, x, self.lora_a_stacked, self.lora_b_stacked,
                                    self.output_slices)
        if group is not None:
            group.all_reduce(y)
        return y

    # The fused base ops (norm + matmul, matmul + act_and_mul) have no room for the adapters,
    # so with LoRA on they run apart: every step runs the same ops whichever adapters its rows
    # have, as a step tape replays them.
    def act_and_mul(self, x: np.ndarray, act: str = "silu") -> np.ndarray:
        return ops.act_and_mul(self(x), act)

    def norm_proj(self, x, residual, norm, act: str | None = None):
        h, residual = (norm(x), x) if residual is None else norm(x, residual)
        y = self(h)
        return (y if act is None else ops.act_and_mul(y, act)), residual
