"""Batch assembly for every text model (embeddings, classifiers, rerankers): cache lookups (the worker's LRU, then
one round trip to the shared tier for its misses), one tokenizer call, limits, padded length groups; and the answers
once the rows are computed, after which the computed rows are stored in both tiers. Each step returns what the next
one needs (:class:`EmbeddingBatch`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from handlers.core.errors import RequestError, too_large
from handlers.text.buckets import padded_tokens, plan_forward_groups
from handlers.text.cache import CachedEmbedding, CacheKey, EmbeddingCache
from handlers.text.shared_cache import SharedCache

if TYPE_CHECKING:
    from handlers.text.handler import LoadedTextModel

# One row of a text model: a text, or a text pair (premise and hypothesis, query and document) for a classifier.
Row = str | tuple[str, str]


class RowsRequest(Protocol):
    """What batch assembly needs of a request: its rows, how errors name them, whether truncation is allowed."""

    @property
    def texts(self) -> Sequence[Row]: ...

    @property
    def names(self) -> Sequence[str]: ...

    @property
    def truncate(self) -> bool: ...


@dataclass(frozen=True)
class BatchStats:
    """What a batch cost, for its metrics and for the decision to return freed memory."""

    rows: int  # texts of accepted requests (cached or computed)
    hits: int  # distinct texts answered from the worker's cache
    misses: int  # distinct texts computed
    padded_tokens: int  # tokens the forward passes compute, padding included
    real_tokens: int  # tokens of the computed texts
    shared_hits: int = 0  # distinct texts answered from the shared tier (not counted in hits)


@dataclass(frozen=True)
class ForwardPass:
    rows: list[int]  # positions among the batch's computed rows
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None = None  # models that segment text pairs (BERT classifiers)

    @property
    def inputs(self) -> tuple[torch.Tensor, ...]:
        """The model's arguments, in its forward's order."""
        if self.token_type_ids is None:
            return (self.input_ids, self.attention_mask)
        return (self.input_ids, self.attention_mask, self.token_type_ids)


@dataclass
class EmbeddingBatch:
    """What preprocess hands on: cached rows, rows to compute (as padded groups) and per-request errors."""

    keys: list[list[CacheKey]]  # per request, the cache key of each of its texts
    known: dict[CacheKey, CachedEmbedding]  # key -> entry, for cache hits (and, after inference, computed rows)
    errors: list[RequestError | None]  # per request: None or its error
    compute_keys: list[CacheKey] = field(default_factory=list)  # rows to compute, in order
    compute_tokens: list[int] = field(default_factory=list)
    compute_truncated: list[bool] = field(default_factory=list)
    passes: list[ForwardPass] = field(default_factory=list)
    stats: BatchStats | None = None

    @property
    def rows(self) -> int:
        return self.stats.rows if self.stats is not None else 0


@dataclass(frozen=True)
class ComputedBatch:
    """What inference hands to postprocess: the batch and its computed rows ([len(compute_keys), dim], fp32)."""

    batch: EmbeddingBatch
    embeddings: torch.Tensor


def pad_rows(
    id_lists: Sequence[Sequence[int]],
    pad_length: int,
    pad_id: int,
    type_lists: Sequence[Sequence[int]] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Token id lists -> (input_ids, attention_mask[, token_type_ids]), right-padded to ``pad_length``."""
    ids = [list(row) + [pad_id] * (pad_length - len(row)) for row in id_lists]
    mask = [[1] * len(row) + [0] * (pad_length - len(row)) for row in id_lists]
    padded = (torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long))
    if type_lists is None:
        return padded
    types = [list(row) + [0] * (pad_length - len(row)) for row in type_lists]
    return (*padded, torch.tensor(types, dtype=torch.long))


def encode_padded(
    loaded: LoadedTextModel, texts: Sequence[Row], pad_length: int | None = None
) -> tuple[torch.Tensor, ...]:
    """Tokenize rows in one call and pad them to one length (for the gate and warm-up inputs)."""
    encodings = loaded.tokenizer.encode_batch(list(texts))
    pad_length = pad_length or max(len(e.ids) for e in encodings)
    types = [e.type_ids for e in encodings] if loaded.info.token_types else None
    return pad_rows([e.ids for e in encodings], pad_length, loaded.pad_id, types)


