"""Hands out fixed-size KV blocks to requests. (The native BlockPool with prefix caching
replaces the free list here in the engine issue; the interface stays.)"""

from __future__ import annotations

from collections import deque

from vllmx.engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.req_to_blocks: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """New block ids so that the request can hold num_computed + num_new tokens, or None
        (nothing allocated) when the pool cannot supply them."""
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        need = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(blocks)
        if need <= 0:
            return []
        if need > len(self.free_block_ids):
            return None
        new = [self.free_block_ids.popleft() for _ in range(need)]
        blocks.extend(new)
        return new

    def free(self, request: Request) -> None:
        for b in reversed(self.req_to_blocks.pop(request.request_id, [])):
            self.free_block_ids.append(b)
