"""The key/value cache of a batch of rows that join and leave between decoding steps.

One Hugging Face ``DynamicCache`` holds every row of the running batch: per layer a keys and a values tensor of shape
``[rows, heads, columns, head_dim]``, with a ``[rows, columns]`` attention mask saying which columns of a row hold one
of its tokens. Rows are aligned on the right (every row's newest token is in the last column), so a row that joined
later, or with a shorter prompt, has padding on its left; a prompt that reused a cached prefix may also have a gap
between its prefix and the rest. Attention ignores padding (mask 0) and position ids count a row's real tokens only,
so every row computes exactly what it would alone.

The operations here change the batch between steps: :func:`merge` (rows that finished their prefill join),
:func:`select_rows` (rows that finished or were cancelled leave), :func:`drop_dead_columns` (columns no remaining row
uses are freed), :func:`row_columns` (one row's keys and values, e.g. for the prefix cache) and :func:`from_rows`
(a cache built from per-row prefixes). They work on layers that keep every column (full attention: transformers'
``DynamicLayer``, here the :func:`growing_layer` that appends a step's column in place instead of copying the layer);
a model whose cache keeps a sliding window or shares layers is refused by :func:`check_mergeable`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

# Per layer: (keys, values), each [heads, tokens, head_dim] for one row.
RowKV = list[tuple[torch.Tensor, torch.Tensor]]


class UnsupportedCache(ValueError):
    """The model's key/value cache is not one whose rows can join and leave between steps."""


def new_cache(model: Any) -> Any:
    """A fresh dynamic key/value cache for this model, its full-attention layers growing in place
    (:func:`growing_layer`)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    layer_class = growing_layer()
    cache.layers = [layer_class() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


# Spare columns a layer's buffers get when they are (re)allocated: at least this many, or half the used width.
SPARE_COLUMNS = 64


@functools.cache
def growing_layer() -> type:
    """The class of a full-attention cache layer whose keys and values are views of buffers with spare columns.

    transformers' ``DynamicLayer`` concatenates at every update: the whole layer is copied to add one column (on the
    124 M model at 16 rows x 150 columns, 177 MB per step; docs/generation.md). This subclass writes a step's new
    columns into the spare room and makes ``keys``/``values`` longer views of the same buffers; they are reallocated
    (with room again) only when full, or when something else replaced ``keys``/``values`` (rows joining or leaving,
    dead columns dropped: the functions of this module assign new tensors, adopted at the next update). A view
    restored after a failed step is recognised as the start of its buffer, so restoring copies nothing either.
    (Built on first use: transformers is imported only when a cache is made.)"""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.key_buffer: torch.Tensor | None = None
            self.value_buffer: torch.Tensor | None = None

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            assert self.keys is not None and self.values is not None  # set by lazy_initialization
            self.keys, self.key_buffer = appended(self.keys, self.key_buffer, key_states)
            self.values, self.value_buffer = appended(self.values, self.value_buffer, value_states)
            return self.keys, self.values

    return GrowingLayer


def appended(view: torch.Tensor, buffer: torch.Tensor | None, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``view`` with ``new`` appended along the columns (dim -2), and the buffer it is a view of: written into
    ``buffer``'s spare columns when ``view`` is that buffer's start and there is room, else into a new buffer."""
    used = view.shape[-2] if view.dim() == 4 else 0  # a fresh layer's keys are an empty 1-d tensor
    needed = used + new.shape[-2]
    in_place = (
        buffer is not None
        and needed <= buffer.shape[-2]
        and buffer.shape[:-2] == new.shape[:-2]
        and (used == 0 or (view.data_ptr() == buffer.data_ptr() and view.stride() == buffer.stride()))
    )
    if not in_place:
        capacity = needed + max(SPARE_COLUMNS, needed // 2)
        buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
        if used:
            buffer[..., :used, :] = view
    assert buffer is not None
    buffer[..., used:needed, :] = new
    return buffer[..., :needed, :], buffer


def unsupported_layers(model: Any) -> list[str]:
    """The kinds of the model's cache layers that do not keep every column (sliding window, shared): rows of such a
    cache cannot join a batch or reuse a prefix; [] for a full-attention model."""
    return sorted({type(layer).__name__ for layer in new_cache(model).layers if type(layer) is not growing_layer()})


def check_mergeable(model: Any) -> None:
    """Raise :class:`UnsupportedCache` unless every layer of the model's cache keeps all columns (full attention)."""
    kinds = unsupported_layers(model)
    if kinds:
        raise UnsupportedCache(
            f"the model's key/value cache has {', '.join(kinds)} layers (sliding-window or shared attention); "
            "rows of the batch can join and leave between steps only with full-attention layers"
        )


def layers(cache: Any) -> list[Any]:
    return [layer for layer in cache.layers if layer.is_initialized and layer.keys is not None]


def set_layer(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> None:
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values


def snapshot(cache: Any) -> list[tuple[Any, Any]]:
    """The layers' current tensors: a step replaces them with longer ones (views of the same buffers, whose columns
    before the step it does not touch), so these restore a failed step."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def restore(cache: Any, saved: list[tuple[Any, Any]]) -> None:
    for layer, (keys, values) in zip(cache.layers, saved, strict=True):
        layer.keys, layer.values = keys, values


def pad_left(tensor: torch.Tensor, columns: int, dim: int) -> torch.Tensor:
    """``tensor`` with ``columns`` zero columns prepended along ``dim``."""
    if columns <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = columns
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def merge(cache: Any, mask: torch.Tensor, joining: Any, joining_mask: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The rows of ``joining`` appended after those of ``cache`` (both right-aligned; the narrower one is padded on
    the left). Returns (cache, mask); ``cache`` is reused."""
    width, joining_width = mask.shape[1], joining_mask.shape[1]
    target = max(width, joining_width)
    for layer, other in zip(cache.layers, joining.layers, strict=True):
        if not other.is_initialized:
            continue
        keys = torch.cat([pad_left(layer.keys, target - width, -2), pad_left(other.keys, target - joining_width, -2)])
        values = torch.cat(
            [pad_left(layer.values, target - width, -2), pad_left(other.values, target - joining_width, -2)]
        )
        set_layer(layer, keys, values)
    merged_mask = torch.cat([pad_left(mask, target - width, 1), pad_left(joining_mask, target - joining_width, 1)])
    return cache, merged_mask


def select_rows(cache: Any, mask: torch.Tensor, keep: list[int]) -> torch.Tensor:
    """Keep only rows ``keep`` (in that order) of the cache, in place; returns their mask."""
    index = torch.tensor(keep, dtype=torch.long, device=mask.device)
    for layer in layers(cache):
        layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))
        layer.values = layer.values.index_select(0, index.to(layer.values.device))
    return mask.index_select(0, index)


