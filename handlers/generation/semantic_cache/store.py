"""One worker's similarity index: answered prompts' unit vectors, grouped by everything else that decides an answer.

A lookup names its group (the hash of model, version, sampling settings, stop sequences, chat context, partition:
:mod:`handlers.generation.semantic_cache.cache`) and a prompt's unit vector; it proposes the most similar stored
prompts of that group only whose cosine similarity reaches the lookup's threshold, best first (the cache verifies
them before one answers). Nothing is ever compared across groups, so no request parameter can reach another group's
answers. Each entry keeps its prompt's wording (and what the lexical check read in it), for that verification.

Each group keeps its vectors as rows of one float32 matrix (one matrix-vector product per lookup: ~1 ms per 10k
entries of 384 floats on one core; docs/semantic-cache.md has the measured figures); freed rows are zeroed
(similarity 0, below any threshold) and reused. The whole store is bounded in entries and in bytes (vector + answer
text) with least-recently-used eviction (a group's matrix may hold up to twice the rows it uses, beyond that count),
and every entry expires ``ttl_s`` after it was first answered. An entry's bytes count its prompt too.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

ENTRY_OVERHEAD_BYTES = 200  # what an entry costs besides its vector and its text (objects, dict slots), roughly


# The finish reasons of an answer worth keeping (an error's or a cancelled stream's is not); their order is also the
# shared tier's encoding of one (shared.py).
FINISH_REASONS = ("stop", "length")
ROUNDING_SLACK = 1e-5  # float32 rounding of a 384-dim dot product stays well inside this


@dataclass(frozen=True)
class StoredAnswer:
    """What a hit answers with: the stored generation (the new request's own prompt tokens go in its usage)."""

    text: str
    finish_reason: str
    completion_tokens: int


@dataclass
class Entry:
    group: bytes
    row: int  # its row in the group's matrix
    answer: StoredAnswer
    created: float  # wall-clock seconds (entries from the shared tier carry their writer's time)
    nbytes: int
    prompt: str = ""  # the wording it was answered for
    reading: Any = None  # what the lexical check read in it (handlers/generation/semantic_cache/lexical.py)


@dataclass(frozen=True)
class Hit:
    answer: StoredAnswer
    similarity: float
    age_s: float


@dataclass(frozen=True)
class Candidate:
    """A stored prompt a lookup proposes: verified before it answers (:meth:`SemanticStore.touch` on a hit)."""

    entry_id: int
    prompt: str
    reading: Any
    hit: Hit


@dataclass
class Group:
    """The vectors of one group: rows of ``matrix`` (unused rows are zero), and which entry holds each row."""

    matrix: torch.Tensor
    entry_ids: list[int | None] = field(default_factory=list)
    free_rows: list[int] = field(default_factory=list)
    used: int = 0

    def add(self, vector: torch.Tensor, entry_id: int) -> int:
        if self.free_rows:
            row = self.free_rows.pop()
        else:
            row = len(self.entry_ids)
            if row == self.matrix.shape[0]:  # grow by doubling: amortised O(1) per insert, at most 2x the rows used
                grown = torch.zeros(max(1, 2 * row), self.matrix.shape[1], dtype=torch.float32)
                grown[:row] = self.matrix
                self.matrix = grown
            self.entry_ids.append(None)
        self.matrix[row] = vector
        self.entry_ids[row] = entry_id
        self.used += 1
        return row

    def remove(self, row: int) -> None:
        self.matrix[row] = 0
        self.entry_ids[row] = None
        self.free_rows.append(row)
        self.used -= 1


class SemanticStore:
    """Bounded in entries and bytes, LRU, with a TTL; see the module docstring."""

    def __init__(
        self, dimension: int, capacity: int, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.dimension = dimension
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.groups: dict[bytes, Group] = {}
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self.nbytes = 0
        self.ids = itertools.count()

    def __len__(self) -> int:
        return len(self.entries)

    def entry_bytes(self, text: str, prompt: str = "") -> int:
        return 4 * self.dimension + len(text.encode("utf-8")) + len(prompt.encode("utf-8")) + ENTRY_OVERHEAD_BYTES

    def candidates(self, group: bytes, vector: torch.Tensor, threshold: float, limit: int) -> list[Candidate]:
        """Up to ``limit`` live entries of ``group`` whose cosine similarity to ``vector`` is >= ``threshold``, most
        similar first; expired ones met on the way are dropped."""
        index = self.groups.get(group)
        if index is None or not index.used:
            return []
        similarities = index.matrix[: len(index.entry_ids)] @ vector
        now = self.clock()
        found: list[Candidate] = []
        # A few more than asked for: expired entries among the best are dropped, not counted.
        best = torch.topk(similarities, min(len(similarities), limit + 4))
        for similarity, row in zip(best.values.tolist(), best.indices.tolist(), strict=True):
            entry_id = index.entry_ids[row]
            # A unit vector's dot product with itself rounds to 1 +- a few float32 ulps; without this slack an
            # identical prompt would miss at threshold 1.0 about a third of the time.
            if entry_id is None or similarity < threshold - ROUNDING_SLACK or len(found) == limit:
                break
            entry = self.entries[entry_id]
            if now - entry.created > self.ttl_s:
                self.evict(entry_id)
                continue
            hit = Hit(entry.answer, min(similarity, 1.0), max(0.0, now - entry.created))
            found.append(Candidate(entry_id, entry.prompt, entry.reading, hit))
        return found

    def touch(self, entry_id: int) -> None:
        """A candidate answered: it is now the most recently used entry."""
        if entry_id in self.entries:
            self.entries.move_to_end(entry_id)

    def set_reading(self, entry_id: int, reading: Any) -> None:
        """What the lexical check read in an entry's prompt, kept for its next lookups."""
        if entry_id in self.entries:
            self.entries[entry_id].reading = reading

    def lookup(self, group: bytes, vector: torch.Tensor, threshold: float) -> Hit | None:
        """The most similar live entry of ``group`` when its cosine similarity to ``vector`` is >= ``threshold``
        (unverified: the duplicate check when storing, and tests)."""
        found = self.candidates(group, vector, threshold, 1)
        if not found:
            return None
        self.touch(found[0].entry_id)
        return found[0].hit

    def insert(
        self,
        group: bytes,
        vector: torch.Tensor,
        answer: StoredAnswer,
        created: float | None = None,
        prompt: str = "",
        reading: Any = None,
    ) -> bool:
        """Store one answer; False when it is too big for the store or already expired. Older entries are evicted
        (least recently used first) until both bounds hold."""
        nbytes = self.entry_bytes(answer.text, prompt)
        created = self.clock() if created is None else created
        if nbytes > self.max_bytes or self.capacity == 0 or self.clock() - created > self.ttl_s:
            return False
        while self.entries and (len(self.entries) >= self.capacity or self.nbytes + nbytes > self.max_bytes):
            self.evict(next(iter(self.entries)))
        index = self.groups.get(group)
        if index is None:
            # One row to start: many groups hold a single answer (each chat history is a group of its own).
            index = self.groups[group] = Group(torch.zeros(1, self.dimension, dtype=torch.float32))
        entry_id = next(self.ids)
        row = index.add(vector.to(torch.float32), entry_id)
        self.entries[entry_id] = Entry(group, row, answer, created, nbytes, prompt, reading)
        self.nbytes += nbytes
        return True

    def evict(self, entry_id: int) -> None:
        entry = self.entries.pop(entry_id)
        self.nbytes -= entry.nbytes
        index = self.groups[entry.group]
        index.remove(entry.row)
        if not index.used:
            del self.groups[entry.group]

    def describe(self) -> dict[str, int]:
        return {"entries": len(self.entries), "bytes": self.nbytes, "groups": len(self.groups)}
