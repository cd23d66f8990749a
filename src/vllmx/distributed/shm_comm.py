"""The shared-memory segment a host's ranks run their CPU collectives over (the layout is
csrc/distributed/shm_comm.h's). Rank 0 makes it as a file under /dev/shm; the other ranks map
it by path, whatever launched them (multiprocessing or Ray on this host); rank 0 removes the
file once they have mapped it, so nothing is left behind however the processes end."""

from __future__ import annotations

import mmap
import os
import tempfile
import uuid

import numpy as np

_MAGIC = 0x4D485358484C4C56  # csrc's kShmMagic
_HEADER_BYTES = _LINE_BYTES = 64
# Bytes a rank posts per step of a collective (larger tensors go in pieces): a decode step's
# activations fit whole; a long prefill's take a few steps.
DEFAULT_SLOT_BYTES = 4 << 20


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class ShmSegment:
    """A mapped segment: `buf` (u8, the whole segment) is what the collective ops take."""

    def __init__(self, path: str, create: bool = False, world: int = 0,
                 slot_bytes: int = DEFAULT_SLOT_BYTES):
        self.path = path
        size = _HEADER_BYTES + world * (_LINE_BYTES + 2 * slot_bytes)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)  # zero-filled: every rank's sequence starts at 0
            self._map = mmap.mmap(fd, 0 if not create else size)
        finally:
            os.close(fd)
        self.buf = np.frombuffer(self._map, dtype=np.uint8)
        self._header = self.buf[:_HEADER_BYTES].view(np.uint64)
        if create:
            self._header[1], self._header[2] = world, slot_bytes
            self._header[0] = _MAGIC
        elif int(self._header[0]) != _MAGIC:
            raise ValueError(f"{path} is not a vllmx collective segment")
        self.world_size = int(self._header[1])

    @classmethod
    def create(cls, world: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> ShmSegment:
        path = os.path.join(_shm_dir(), f"vllmx-tp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        return cls(path, create=True, world=world, slot_bytes=slot_bytes)

    def abort(self) -> None:
        """Sets the abort flag: every rank waiting in a collective raises (a peer failed)."""
        self._header[3] = 1

    @property
    def aborted(self) -> bool:
        return bool(self._header[3])

    def unlink(self) -> None:
        """Removes the file (the ranks' mappings stay valid)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
