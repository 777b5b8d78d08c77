"""A bounded least-recently-used cache of computed rows, local to one worker.

Keys say everything that determines a row's answer: the text (or pair), its options (prompt length, token limit,
task), the model's identity (the digest of its archive's content, handlers/core/identity.py: a re-packaged model under
the same name and version is another model), its version, the served precision and the token limit it was truncated
at. A capacity of 0 disables
the cache (every lookup misses, nothing is stored).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from handlers.text.rows import DEFAULT_OPTIONS, Row, RowOptions

CacheKey = tuple[bytes, str, str, str, int]  # row digest, identity, version, precision, token limit


@dataclass(frozen=True)
class CachedRow:
    """One computed row: what its kind answers from (a vector, a sparse row, token vectors: handlers/text/kinds)."""

    value: Any
    tokens: int  # tokens the model saw (after truncation, special tokens included)
    truncated: bool


def cache_key(
    row: Row,
    model_version: str,
    precision: str,
    max_tokens: int,
    options: RowOptions = DEFAULT_OPTIONS,
    *,
    identity: str,
) -> CacheKey:
    """What determines a row's answer. A digest, not the text: a full cache of max_text_chars texts would hold up to
    4 bytes x 20,000 characters x 4096 entries of keys (Python stores astral characters in 4 bytes each).

    A text pair is digested with a marker and the first text's length, so no pair and no single text share a key
    ("a" + "bc" and "ab" + "c" differ; a text cannot contain the marker's lone byte 0xff in UTF-8). Options other
    than the defaults are digested after a second marker."""
    if isinstance(row, tuple):
        first, second = (part.encode("utf-8") for part in row)
        data = b"\xffpair" + len(first).to_bytes(8, "little") + first + second
    else:
        data = row.encode("utf-8")
    if options != DEFAULT_OPTIONS:
        data += b"\xfeoptions" + f"{options.prompt_length}:{options.max_tokens}:{options.task}".encode()
    digest = hashlib.blake2b(data, digest_size=16).digest()
    return (digest, identity, model_version, precision, max_tokens)


class RowCache:
    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[CacheKey, CachedRow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> CachedRow | None:
        """The cached entry (now the most recently used) or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: CacheKey, entry: CachedRow) -> None:
        if self.capacity == 0:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
