"""Batch assembly for every text model: cache lookups (the worker's LRU, then one round trip to the shared tier for
its misses), one tokenizer call, limits, padded length groups; and the answers once the rows are computed, after
which the computed rows are stored in both tiers. Each step returns what the next one needs (:class:`TextBatch`,
:class:`ComputedRows`). Nothing here knows a model's kind: a kind decides what a computed row is
(handlers/text/kinds), its request module what a request says and how it is answered (handlers/text/requests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from handlers.core.answer_size import answer_too_large
from handlers.core.errors import RequestError, too_large
from handlers.text.buckets import padded_tokens, plan_forward_groups, right_padded
from handlers.text.cache import CachedRow, CacheKey, RowCache
from handlers.text.folder import TextModelFolder
from handlers.text.rows import DEFAULT_OPTIONS, Row, RowOptions
from handlers.text.shared_cache import SharedCache
from handlers.text.tokenization import ServedTokenizer


class EncodingModel(Protocol):
    """What batch assembly needs of a loaded model (handlers/text/engine.py ``LoadedTextModel`` is one): declared
    here, below the engine, so this module does not import the engine that imports it."""

    @property
    def info(self) -> TextModelFolder: ...

    @property
    def tokenizer(self) -> ServedTokenizer: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def buckets(self) -> list[int]: ...


class RowsRequest(Protocol):
    """What batch assembly needs of a request: its rows, how errors name them, whether truncation is allowed, and
    (where not the defaults) each row's options."""

    @property
    def texts(self) -> Sequence[Row]: ...

    @property
    def names(self) -> Sequence[str]: ...

    @property
    def truncate(self) -> bool: ...

    @property
    def options(self) -> Sequence[RowOptions] | None: ...


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
    inputs: tuple[torch.Tensor, ...]  # the model's arguments, in its forward's order (TextModelFolder.model_inputs)


@dataclass
class TextBatch:
    """What preprocess hands on: cached rows, rows to compute (as padded groups) and per-request errors."""

    keys: list[list[CacheKey]]  # per request, the cache key of each of its rows
    known: dict[CacheKey, CachedRow]  # key -> entry, for cache hits (and, after inference, computed rows)
    errors: list[RequestError | None]  # per request: None or its error
    compute_keys: list[CacheKey] = field(default_factory=list)  # rows to compute, in order
    compute_ids: list[list[int]] = field(default_factory=list)  # their token ids (after truncation)
    compute_truncated: list[bool] = field(default_factory=list)
    compute_options: list[RowOptions] = field(default_factory=list)
    passes: list[ForwardPass] = field(default_factory=list)
    stats: BatchStats | None = None
    forward_cores: int = 0  # cores its forward passes ran on (set by the engine's compute: the core lease)

    @property
    def rows(self) -> int:
        return self.stats.rows if self.stats is not None else 0


@dataclass(frozen=True)
class ComputedRows:
    """What inference hands to postprocess: the batch and one value per computed row (its kind's row_value)."""

    batch: TextBatch
    values: list[Any]


@dataclass(frozen=True)
class Encoded:
    """Token ids made up or cut to a length (warm-up rows, the build's gate shapes), where a tokenizer's encoding is
    not what is wanted."""

    ids: list[int]
    type_ids: list[int]


def row_options(request: RowsRequest) -> Sequence[RowOptions]:
    return request.options or [DEFAULT_OPTIONS] * len(request.texts)


def model_inputs(
    info: TextModelFolder,
    encodings: Sequence[Any],
    options: Sequence[RowOptions],
    pad_length: int,
) -> tuple[torch.Tensor, ...]:
    """Encodings -> the model's arguments, right-padded to ``pad_length``, in ``info.model_inputs`` order:
    input_ids, attention_mask, then token_type_ids (where the model takes them) and prompt_lengths (where its pooling
    leaves the prompt out)."""
    ids, mask = right_padded([e.ids for e in encodings], info.pad_id, pad_length)
    tensors = {"input_ids": torch.tensor(ids, dtype=torch.long), "attention_mask": torch.tensor(mask, dtype=torch.long)}
    if "token_type_ids" in info.model_inputs:
        types = [list(e.type_ids) + [0] * (pad_length - len(e.type_ids)) for e in encodings]
        tensors["token_type_ids"] = torch.tensor(types, dtype=torch.long)
    if "prompt_lengths" in info.model_inputs:
        tensors["prompt_lengths"] = torch.tensor([o.prompt_length for o in options], dtype=torch.long)
    return tuple(tensors[name] for name in info.model_inputs)