def drop_dead_columns(cache: Any, mask: torch.Tensor) -> torch.Tensor:
    """Remove the columns no row uses (left by rows that left, or gaps of a batch's prefill); returns the mask."""
    used = mask.bool().any(dim=0)
    if bool(used.all()):
        return mask
    columns = used.nonzero().flatten()
    for layer in layers(cache):
        layer.keys = layer.keys.index_select(-2, columns.to(layer.keys.device))
        layer.values = layer.values.index_select(-2, columns.to(layer.values.device))
    return mask.index_select(1, columns)


def row_columns(cache: Any, mask: torch.Tensor, row: int, start: int, stop: int) -> RowKV:
    """Keys and values of tokens ``start``..``stop``-1 of one row (counting its real tokens only), as new tensors."""
    columns = mask[row].nonzero().flatten()[start:stop]
    result = []
    for layer in layers(cache):
        index = columns.to(layer.keys.device)
        result.append((layer.keys[row].index_select(-2, index), layer.values[row].index_select(-2, index)))
    return result


def from_rows(model: Any, prefixes: list[RowKV | None], device: torch.device) -> tuple[Any, torch.Tensor]:
    """A cache whose row i holds ``prefixes[i]`` (None: nothing), right-aligned, and its mask."""
    lengths = [0 if prefix is None else prefix[0][0].shape[-2] for prefix in prefixes]
    width = max(lengths, default=0)
    mask = torch.zeros((len(prefixes), width), dtype=torch.long, device=device)
    cache = new_cache(model)
    if width == 0:
        return cache, mask
    sample = next(prefix for prefix in prefixes if prefix is not None)
    for index, layer in enumerate(cache.layers):
        heads, _, head_dim = sample[index][0].shape
        keys = sample[index][0].new_zeros((len(prefixes), heads, width, head_dim))
        values = sample[index][1].new_zeros((len(prefixes), heads, width, head_dim))
        for row, prefix in enumerate(prefixes):
            if prefix is not None:
                keys[row, :, width - lengths[row] :] = prefix[index][0]
                values[row, :, width - lengths[row] :] = prefix[index][1]
        set_layer(layer, keys, values)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    return cache, mask
