"""The similarity cache's shared tier: one Redis stream per model and version that every worker and replica appends its
new answers to and reads the others' from, so a prompt answered by one worker is a hit on all of them.

Why a stream, not keys: a similarity lookup compares a vector with every stored one of its group, which a plain
key-value server cannot do; so each worker keeps the searchable index in memory (:mod:`.store`) and the server only
carries entries between workers. Per batch with lookups, one ``XREAD`` from where this worker stopped (non-blocking,
``COUNT``-bounded); per batch with new answers, one pipelined ``XADD`` (trimmed to about ``capacity`` entries) plus
an ``EXPIRE`` of ``ttl_s``. A starting worker reads the stream's backlog once, so a restart loses nothing.

A value is raw bytes, never pickle: a header (magic, format, dimension, the group hash, the embedder's fingerprint,
creation time, completion tokens, finish reason, prompt and text lengths), the unit vector as little-endian float32,
then the prompt's and the answer's UTF-8 text (the prompt: the cache verifies a candidate against the wording it was
answered for). Anything that fails a check (length, magic, dimension, fingerprint, non-finite or non-unit vector,
undecodable text, an unknown finish reason, too old) is skipped and counted as a bad value; a value of the earlier
format (no prompt) is skipped silently. Failures follow
the embedding tier's rules (handlers/text/shared_cache.py): a bounded timeout per call, no retries, a breaker;
a failed call costs a request nothing but the chance of a hit.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from handlers.generation.semantic_cache.store import FINISH_REASONS, StoredAnswer
from handlers.text.shared_cache import RedisTier

logger = logging.getLogger(__name__)

MAGIC = b"TSSc"
FORMAT_VERSION = 2  # 1: no prompt
# magic, format, finish reason, dimension, group hash, embedder fingerprint, created (ms), completion tokens,
# prompt bytes, text bytes
HEADER = struct.Struct("<4sBBH16s8sQIII")
READ_COUNT = 512  # entries one XREAD may bring
BACKLOG_SECONDS = 2.0  # how long a starting worker may spend reading the backlog

NORM_TOLERANCE = 1e-3  # stored prompt vectors are unit length to ~1e-6; bf16 rows are normalised in fp32 too


@dataclass(frozen=True)
class SharedEntry:
    group: bytes
    vector: torch.Tensor
    answer: StoredAnswer
    created: float  # wall-clock seconds
    prompt: str = ""  # the wording the answer was generated for


def embedder_fingerprint(name: str, backend: str, precision: str, dimension: int, identity: str) -> bytes:
    """Vectors of different embedders (or precisions) are not compared: a value carries its writer's. ``identity``
    is the embedder's content digest (handlers/core/identity.py): an embedder retrained with the same architecture,
    pooling and width describes itself alike, and only its weights tell it apart."""
    text = f"{name}\0{identity}\0{backend}\0{precision}\0{dimension}".encode()
    return hashlib.blake2b(text, digest_size=8).digest()


def encode_entry(entry: SharedEntry, fingerprint: bytes) -> bytes:
    vector = entry.vector.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
    text = entry.answer.text.encode("utf-8")
    prompt = entry.prompt.encode("utf-8")
    header = HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        FINISH_REASONS.index(entry.answer.finish_reason),
        vector.shape[0],
        entry.group,
        fingerprint,
        int(entry.created * 1000),
        entry.answer.completion_tokens,
        len(prompt),
        len(text),
    )
    return header + vector.tobytes() + prompt + text


def decode_entry(
    value: Any, dimension: int, fingerprint: bytes, max_completion_tokens: int, oldest: float
) -> SharedEntry | None:
    """The entry a stored value holds, or None when it fails any check (see the module docstring)."""
    if not isinstance(value, bytes) or len(value) < HEADER.size + 4 * dimension:
        return None
    magic, version, finish, size, group, writer, created_ms, tokens, prompt_bytes, text_bytes = HEADER.unpack_from(
        value
    )
    if (
        magic != MAGIC
        or version != FORMAT_VERSION
        or finish >= len(FINISH_REASONS)
        or size != dimension
        or writer != fingerprint
        or not 0 <= tokens <= max_completion_tokens
        or len(value) != HEADER.size + 4 * dimension + prompt_bytes + text_bytes
        or created_ms / 1000 < oldest
    ):
        return None
    vector = np.frombuffer(value, dtype="<f4", count=dimension, offset=HEADER.size).astype(np.float32)
    if not np.isfinite(vector).all() or abs(float(np.linalg.norm(vector)) - 1.0) > NORM_TOLERANCE:
        return None
    start = HEADER.size + 4 * dimension
    try:
        prompt = value[start : start + prompt_bytes].decode("utf-8")
        text = value[start + prompt_bytes :].decode("utf-8")
    except UnicodeDecodeError:
        return None
    answer = StoredAnswer(text, FINISH_REASONS[finish], tokens)
    return SharedEntry(group, torch.from_numpy(vector), answer, created_ms / 1000, prompt)


class SemanticTier(RedisTier):
    """One worker's client of the stream (see the module docstring)."""

    def __init__(
        self,
        settings: dict[str, Any],
        url: str,
        password: str | None,
        stream_key: str,
        fingerprint: bytes,
        dimension: int,
        capacity: int,
        ttl_s: int,
        max_completion_tokens: int,
    ) -> None:
        super().__init__(settings, url, password)
        self.stream_key = stream_key
        self.fingerprint = fingerprint
        self.dimension = dimension
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.max_completion_tokens = max_completion_tokens
        self.last_id = b"0-0"
        self.own_ids: set[bytes] = set()  # what this worker appended: read back, it is already in its store
        self.received = 0  # entries taken from other workers since the last drain_received

    def publish(self, entries: list[SharedEntry]) -> None:
        values = [encode_entry(entry, self.fingerprint) for entry in entries]
        values = [value for value in values if len(value) <= self.settings["max_value_bytes"]]
        if not values:
            return

        def write() -> Any:
            pipeline = self.client.pipeline(transaction=False)
            for value in values:
                pipeline.xadd(self.stream_key, {b"e": value}, maxlen=self.capacity, approximate=True)
            pipeline.expire(self.stream_key, self.ttl_s)
            return pipeline.execute()

        result = self.call("xadd", write)
        if result is not None:
            if len(self.own_ids) > 4 * self.capacity:  # ids never read back (trimmed first): forget them
                self.own_ids.clear()
            self.own_ids.update(item if isinstance(item, bytes) else str(item).encode() for item in result[:-1])

    def drain_received(self) -> int:
        """Entries taken from other workers since the last drain (and start counting afresh)."""
        received, self.received = self.received, 0
        return received

    def poll(self) -> list[SharedEntry]:
        """Entries other workers appended since the last poll (one XREAD; nothing when the call fails)."""
        result = self.call("xread", lambda: self.client.xread({self.stream_key: self.last_id}, count=READ_COUNT))
        return self.take(result)

    def read_backlog(self) -> list[SharedEntry]:
        """At load: the stream's live entries, read until caught up or for BACKLOG_SECONDS at most."""
        entries: list[SharedEntry] = []
        deadline = time.monotonic() + BACKLOG_SECONDS
        while time.monotonic() < deadline:
            before = self.last_id
            entries += self.poll()
            if self.last_id == before:
                break
        return entries[-self.capacity :]

    def take(self, result: Any) -> list[SharedEntry]:
        entries: list[SharedEntry] = []
        if not result:
            return entries
        oldest = time.time() - self.ttl_s
        for _stream, items in result:
            for entry_id, fields in items:
                self.last_id = entry_id
                if entry_id in self.own_ids:
                    self.own_ids.discard(entry_id)
                    continue
                entry = None
                value = fields.get(b"e") if isinstance(fields, dict) else None
                if value is not None and len(value) <= self.settings["max_value_bytes"]:
                    entry = decode_entry(value, self.dimension, self.fingerprint, self.max_completion_tokens, oldest)
                if entry is None:
                    # Too old is not bad: the stream keeps entries past their TTL until trimmed.
                    if not (isinstance(value, bytes) and self.outdated(value, oldest)):
                        self.events.bad_values += 1
                    continue
                entries.append(entry)
        self.received += len(entries)
        return entries

    @staticmethod
    def outdated(value: bytes, oldest: float) -> bool:
        """Past its TTL, or of an earlier format (written before an upgrade): skipped, but not a bad value."""
        if len(value) < 5 or value[:4] != MAGIC:
            return False
        if value[4] < FORMAT_VERSION:
            return True
        return len(value) >= HEADER.size and HEADER.unpack_from(value)[6] / 1000 < oldest

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "stream": self.stream_key, "last_id": self.last_id.decode(errors="replace")}
