"""A decoding step's attention over each row's own columns instead of the whole padded width.

The running batch's key/value cache is right-aligned (:mod:`handlers.generation.kv_cache`): a row that joined
later, or with a shorter prompt, has padding on its left, and the stock attention reads every column of every row
and masks the padding out. Beside a long prompt, short rows then pay its width: at 16 rows, one 256-token prompt
among 9-token ones, most of the keys and values a step reads are padding.

:func:`attention` computes a decoding step (one query per row, a boolean padding mask) in segments of consecutive
rows, each over the columns from its earliest used one on: the slices are views of the cache (no copy), so what a
segment skips is neither read nor computed. How the rows are cut (:func:`segments`) weighs the columns skipped
against the cost of one more call (:data:`CALL_COLUMNS`). Rows keep the batch's order, so the rows that join later
(the shorter ones, as rows grow a column per step together) tend to be neighbours. Within a segment the mask still
hides padding and any gap of a row, so each row attends to exactly the keys it did before; only the summation runs
over fewer masked-out terms (exact zeros), which may change the last bit of a sum (greedy tokens are checked at load:
:mod:`handlers.generation.decode_attention`). Everything else (prefill, chunks, a mask that is not a per-row padding
mask) goes to transformers' ``sdpa`` unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

# A call's fixed cost, in columns of one row: one more segment pays for itself when it skips more than this many.
# (On the AVX512 EPYC of docs/generation.md a small sdpa call costs ~12 us, a row's column of GPT-2-small keys and
# values ~1 us to read from memory; 32 leans towards fewer calls.)
CALL_COLUMNS = 32

Segment = tuple[int, int, int]  # (first row, row after the last, first column)

# The plan of the last mask seen: the model passes the same mask tensor to every layer of a pass.
_last_plan: tuple[torch.Tensor | None, list[Segment]] = (None, [])


def segments(starts: list[int], width: int, call_columns: int = CALL_COLUMNS) -> list[Segment]:
    """Cut rows (their first used column ``starts``, all below ``width``) into runs of consecutive rows, each
    computed over the columns from its earliest start: the cut that minimises columns read plus ``call_columns`` per
    run (dynamic programming over the cut points; rows are few)."""
    rows = len(starts)
    best = [0] + [0] * rows  # best[j]: cost of rows 0..j-1
    cut = [0] * (rows + 1)  # cut[j]: first row of the last run ending at row j-1
    for end in range(1, rows + 1):
        earliest, best[end] = width, -1
        for first in range(end - 1, -1, -1):
            earliest = min(earliest, starts[first])
            cost = best[first] + call_columns + (end - first) * (width - earliest)
            if best[end] < 0 or cost < best[end]:
                best[end], cut[end] = cost, first
    plan: list[Segment] = []
    end = rows
    while end > 0:
        first = cut[end]
        plan.append((first, end, min(starts[first:end])))
        end = first
    return plan[::-1]


def plan_for(mask: torch.Tensor) -> list[Segment]:
    """The segments of a ``[rows, 1, 1, columns]`` boolean mask (remembered for the pass's next layers)."""
    global _last_plan
    if _last_plan[0] is mask:
        return _last_plan[1]
    rows_mask = mask[:, 0, 0, :]
    starts = rows_mask.to(torch.uint8).argmax(dim=1).tolist()  # a row's first True column
    plan = segments(starts, int(rows_mask.shape[1]))
    _last_plan = (mask, plan)
    return plan


def is_padded_decode(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """A decoding step's shapes: one query per row, and a per-row boolean mask over the key columns."""
    return (
        query.shape[2] == 1
        and mask is not None
        and mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[0] == query.shape[0] == key.shape[0]
        and mask.shape[1] == 1
        and mask.shape[2] == 1
        and mask.shape[3] == key.shape[2]
    )


def attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: a decoding step per segment of rows, else plain ``sdpa``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not is_padded_decode(query, key, attention_mask):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    assert attention_mask is not None  # is_padded_decode
    plan = plan_for(attention_mask)
    if len(plan) == 1 and plan[0][2] == 0:  # every column read anyway: the stock call
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    parts = [
        sdpa_attention_forward(
            module, query[first:end], key[first:end, :, start:], value[first:end, :, start:],
            attention_mask[first:end, :, :, start:], dropout, scaling, **kwargs,
        )[0]
        for first, end, start in plan
    ]  # fmt: skip
    return (parts[0] if len(parts) == 1 else torch.cat(parts)), None
