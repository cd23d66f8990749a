"""load_format="dummy" (vLLM's option): a model from its config.json alone, its weights random,
for benchmarking full-size shapes without their files. Values as vLLM's dummy loader makes
them, uniform in [-1e-3, 1e-3), here from the fill_uniform op (a counter-based hash, the same
bits on any machine) seeded by the tensor's name and the engine's seed. With an fp8
quantization_config (vLLM's "fp8", block-scaled), the projections the GPU's fp8 GEMM runs are
fp8 codes instead: random codes of exponent fields 0-7 (so no NaN) under one scale, 1e-3 / 1.875,
so the values spread over the same +-1e-3."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping

import numpy as np

from vllmx import ops
from vllmx.device import F32
from vllmx.ops import Weight
from vllmx.worker.worker_base import DTYPE_BY_NAME

DUMMY_LOW, DUMMY_HIGH = -1e-3, 1e-3
FP8_DUMMY_MAX = 1.875  # the largest e4m3 value whose exponent field's top bit is clear


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
        quant = hf_config.get("quantization_config") or {}
        self.fp8 = quant.get("quant_method") == "fp8"
        if self.fp8:
            from vllmx.loader import fp8

            fp8.check_config(quant)
        self.fp8_skip = tuple(quant.get("modules_to_not_convert") or ())

    def __getitem__(self, name: str) -> Weight:
        shape = self.shapes[name]
        seed = (self.seed * 0x9E3779B1 + zlib.crc32(name.encode())) & ((1 << 63) - 1)
        if self._fp8(name, shape):
            from vllmx.ops.fp8 import GROUP, fp8_block_weight

            # Random bytes with each code's top exponent bit cleared: e4m3 values of either
            # sign up to 1.875 (exponent fields 0-7), never NaN, in two vector ops (a per-code
            # NaN fix took 2.5x as long: 1.5 s a Qwen3-30B-A3B layer of experts).
            n = shape[0] * shape[1]
            words = np.random.default_rng(seed).integers(0, 1 << 63, -(-n // 8), np.uint64)
            words &= np.uint64(0xBFBFBFBFBFBFBFBF)
            codes = words.view(np.uint8)[:n].reshape(shape)
            scales = np.full((shape[0], shape[1] // GROUP), DUMMY_HIGH / FP8_DUMMY_MAX,
                             np.float32)
            return fp8_block_weight(codes, scales)
        data = np.empty(shape, np.float32 if self.dtype == F32 else np.uint16)
        ops.fill_uniform(data if self.dtype == F32 else (data, self.dtype), seed, DUMMY_LOW,
                         DUMMY_HIGH)
        return Weight(data, self.dtype, shape)

    def _fp8(self, name: str, shape: tuple[int, ...]) -> bool:
        """Whether an fp8 checkpoint of this config would hold `name` in fp8 and the GPU's fp8
        GEMM runs it (vLLM quantizes every linear but lm_head and modules_to_not_convert)."""
        if not self.fp8 or len(shape) != 2 or not name.endswith("proj.weight"):
            return False
        if any(m in name for m in self.fp8_skip) or "lm_head" in name:
            return False
        from vllmx.loader.fp8 import fp8_gemm_takes

        return fp8_gemm_takes(shape[0], shape[1])

    def __contains__(self, name: object) -> bool:
        return name in self.shapes  # (Mapping's would make the tensor to find out)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)