def encode_rows(loaded: EncodingModel, rows: Sequence[Row], options: Sequence[RowOptions]) -> list[Any]:
    """Tokenize rows: one tokenizer call per token limit among them (one call when no row has its own limit)."""
    limits = sorted({o.max_tokens for o in options})
    if len(limits) == 1:
        return loaded.tokenizer.encode_batch(list(rows), limits[0])
    encodings: list[Any] = [None] * len(rows)
    for limit in limits:
        chosen = [i for i, o in enumerate(options) if o.max_tokens == limit]
        for i, encoding in zip(chosen, loaded.tokenizer.encode_batch([rows[i] for i in chosen], limit), strict=True):
            encodings[i] = encoding
    return encodings


def encode_padded(
    loaded: EncodingModel,
    rows: Sequence[Row],
    options: Sequence[RowOptions] | None = None,
    pad_length: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """Tokenize rows and pad them to one length (the gate, warm-up and benchmark inputs)."""
    options = options or [DEFAULT_OPTIONS] * len(rows)
    encodings = encode_rows(loaded, rows, options)
    return model_inputs(loaded.info, encodings, options, pad_length or max(len(e.ids) for e in encodings))


def assemble_batch(
    payloads: Sequence[RowsRequest],
    loaded: EncodingModel,
    cache: RowCache,
    key_of: Callable[[Row, RowOptions], CacheKey],
    max_request_tokens: int,
    max_forward_tokens: int,
    shared: SharedCache | None = None,
    max_answer_bytes: int = 0,
) -> TextBatch:
    """Cache lookups (the worker's cache, then the shared tier for its misses in one round trip), one tokenizer call
    for the remaining misses, truncation, token and answer-size checks (``max_answer_bytes``, 0 = none), then padded
    length groups."""
    batch = TextBatch(keys=[], known={}, errors=[None] * len(payloads))
    miss_index: dict[CacheKey, int] = {}  # key -> position among the misses (a repeated text is computed once)
    misses: list[Row] = []
    miss_keys: list[CacheKey] = []
    miss_options: list[RowOptions] = []
    for payload in payloads:
        options = row_options(payload)
        keys = [key_of(text, option) for text, option in zip(payload.texts, options, strict=True)]
        batch.keys.append(keys)
        for key, text, option in zip(keys, payload.texts, options, strict=True):
            if key in batch.known or key in miss_index:
                continue
            cached = cache.get(key)
            if cached is not None:
                batch.known[key] = cached
            else:
                miss_index[key] = len(misses)
                misses.append(text)
                miss_keys.append(key)
                miss_options.append(option)
    local_hits = len(batch.known)
    if shared is not None and miss_keys:
        found = ask_shared_tier(shared, cache, batch.known, miss_keys)
        remaining = [m for m, key in enumerate(miss_keys) if key not in found]
        misses = [misses[m] for m in remaining]
        miss_keys = [miss_keys[m] for m in remaining]
        miss_options = [miss_options[m] for m in remaining]
        miss_index = {key: m for m, key in enumerate(miss_keys)}
    encodings = encode_rows(loaded, misses, miss_options) if misses else []

    needed: set[int] = set()
    for number, (payload, keys) in enumerate(zip(payloads, batch.keys, strict=True)):
        batch.errors[number] = request_error(
            payload, keys, batch.known, miss_index, encodings, loaded.max_tokens, max_request_tokens, max_answer_bytes
        )
        if batch.errors[number] is None:
            needed.update(miss_index[key] for key in keys if key in miss_index)

    order = sorted(needed)  # misses some accepted request needs, in arrival order
    batch.compute_keys = [miss_keys[m] for m in order]
    batch.compute_ids = [list(encodings[m].ids) for m in order]
    batch.compute_truncated = [bool(encodings[m].overflowing) for m in order]
    batch.compute_options = [miss_options[m] for m in order]
    lengths = [len(ids) for ids in batch.compute_ids]
    groups = plan_forward_groups(lengths, loaded.buckets, max_forward_tokens)
    for group in groups:
        # Tensors are made here, outside inference mode, exactly like warm-up's (a compiled graph guards on it).
        chosen = [order[row] for row in group.rows]
        inputs = model_inputs(
            loaded.info, [encodings[m] for m in chosen], [miss_options[m] for m in chosen], group.pad_length
        )
        batch.passes.append(ForwardPass(group.rows, inputs))
    batch.stats = BatchStats(
        rows=sum(len(keys) for keys, error in zip(batch.keys, batch.errors, strict=True) if error is None),
        hits=local_hits,
        misses=len(order),
        shared_hits=len(batch.known) - local_hits,
        padded_tokens=padded_tokens(groups),
        real_tokens=sum(lengths),
    )
    return batch


def ask_shared_tier(
    shared: SharedCache, cache: RowCache, known: dict[CacheKey, CachedRow], miss_keys: list[CacheKey]
) -> dict[CacheKey, CachedRow]:
    """One round trip for the worker cache's misses: entries found join ``known`` (and the worker's cache)."""
    found = shared.get_many(miss_keys)
    for key, entry in found.items():
        known[key] = entry
        cache.put(key, entry)
    return found


def request_error(
    payload: RowsRequest,
    keys: Sequence[CacheKey],
    known: dict[CacheKey, CachedRow],
    miss_index: dict[CacheKey, int],
    encodings: Sequence[Any],
    max_tokens: int,
    max_request_tokens: int,
    max_answer_bytes: int = 0,
) -> RequestError | None:
    """Why one request cannot be served after tokenizing (a text over the token limit with truncate false, too many
    tokens in all, or an answer that may be larger than ``max_answer_bytes``), or None. Tokens are counted whether or
    not a text is cached, so that acceptance never depends on the cache's state."""
    row_tokens = []
    for key, name, option in zip(keys, payload.names, row_options(payload), strict=True):
        if key in known:
            truncated, count = known[key].truncated, known[key].tokens
        else:
            encoding = encodings[miss_index[key]]
            truncated, count = bool(encoding.overflowing), len(encoding.ids)
        row_tokens.append(count)
        if truncated and not payload.truncate:
            limit = option.max_tokens or max_tokens
            return RequestError(f"{name} is longer than the model's limit of {limit} tokens and 'truncate' is false")
    tokens = sum(row_tokens)
    if tokens > max_request_tokens:
        return too_large(
            f"the request has {tokens} tokens after truncation; handler.max_request_tokens is {max_request_tokens}"
        )
    # A request whose answer grows with its tokens (one vector per token) says how large it can be: refused here, its
    # rows are never computed; every other answer is measured once made (handlers/core/base.py).
    estimate = getattr(payload, "answer_bytes", None)
    size = estimate(row_tokens) if max_answer_bytes and estimate is not None else None
    if size is not None and size > max_answer_bytes:
        return answer_too_large(size, max_answer_bytes, getattr(payload, "fit_hint", None), estimated=True)
    return None


def answer_requests(
    computed: ComputedRows,
    payloads: Sequence[RowsRequest],
    cache: RowCache,
    format_answer: Callable[[Any, list[CachedRow]], Any],
    shared: SharedCache | None = None,
) -> list[Any]:
    """Answer each request with its own rows in its own order (``format_answer(payload, rows)``, the model kind's
    answer shape), then store the computed rows in the worker's cache and (one pipelined round trip) in the shared
    tier."""
    batch = computed.batch
    known = dict(batch.known)
    computed_entries = []
    for row, key in enumerate(batch.compute_keys):
        entry = CachedRow(computed.values[row], len(batch.compute_ids[row]), batch.compute_truncated[row])
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