def assemble_batch(
    payloads: Sequence[RowsRequest],
    loaded: LoadedTextModel,
    cache: EmbeddingCache,
    key_of: Callable[[Row], CacheKey],
    max_request_tokens: int,
    max_forward_tokens: int,
    shared: SharedCache | None = None,
) -> EmbeddingBatch:
    """Cache lookups (the worker's cache, then the shared tier for its misses in one round trip), one tokenizer call
    for the remaining misses, truncation and token checks, then padded length groups."""
    batch = EmbeddingBatch(keys=[], known={}, errors=[None] * len(payloads))
    miss_index: dict[CacheKey, int] = {}  # key -> position among the misses (a repeated text is computed once)
    misses: list[Row] = []
    miss_keys: list[CacheKey] = []
    for payload in payloads:
        keys = [key_of(text) for text in payload.texts]
        batch.keys.append(keys)
        for key, text in zip(keys, payload.texts, strict=True):
            if key in batch.known or key in miss_index:
                continue
            cached = cache.get(key)
            if cached is not None:
                batch.known[key] = cached
            else:
                miss_index[key] = len(misses)
                misses.append(text)
                miss_keys.append(key)
    local_hits = len(batch.known)
    if shared is not None and miss_keys:
        misses, miss_keys = ask_shared_tier(shared, cache, batch.known, misses, miss_keys)
        miss_index = {key: m for m, key in enumerate(miss_keys)}
    encodings = loaded.tokenizer.encode_batch(misses) if misses else []

    needed: set[int] = set()
    for number, (payload, keys) in enumerate(zip(payloads, batch.keys, strict=True)):
        batch.errors[number] = request_error(
            payload, keys, batch.known, miss_index, encodings, loaded.max_tokens, max_request_tokens
        )
        if batch.errors[number] is None:
            needed.update(miss_index[key] for key in keys if key in miss_index)

    order = sorted(needed)  # misses some accepted request needs, in arrival order
    batch.compute_keys = [miss_keys[m] for m in order]
    batch.compute_tokens = [len(encodings[m].ids) for m in order]
    batch.compute_truncated = [bool(encodings[m].overflowing) for m in order]
    groups = plan_forward_groups(batch.compute_tokens, loaded.buckets, max_forward_tokens)
    types = loaded.info.token_types
    for group in groups:
        # Tensors are made here, outside inference mode, exactly like warm-up's (a compiled graph guards on it).
        tensors = pad_rows(
            [encodings[order[row]].ids for row in group.rows],
            group.pad_length,
            loaded.pad_id,
            [encodings[order[row]].type_ids for row in group.rows] if types else None,
        )
        batch.passes.append(ForwardPass(group.rows, *tensors))
    batch.stats = BatchStats(
        rows=sum(len(keys) for keys, error in zip(batch.keys, batch.errors, strict=True) if error is None),
        hits=local_hits,
        misses=len(order),
        shared_hits=len(batch.known) - local_hits,
        padded_tokens=padded_tokens(groups),
        real_tokens=sum(batch.compute_tokens),
    )
    return batch


def ask_shared_tier(
    shared: SharedCache,
    cache: EmbeddingCache,
    known: dict[CacheKey, CachedEmbedding],
    misses: list[Row],
    miss_keys: list[CacheKey],
) -> tuple[list[Row], list[CacheKey]]:
    """One round trip for the worker cache's misses: entries found join ``known`` (and the worker's cache); returns
    the texts and keys still to compute."""
    found = shared.get_many(miss_keys)
    if not found:
        return misses, miss_keys
    for key, entry in found.items():
        known[key] = entry
        cache.put(key, entry)
    remaining = [m for m, key in enumerate(miss_keys) if key not in found]
    return [misses[m] for m in remaining], [miss_keys[m] for m in remaining]


def request_error(
    payload: RowsRequest,
    keys: Sequence[CacheKey],
    known: dict[CacheKey, CachedEmbedding],
    miss_index: dict[CacheKey, int],
    encodings: Sequence[Any],
    max_tokens: int,
    max_request_tokens: int,
) -> RequestError | None:
    """Why one request cannot be served after tokenizing (a text over the token limit with truncate false, or too
    many tokens in all), or None. Tokens are counted whether or not a text is cached, so that acceptance never
    depends on the cache's state."""
    tokens = 0
    for key, name in zip(keys, payload.names, strict=True):
        if key in known:
            truncated, tokens = known[key].truncated, tokens + known[key].tokens
        else:
            encoding = encodings[miss_index[key]]
            truncated, tokens = bool(encoding.overflowing), tokens + len(encoding.ids)
        if truncated and not payload.truncate:
            return RequestError(
                f"{name} is longer than the model's limit of {max_tokens} tokens and 'truncate' is false"
            )
    if tokens > max_request_tokens:
        return too_large(
            f"the request has {tokens} tokens after truncation; handler.max_request_tokens is {max_request_tokens}"
        )
    return None


def answer_requests(
    computed: ComputedBatch,
    payloads: Sequence[RowsRequest],
    cache: EmbeddingCache,
    format_answer: Callable[[Any, list[CachedEmbedding]], Any],
    shared: SharedCache | None = None,
) -> list[Any]:
    """Answer each request with its own rows in its own order (``format_answer(payload, rows)``, the model kind's
    answer shape), then store the computed rows in the worker's cache and (one pipelined round trip) in the shared
    tier."""
    batch, embeddings = computed.batch, computed.embeddings
    known = dict(batch.known)
    computed_entries = []
    for row, key in enumerate(batch.compute_keys):
        entry = CachedEmbedding(embeddings[row].clone(), batch.compute_tokens[row], batch.compute_truncated[row])
        known[key] = entry
        computed_entries.append((key, entry))
    results: list[Any] = []
    for payload, keys, error in zip(payloads, batch.keys, batch.errors, strict=True):
        if error is not None:
            results.append(error)
        else:
            results.append(format_answer(payload, [known[key] for key in keys]))
    for key, entry in computed_entries:
        cache.put(key, entry)
    if shared is not None and computed_entries:
        shared.put_many(computed_entries)
    return results
