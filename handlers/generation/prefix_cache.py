"""Reuse of computed prompt prefixes: a prompt that starts like one seen before skips prefilling that part.

Prompts are cut into blocks of ``block_tokens`` tokens. Each block is stored once, under the chain of blocks before it
(so a chat's system prompt shared by many conversations is one chain, however many conversations continue it), with
its keys and values for every layer. A new prompt walks the chain from its first block while the blocks are present
and match exactly (tokens are compared, not only hashes); what it finds is copied into its row of the batch cache and
only the rest of the prompt is computed. At least one prompt token is always computed: its logits choose the first new
token.

Memory is bounded by ``max_bytes`` (the keys and values held); the least recently used blocks go first, and a chain's
later blocks are always less recent than its earlier ones (a lookup touches them from the last to the first), so a
block is never evicted before the blocks that continue it. Reuse is exact for models whose keys and values at a
position depend only on the tokens up to it (every causal LM): a reused prefix is what computing it again would give,
to floating-point rounding.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from handlers.core.config import Bounds, Option, check_bounds, with_defaults
from handlers.generation.kv_cache import RowKV

BlockKey = tuple[int, tuple[int, ...]]  # (key of the block before, this block's tokens)


@dataclass
class Block:
    tokens: tuple[int, ...]
    parent: int | None  # hash of the block before (None: the first block of a prompt)
    kv: RowKV  # per layer (keys, values), each [heads, block_tokens, head_dim]
    nbytes: int


@dataclass
class PrefixStats:
    """Counts since load: lookups that found a prefix, those that did not, and prompt tokens not recomputed."""

    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    evicted_blocks: int = 0
    pending: dict[str, int] = field(default_factory=dict)  # deltas not yet recorded as metrics

    def count(self, name: str, value: int = 1) -> None:
        setattr(self, name, getattr(self, name) + value)
        self.pending[name] = self.pending.get(name, 0) + value

    def drain(self) -> dict[str, int]:
        pending, self.pending = self.pending, {}
        return pending


@dataclass(frozen=True)
class PrefixHit:
    length: int  # prompt tokens found (a multiple of block_tokens; 0: none)
    kv: RowKV | None  # their keys and values per layer, [heads, length, head_dim]


NO_HIT = PrefixHit(0, None)


class PrefixCache:
    def __init__(self, max_bytes: int, block_tokens: int = 16, *, identity: str) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        # The model's content digest (handlers/core/identity.py) roots every chain. One worker serves one model, so
        # this never separates anything today; it keeps the rule every cache here follows: keys name the model's
        # content, so a cache that outlived a model swap could not hand one model's keys and values to another.
        self.identity = identity
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self.blocks: OrderedDict[int, Block] = OrderedDict()  # by chain hash; least recently used first
        self.bytes = 0
        self.stats = PrefixStats()

    def chain(self, token_ids: list[int], blocks: int) -> list[tuple[int, tuple[int, ...], int | None]]:
        """(chain hash, tokens, parent hash) of the first ``blocks`` blocks of ``token_ids``."""
        result = []
        parent: int | None = None
        size = self.block_tokens
        for index in range(blocks):
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            key = hash((self.identity, parent, tokens))
            result.append((key, tokens, parent))
            parent = key
        return result

    def found(self, token_ids: list[int], limit: int) -> list[Block]:
        """The stored blocks that start ``token_ids``, at most ``limit`` tokens' worth."""
        found = []
        for key, tokens, parent in self.chain(token_ids, max(limit, 0) // self.block_tokens):
            block = self.blocks.get(key)
            if block is None or block.tokens != tokens or block.parent != parent:
                break
            found.append(block)
        return found

    def lookup(self, token_ids: list[int]) -> PrefixHit:
        """The longest stored prefix of a prompt, leaving at least its last token to compute."""
        found = self.found(token_ids, len(token_ids) - 1)
        if not found:
            self.stats.count("misses")
            return NO_HIT
        for key, _, _ in reversed(self.chain(token_ids, len(found))):
            self.blocks.move_to_end(key)  # the first block ends up most recent: it outlives its continuations
        kv = [
            (
                torch.cat([block.kv[layer][0] for block in found], dim=-2),
                torch.cat([block.kv[layer][1] for block in found], dim=-2),
            )
            for layer in range(len(found[0].kv))
        ]
        length = len(found) * self.block_tokens
        self.stats.count("hits")
        self.stats.count("reused_tokens", length)
        return PrefixHit(length, kv)

    def missing(self, token_ids: list[int]) -> range:
        """Token range (whole blocks) of a prompt not stored yet: what :meth:`store` should be given."""
        blocks = len(token_ids) // self.block_tokens
        have = len(self.found(token_ids, blocks * self.block_tokens))
        return range(have * self.block_tokens, blocks * self.block_tokens)

    def store(self, token_ids: list[int], start: int, kv: RowKV) -> None:
        """Keep the blocks of ``token_ids`` from token ``start`` (a block boundary from :meth:`missing`), given their
        keys and values per layer ([heads, tokens, head_dim], from ``start`` on)."""
        size = self.block_tokens
        first = start // size
        blocks = self.chain(token_ids, first + kv[0][0].shape[-2] // size)
        chain_keys = {key for key, _, _ in blocks}
        for index, (key, tokens, parent) in enumerate(blocks[first:]):
            begin, end = index * size, (index + 1) * size
            block_kv = [(keys[:, begin:end].clone(), values[:, begin:end].clone()) for keys, values in kv]
            nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in block_kv)
            if key in self.blocks:
                self.bytes -= self.blocks.pop(key).nbytes
            if not self.evict(nbytes, protect=chain_keys):
                break  # the rest of this prompt does not fit beside the blocks it continues
            self.blocks[key] = Block(tokens, parent, block_kv, nbytes)
            self.bytes += nbytes
        for key, _, _ in reversed(blocks):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def evict(self, needed: int, protect: set[int]) -> bool:
        """Free least recently used blocks until ``needed`` more bytes fit, never one of ``protect`` (the chain being
        stored). False when that is not possible."""
        while self.bytes + needed > self.max_bytes:
            victim = next((key for key in self.blocks if key not in protect), None)
            if victim is None:
                return False
            self.bytes -= self.blocks.pop(victim).nbytes
            self.stats.count("evicted_blocks")
        return True

    def describe(self) -> dict[str, int]:
        return {
            "block_tokens": self.block_tokens,
            "max_bytes": self.max_bytes,
            "bytes": self.bytes,
            "blocks": len(self.blocks),
            "hits": self.stats.hits,
            "misses": self.stats.misses,
            "reused_tokens": self.stats.reused_tokens,
        }


# handler.prefix_cache in model-config.yaml
PREFIX_CACHE_DEFAULTS: dict[str, Any] = {"max_bytes": 64 << 20, "block_tokens": 16}
PREFIX_CACHE_BOUNDS: Bounds = {
    "max_bytes": (int, 0, 1 << 40, "bytes of keys and values kept for reuse; 0 turns prefix reuse off"),
    "block_tokens": (int, 1, 4096, "prompts are matched and stored in blocks of this many tokens"),
}


def check_prefix_cache(option: Option, key: str, value: dict[str, Any]) -> dict[str, Any]:
    settings = with_defaults(option, key, value, PREFIX_CACHE_DEFAULTS)
    check_bounds(option, key, settings, PREFIX_CACHE_BOUNDS)
    return settings


PREFIX_CACHE_OPTION = Option(
    dict,
    dict(PREFIX_CACHE_DEFAULTS),
    validator=check_prefix_cache,
    help="reuse of computed prompt prefixes: {max_bytes, block_tokens}; max_bytes 0 = off",
)


def open_prefix_cache(settings: dict[str, Any], identity: str) -> PrefixCache | None:
    """The worker's prefix cache from handler.prefix_cache, or None when it is off."""
    if settings["max_bytes"] == 0:
        return None
    return PrefixCache(settings["max_bytes"], settings["block_tokens"], identity=identity)
