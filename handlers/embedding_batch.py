"""The hand-off between the embedding handler's stages: which rows are cached, which are computed, and how."""

from dataclasses import dataclass, field
from typing import Dict, List

import torch

from handlers.embedding_cache import CachedEmbedding


@dataclass
class EmbeddingBatch:
    """What preprocess hands on: cached rows, rows to compute (as padded groups) and per-request errors."""

    keys: List[List[tuple]]  # per request, the cache key of each of its texts
    known: Dict[tuple, CachedEmbedding]  # key -> entry, for cache hits (and, after inference, computed rows)
    errors: List[object]  # per request: None or its RequestError
    compute_keys: List[tuple] = field(default_factory=list)  # rows to compute, in order
    compute_tokens: List[int] = field(default_factory=list)
    compute_truncated: List[bool] = field(default_factory=list)
    passes: List[tuple] = field(default_factory=list)  # (rows into compute_keys, input_ids, attention_mask)
    embeddings: torch.Tensor = None  # [len(compute_keys), dim] after inference
