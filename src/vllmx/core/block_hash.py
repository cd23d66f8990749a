"""Block hashes for automatic prefix caching: a chain, hash(parent hash, the block's token ids,
extra keys), over full blocks only, so that equal hashes mean equal prefixes. 128 bits of
sha256: collisions are practically impossible (vLLM's sha256 option, truncated)."""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

BLOCK_HASH_BYTES = 16
# The parent of a request's first block.
NONE_HASH = hashlib.sha256(b"vllmx prefix cache v1").digest()[:BLOCK_HASH_BYTES]


def _key_bytes(key) -> bytes:
    """An extra key as tagged bytes, so that "1", b"1" and 1 differ."""
    if isinstance(key, str):
        return b"s" + key.encode("utf-8")
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, int):
        return b"i" + str(key).encode()
    raise TypeError(f"block hash extra keys are str, bytes or int, got {type(key).__name__}")


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int],
                      extra_keys: Sequence = ()) -> bytes:
    """The 16-byte hash of one full block given its parent's hash (None: the first block)."""
    h = hashlib.sha256(parent_hash if parent_hash is not None else NONE_HASH)
    tokens = array("q", token_ids)
    if sys.byteorder == "big":
        tokens.byteswap()
    h.update(len(tokens).to_bytes(4, "little"))
    h.update(tokens.tobytes())
    for key in extra_keys:
        b = _key_bytes(key)
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    return h.digest()[:BLOCK_HASH_BYTES]


def update_block_hashes(request, block_size: int) -> list[bytes]:
    """Extends request.block_hashes to cover every full block of its tokens (incrementally: only
    blocks that filled since the last call are hashed). The cache salt keys the first block,
    and through the chain every block after it; a LoRA request's adapter id keys every block
    (vLLM's extra keys), so a prefix computed under one adapter never serves another."""
    hashes: list[bytes] = request.block_hashes
    tokens = request.all_token_ids
    parent = hashes[-1] if hashes else None
    for i in range(len(hashes), len(tokens) // block_size):
        extra = (request.cache_salt,) if i == 0 and request.cache_salt is not None else ()
        lora_id = getattr(request, "lora_int_id", 0)
        if lora_id:
            extra += (lora_id,)
        parent = hash_block_tokens(parent, tokens[i * block_size:(i + 1) * block_size], extra)
        hashes.append(parent)
    return hashes
