"""`vllmx quantize SRC OUT.gguf --type Q4_K`: a GGUF of one weight type from a Hugging Face
safetensors checkpoint (laid out as llama.cpp's converter does) or from a higher-precision GGUF
(metadata copied, tensors requantized). Quantization is llama.cpp's reference quantizers
(csrc/quant/quantize_k.cpp; bit-identical to llama-quantize without an importance matrix).

Type choice per tensor, as llama-quantize: 1-D tensors (norms, rope_freqs), biases (gpt-oss's
2-D expert ones too) and routers stay F32; token_embd / output take --token-embedding-type /
--output-tensor-type (default: --type); rows that are not whole blocks of the type fall back
(Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0 where llama.cpp uses IQ4_NL, which
vllmx cannot write) and to F16 where even 32-element blocks do not fit."""

from __future__ import annotations

import argparse
import logging
import os

import numpy as np

from vllmx import ops
from vllmx.loader.hf_to_gguf import SourceTensor

logger = logging.getLogger(__name__)

TYPES = ops.QUANTIZE_TYPES
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
# general.file_type of an all-one-type file (the _S mixes are the nearest for k-quants).
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
              "Q2_K": 10, "Q3_K": 11, "Q4_K": 14, "Q5_K": 16, "Q6_K": 18, "BF16": 32}
_SKIP_KEYS = ("general.architecture", "general.file_type", "general.quantization_version")


def tensor_type(name: str, shape: tuple[int, ...], qtype: str, output_type: str | None = None,
                embedding_type: str | None = None) -> tuple[str, str | None]:
    """(GGUF type name, fallback message or None) for one tensor."""
    # llama-quantize quantizes only *.weight tensors, and keeps routers f32
    if len(shape) < 2 or not name.endswith(".weight") or name.endswith("ffn_gate_inp.weight"):
        return "F32", None
    want = qtype
    if name == "output.weight" and output_type:
        want = output_type
    elif name == "token_embd.weight" and embedding_type:
        want = embedding_type
    block = _block_size(want)
    if shape[-1] % block:
        got = FALLBACK.get(want, "F16")
        if shape[-1] % _block_size(got):
            got = "F16"
        return got, (f"{name}: rows of {shape[-1]} values are not a multiple of the {want} "
                     f"block size {block}; using {got}")
    return want, None


def _block_size(type_name: str) -> int:
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][0]


def _gguf_source(path: str):
    """(architecture, metadata fields to copy, tensors) of a GGUF file."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the gguf package raises assorted errors on bad files
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ValueError(f"{path}: GGUF file has no general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    fields = [f for name, f in reader.fields.items()
              if not name.startswith(("GGUF.", "split.")) and name not in _SKIP_KEYS]
    tensors = []
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
        if qtype.name not in TYPES:
            raise ValueError(f"{path}: tensor {t.name!r} has type {qtype.name}, which vllmx "
                             f"quantize does not read")

        def load(t=t, qtype=qtype, shape=shape):
            return np.ascontiguousarray(
                gguf.quants.dequantize(t.data, qtype), dtype=np.float32).reshape(shape)

        tensors.append(SourceTensor(t.name, shape, load))
    return arch, fields, tensors


def _tensor_info(shape: tuple[int, ...], type_name: str):
    """(shape, numpy dtype, bytes, raw dtype) for GGUFWriter.add_tensor_info; block types are
    described by their byte shape (rows, bytes per row)."""
    import gguf

    if type_name in ("F32", "F16"):
        dtype = np.dtype(np.float32 if type_name == "F32" else np.float16)
        return shape, dtype, int(np.prod(shape)) * dtype.itemsize, None
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "BF16":
        return shape, np.dtype(np.uint16), int(np.prod(shape)) * 2, qtype
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    byte_shape = (*shape[:-1], shape[-1] // bs * ts)
    return byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), qtype


def _copy_field(w, field) -> None:
    import gguf

    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)


def quantize_model(src: str, out: str, qtype: str, output_type: str | None = None,
                   embedding_type: str | None = None) -> dict[str, int]:
    """Writes OUT; returns the number of tensors of each GGUF type written."""
    import gguf

    for t in (qtype, output_type, embedding_type):
        if t is not None and t not in TYPES:
            raise ValueError(f"unsupported quantization type {t!r}; supported: {list(TYPES)}")
    from vllmx.loader.hf_to_gguf import (
        add_hf_metadata,
        add_hf_tokenizer,
        hf_tensors,
        read_hf_config,
    )

    if os.path.isdir(src):
        arch, cfg = read_hf_config(src)
        tensors = hf_tensors(src, arch, cfg)
    elif os.path.isfile(src) and src.endswith(".gguf"):
        arch, fields, tensors = _gguf_source(src)
    else:
        raise ValueError(f"{src!r} is neither a checkpoint directory nor a .gguf file")

    part = out + ".part"
    w = gguf.GGUFWriter(part, arch)
    if os.path.isdir(src):
        w.add_name(cfg.get("_name_or_path") or os.path.basename(os.path.normpath(src)))
        add_hf_metadata(w, arch, cfg)
        add_hf_tokenizer(w, src, cfg["vocab_size"])
    else:
        for field in fields:
            _copy_field(w, field)
    w.add_file_type(FILE_TYPES[qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    plan = []
    for t in tensors:
        name, msg = tensor_type(t.name, t.shape, qtype, output_type, embedding_type)
        if msg:
            logger.warning(msg)
        w.add_tensor_info(t.name, *_tensor_info(t.shape, name))
        plan.append((t, name))
    counts: dict[str, int] = {}
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t, name in plan:
            x = t.load().reshape(-1, t.shape[-1])
            w.write_tensor_data(ops.quantize_weight(x, TYPES[name]))
            counts[name] = counts.get(name, 0) + 1
        w.close()
        os.replace(part, out)  # OUT appears only once complete
    finally:
        if os.path.exists(part):
            os.remove(part)
    return counts


def add_quantize_parser(sub) -> None:
    q = sub.add_parser("quantize", help="write a GGUF of one quant type from a checkpoint or GGUF")
    q.add_argument("src", help="Hugging Face checkpoint directory or higher-precision .gguf")
    q.add_argument("out", help="output .gguf path")
    q.add_argument("--type", required=True, choices=list(TYPES), help="weight type")
    q.add_argument("--output-tensor-type", choices=list(TYPES), default=None,
                   help="type of output.weight (default: --type)")
    q.add_argument("--token-embedding-type", choices=list(TYPES), default=None,
                   help="type of token_embd.weight (default: --type)")
    q.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    q.add_argument("-v", "--verbose", action="store_true")


def run_quantize(args: argparse.Namespace) -> int:
    if args.threads:
        from vllmx import _C

        _C.set_num_threads(args.threads)
    counts = quantize_model(args.src, args.out, args.type, args.output_tensor_type,
                            args.token_embedding_type)
    summary = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 2**20:.1f} MiB): {summary} tensors")
    return 0
