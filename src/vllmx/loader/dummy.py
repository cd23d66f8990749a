"""load_format="dummy" (vLLM's option): a model from its config.json alone, its weights random,
for benchmarking full-size shapes without their files. Values as vLLM's dummy loader makes
them, uniform in [-1e-3, 1e-3), here from the fill_uniform op (a counter-based hash, the same
bits on any machine) seeded by the tensor's name and the engine's seed."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping

import numpy as np

from vllmx import ops
from vllmx.device import F32
from vllmx.ops import Weight
from vllmx.worker.worker_base import DTYPE_BY_NAME

DUMMY_LOW, DUMMY_HIGH = -1e-3, 1e-3


class DummyWeights(Mapping):
    """name -> a random Weight of the checkpoint's shape and dtype, made when first asked for and
    not kept (the model holds what it uses: a GPU model only its uploaded copy)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], hf_config: dict, seed: int):
        self.shapes = shapes
        stored = hf_config.get("torch_dtype", hf_config.get("dtype")) or "bfloat16"
        if stored not in DTYPE_BY_NAME:
            raise ValueError(f"load_format='dummy': config.json's dtype {stored!r} is not one of "
                             f"{', '.join(DTYPE_BY_NAME)}")
        self.dtype = DTYPE_BY_NAME[stored]
        self.seed = seed

    def __getitem__(self, name: str) -> Weight:
        shape = self.shapes[name]
        data = np.empty(shape, np.float32 if self.dtype == F32 else np.uint16)
        seed = (self.seed * 0x9E3779B1 + zlib.crc32(name.encode())) & ((1 << 63) - 1)
        ops.fill_uniform(data if self.dtype == F32 else (data, self.dtype), seed, DUMMY_LOW,
                         DUMMY_HIGH)
        return Weight(data, self.dtype, shape)

    def __contains__(self, name: object) -> bool:
        return name in self.shapes  # (Mapping's would make the tensor to find out)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)
