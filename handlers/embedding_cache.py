"""A bounded least-recently-used cache of computed embeddings, local to one worker.

Keys say everything that determines the vector: the text, the model version, the served precision and the token
limit it was truncated at. A capacity of 0 disables the cache (every lookup misses, nothing is stored).
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CachedEmbedding:
    embedding: torch.Tensor  # fp32, [dim], unit length
    tokens: int  # tokens the model saw (after truncation, special tokens included)
    truncated: bool


class EmbeddingCache:
    def __init__(self, capacity):
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._entries = OrderedDict()

    def __len__(self):
        return len(self._entries)

    def get(self, key):
        """The cached entry (now the most recently used) or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key, entry):
        if self.capacity == 0:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self):
        self._entries.clear()
