"""Hugging Face safetensors checkpoints, memory-mapped: each tensor is a numpy view of the
file (bf16 as uint16), handed to the native side without conversion."""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from vllmx.device import I32, I64, U8
from vllmx.ops import BF16, F16, F32, Weight

# Quantized checkpoints' fp8 (e4m3, read as its bytes) and int8 weights: ids of the loader's
# own, which loader/quantization.py turns into dense weights (no kernel reads them).
FP8_E4M3, I8 = -1001, -1002
# U8: packed tensors a model converts itself (gpt-oss's MXFP4 expert blocks and scales); the
# integer and bool ones: index tables (EAGLE-3's d2t / t2d) and compressed-tensors' packed
# weights, read as they are.
_DTYPES = {"F32": (np.float32, F32), "F16": (np.float16, F16), "BF16": (np.uint16, BF16),
           "U8": (np.uint8, U8), "BOOL": (np.uint8, U8), "I32": (np.int32, I32),
           "I64": (np.int64, I64), "F8_E4M3": (np.uint8, FP8_E4M3), "I8": (np.int8, I8)}


def _read_file(path: str) -> dict[str, Weight]:
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    weights = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if name.endswith(".position_ids") and info["dtype"] == "I64":
            continue  # a buffer older transformers saved (BERT's 0..n-1), not a weight
        if info["dtype"] not in _DTYPES:
            raise ValueError(
                f"{path}: tensor {name!r} has dtype {info['dtype']}; vllmx reads F32, F16, BF16 "
                f"(and U8, BOOL, I32, I64 for packed blocks and index tables, F8_E4M3 and I8 "
                f"in quantized checkpoints)"
            )
        np_dtype, dtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        arr = data[start:end].view(np_dtype).reshape(shape)
        weights[name] = Weight(arr, dtype, shape)
    return weights


def load_safetensors(model_dir: str) -> dict[str, Weight]:
    """All tensors of a checkpoint directory (single file or sharded with an index)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {model_dir}")
    weights: dict[str, Weight] = {}
    for name in files:
        weights.update(_read_file(os.path.join(model_dir, name)))
    return weights
