"""Ref-counted KV blocks with a hash-chain prefix cache and explicit fork.

A full block is identified by SHA-256(parent block's hash, its tokens), so equal hashes mean equal
prefixes. Hashes are registered when the block is allocated for known tokens (or fills during
decode), which lets requests admitted in the same step share: the block's KV is written by the
same forward pass that first reads it, before attention in every layer.
Freed blocks keep their hash and stay reusable until evicted, least recently freed first.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from engine.core.sequence import Sequence


class NoFreeBlocks(RuntimeError):
    pass


def salt_root(cache_salt: str | None) -> bytes | None:
    """The hash chain's root for a request's ``cache_salt`` (vLLM's): blocks of different salts never
    hash alike, so the prefix cache shares blocks only between requests of one salt. None: no salt."""
    return None if cache_salt is None else hashlib.sha256(b"cache_salt:" + cache_salt.encode("utf-8")).digest()


def block_hash(parent: bytes | None, tokens: list[int]) -> bytes:
    """SHA-256 of (parent block's hash, this block's token ids).

    Python's hash() of a tuple can collide (by accident, or by construction from chosen prompts),
    and a collision would hand one prompt another's KV; vLLM moved to SHA-256 for that reason."""
    h = hashlib.sha256(parent or b"")  # a parent digest is 32 bytes, the root none: no ambiguity
    h.update(array("q", tokens).tobytes())  # int64: ids never wrap
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # hash -> block id
        # Free blocks in eviction order: blocks without cached content first, then LRU.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.num_logical = 0  # sum of block-table lengths of live sequences
        self.num_shared = 0   # blocks with ref count > 1
        self.peak_used = 0
        self.peak_saved = 0

    # -- accounting ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def num_saved(self) -> int:
        """Blocks that sharing saves now: logical (per-sequence) blocks minus physical ones."""
        return self.num_logical - self.num_used

    def reset_peak(self) -> None:
        """Start the peak counters afresh from what is held now (like torch.cuda.reset_peak_memory_stats)."""
        self.peak_used, self.peak_saved = self.num_used, max(0, self.num_saved)

    def _track_peak(self) -> None:
        self.peak_used = max(self.peak_used, self.num_used)
        self.peak_saved = max(self.peak_saved, self.num_saved)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    # -- block life cycle ---------------------------------------------------------------------
    def _take(self, block: int) -> None:
        if self.ref_count[block] == 0:
            del self.free[block]
        self.ref_count[block] += 1
        self.num_shared += self.ref_count[block] == 2

    def _new_block(self) -> int:
        if not self.free:
            raise NoFreeBlocks("KV cache has no free block")
        block, _ = self.free.popitem(last=False)
        old = self.hash_of[block]
        if old is not None:  # evict its cached content
            if self.cached.get(old) == block:
                del self.cached[old]
            self.hash_of[block] = None
        self.ref_count[block] = 1
        return block

    def _release(self, block: int, keep_cached: bool = True) -> None:
        self.ref_count[block] -= 1
        assert self.ref_count[block] >= 0, f"block {block} released more often than taken"
        self.num_shared -= self.ref_count[block] == 1
        if self.ref_count[block] == 0:
            self.free[block] = None
            h = self.hash_of[block]
            if h is not None and not keep_cached:
                if self.cached.get(h) == block:
                    del self.cached[h]
                self.hash_of[block] = h = None
            if h is None:
                self.free.move_to_end(block, last=False)

    def _register(self, seq: Sequence, i: int) -> None:
        """Hash full block i of seq (its tokens are known) and publish it to the prefix cache."""
        bs = self.block_size
        parent = seq.block_hashes[i - 1] if i else seq.request.cache_root
        h = block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs])
        seq.block_hashes.append(h)
        block = seq.block_table[i]
        if self.enable_prefix_caching and h not in self.cached and self.hash_of[block] is None:
            self.cached[h] = block
            self.hash_of[block] = h

    # -- sequence operations ------------------------------------------------------------------
    def match_prefix(self, seq: Sequence, limit: int | None = None) -> int:
        """Take cached blocks for seq's leading full blocks; returns tokens already computed.

        At least one token is left to compute so that the step produces logits for it, and no cached
        block reaches past ``limit`` tokens (positions whose logits are still owed as logprobs).
        """
        assert not seq.block_table
        if not self.enable_prefix_caching:
            return 0
        bs = self.block_size
        max_blocks = (min(seq.num_tokens - 1, seq.num_tokens if limit is None else limit)) // bs
        parent = seq.request.cache_root
        for i in range(max_blocks):
            h = block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs])
            block = self.cached.get(h)
            if block is None:
                break
            self._take(block)
            seq.block_table.append(block)
            seq.block_hashes.append(h)
            parent = h
        self.num_logical += len(seq.block_table)
        self._track_peak()
        return len(seq.block_table) * bs

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq's table to hold num_tokens tokens; raises NoFreeBlocks (allocating nothing)."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free):
            raise NoFreeBlocks(f"need {need} blocks, {len(self.free)} free")
        if need:
            for _ in range(need):
                seq.block_table.append(self._new_block())
            self.num_logical += need
            self._track_peak()
        # Blocks this step fills completely are published now, so that another request admitted
        # in the same step can share them; a block the chunk only partly covers is not.
        self.publish(seq, min(num_tokens, seq.num_tokens))

    def publish(self, seq: Sequence, num_tokens: int) -> None:
        """Register seq's full blocks among its first num_tokens tokens (e.g. filled by decode)."""
        for i in range(len(seq.block_hashes), min(len(seq.block_table), num_tokens // self.block_size)):
            self._register(seq, i)

    def fork(self, parent: Sequence, child: Sequence, num_computed: int | None = None) -> tuple[int, int] | None:
        """Share parent's full blocks with child; copy only a partial last block.

        num_computed: the parent's tokens with KV once the copy is made (default: its num_computed;
        the scheduler forks before the forward that completes the prompt and copies after it).
        Returns (src, dst) of the block whose KV the caller must copy, or None.
        Raises NoFreeBlocks (sharing nothing) when the copy has no room.
        """
        bs = self.block_size
        if num_computed is None:
            num_computed = parent.num_computed
        full = num_computed // bs
        partial = len(parent.block_table) > full
        if partial and not self.free:
            raise NoFreeBlocks("no block for the fork's partial last block")
        for block in parent.block_table[:full]:
            self._take(block)
        child.block_table = parent.block_table[:full]
        child.block_hashes = parent.block_hashes[:full]
        copy = None
        if partial:
            dst = self._new_block()
            child.block_table.append(dst)
            copy = (parent.block_table[full], dst)
        child.num_computed = num_computed
        self.num_logical += len(child.block_table)
        self._track_peak()
        return copy

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release seq's blocks past its first ``num_tokens`` tokens: those only a verify step's
        rejected drafts wrote (never hashed: publish stops at the tokens kept)."""
        keep = -(-num_tokens // self.block_size)
        extra = len(seq.block_table) - keep
        if extra > 0:
            for block in reversed(seq.block_table[keep:]):
                self._release(block)
            del seq.block_table[keep:]
            self.num_logical -= extra

    def free_seq(self, seq: Sequence, keep_cached: bool = True) -> None:
        """Release seq's blocks; keep_cached=False forgets the content of those no one else holds."""
        # Release tail first so a sequence's blocks age like its prefix: prefix blocks are
        # evicted last among this sequence's.
        for block in reversed(seq.block_table):
            self._release(block, keep_cached)
        self.num_logical -= len(seq.block_table)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed = 0
