"""A lean GGUF reader: header, metadata and tensor table parsed straight from a read-only mmap of
the file; tensors are numpy views of that mapping (the file stays the only copy).

The `gguf` package's GGUFReader keeps a numpy array per part of every field, i.e. two per
vocabulary entry: about 700 MB of small objects for Gemma 3's 262k tokens, which the allocator
keeps after they are freed. This reader builds only the values (the same ones
gguf_metadata.read_gguf_metadata returns)."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# GGUFValueType -> little-endian struct format of a scalar (7 is BOOL); np.dtype reads these too.
_SCALARS = {t: struct.Struct(f) for t, f in {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
                                             6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}.items()}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    ggml_type: int
    dims: tuple[int, ...]  # ggml order: fastest-varying first
    offset: int  # of its data, from the start of the file


class GGUFFile:
    """`metadata` (key -> str, number, bool or list), `tensors` (GGUFTensorInfo, file order) and
    `mm`, the read-only mapping the tensors are read from (`view`)."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.path = path
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, KeyError, IndexError, OverflowError) as e:
            raise ValueError(f"{path}: truncated or corrupt GGUF file ({type(e).__name__}: {e})") from e

    def _parse(self) -> None:
        mm = self.mm
        if mm[:4] != _MAGIC:
            raise ValueError(f"{self.path}: not a GGUF file (magic {bytes(mm[:4])!r})")
        version = _U32.unpack_from(mm, 4)[0]
        if version not in (2, 3):
            hint = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
            raise ValueError(f"{self.path}: GGUF version {version} is not supported{hint}")
        n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
        self._pos = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            if key in self.metadata:
                raise ValueError(f"{self.path}: duplicate metadata key {key!r}")
            self.metadata[key] = self._value(self._u32())
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._u32()
            dims = struct.unpack_from(f"<{n_dims}Q", mm, self._pos)
            self._pos += 8 * n_dims
            ggml_type = self._u32()
            infos.append((name, ggml_type, dims, self._u64()))
        alignment = self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        start = -(-self._pos // alignment) * alignment
        self.tensors = [GGUFTensorInfo(n, t, tuple(d), start + o) for n, t, d, o in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError(f"{self.path}: duplicate tensor names")

    def view(self, offset: int, nbytes: int, dtype: str | np.dtype = np.uint8) -> np.ndarray:
        """A read-only array over bytes [offset, offset + nbytes) of the file."""
        if offset + nbytes > len(self.mm):
            raise ValueError(f"{self.path}: tensor data at {offset}+{nbytes} runs past the end "
                             f"of the file ({len(self.mm)} bytes); truncated?")
        return np.frombuffer(self.mm, np.dtype(dtype), nbytes // np.dtype(dtype).itemsize, offset)

    # -- primitive reads at self._pos ---------------------------------------------------------
    def _u32(self) -> int:
        (v,) = _U32.unpack_from(self.mm, self._pos)
        self._pos += 4
        return v

    def _u64(self) -> int:
        (v,) = _U64.unpack_from(self.mm, self._pos)
        self._pos += 8
        return v

    def _string(self) -> str:
        n = self._u64()
        s = self.mm[self._pos:self._pos + n]
        if len(s) != n:
            raise IndexError("string runs past the end of the file")
        self._pos += n
        return s.decode("utf-8", errors="replace")

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            sub, count = self._u32(), self._u64()
            if sub == _STRING:
                return [self._string() for _ in range(count)]
            if sub == _ARRAY:
                return [self._value(self._u32()) for _ in range(count)]
            dt = np.dtype(_SCALARS[sub].format)
            arr = np.frombuffer(self.mm, dt, count, self._pos)
            self._pos += count * dt.itemsize
            return arr.tolist()
        fmt = _SCALARS[vtype]
        (v,) = fmt.unpack_from(self.mm, self._pos)
        self._pos += fmt.size
        return v
