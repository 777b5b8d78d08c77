"""Length-aware batching: group rows by token length so one long text does not pad many short ones.

Each row goes into the smallest bucket that holds its length and is padded to that bucket's length; a bucket's rows
run in forward passes of at most ``max_forward_tokens`` padded tokens. Bucket lengths are a short fixed list, so the
shapes a worker serves are known in advance (warm-up covers them) and padding stays bounded.

Padding itself is here too, one way for every text model (:func:`right_padded`: on the right, with the attention
mask), and :class:`PaddingRule` says which lengths a model's rows are padded to: its buckets, or one fixed length for
a model that reads its padding (SigLIP's text tower, padded to 64 tokens as it was trained, handlers/image/).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ForwardGroup:
    """One forward pass: the rows (indices into the caller's list) and the length they are padded to."""

    pad_length: int
    rows: list[int]


def check_buckets(buckets: Sequence[int], max_tokens: int) -> list[int]:
    """Bucket lengths must be strictly increasing positive ints; the last one must hold the longest input."""
    if not buckets or any(type(b) is not int or b < 2 for b in buckets):
        raise ValueError(f"length buckets must be integers >= 2, got {buckets!r}")
    if list(buckets) != sorted(set(buckets)):
        raise ValueError(f"length buckets must be strictly increasing, got {buckets!r}")
    if buckets[-1] != max_tokens:
        raise ValueError(f"the last length bucket must equal the model's token limit {max_tokens}, got {buckets[-1]}")
    return list(buckets)


def auto_buckets(max_tokens: int, smallest: int = 16) -> list[int]:
    """Powers of two from ``smallest`` below the model's limit, then the limit itself: 256 -> 16, 32, 64, 128, 256;
    512 -> ... 256, 512; 100 -> 16, 32, 64, 100. Every bucket at least halves the padding of the one above it."""
    buckets = []
    length = smallest
    while length < max_tokens:
        buckets.append(length)
        length *= 2
    return [*buckets, max_tokens]


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket length >= length (the last bucket when none is)."""
    for bucket in buckets:
        if length <= bucket:
            return bucket
    return buckets[-1]


def plan_forward_groups(lengths: Sequence[int], buckets: Sequence[int], max_forward_tokens: int) -> list[ForwardGroup]:
    """Split rows into forward passes by bucket; rows keep their relative order inside a group.

    Returns groups ordered by bucket length. Every row index appears in exactly one group.
    """
    by_bucket: dict[int, list[int]] = {}
    for row, length in enumerate(lengths):
        by_bucket.setdefault(bucket_length(length, buckets), []).append(row)
    groups = []
    for pad_length in sorted(by_bucket):
        rows = by_bucket[pad_length]
        per_pass = max(1, max_forward_tokens // pad_length)
        for start in range(0, len(rows), per_pass):
            groups.append(ForwardGroup(pad_length, rows[start : start + per_pass]))
    return groups


def padded_tokens(groups: Sequence[ForwardGroup]) -> int:
    return sum(group.pad_length * len(group.rows) for group in groups)


def padding_ratio(groups: Sequence[ForwardGroup], lengths: Sequence[int]) -> float:
    """Padded tokens the model computes / real tokens (1.0 = no padding at all)."""
    real = sum(lengths)
    return padded_tokens(groups) / real if real else 1.0


def right_padded(rows: Sequence[Sequence[int]], pad_id: int, length: int) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids padded on the right to ``length`` with ``pad_id``, and their attention mask (1 = a real token).
    Every text model's rows are padded here (handlers/text/batch.py, the image-text kind's text tower)."""
    ids = [list(row) + [pad_id] * (length - len(row)) for row in rows]
    mask = [[1] * len(row) + [0] * (length - len(row)) for row in rows]
    return ids, mask


@dataclass(frozen=True)
class PaddingRule:
    """How a model's rows are padded, always on the right: to their length bucket (``fixed`` 0: the buckets of
    :func:`auto_buckets`, the padding masked), or every row to ``fixed`` tokens, where the model was trained on
    padding of that length and reads it (SigLIP's text tower: 64 tokens, the length transformers' zero-shot pipeline
    pads to). ``mask``: whether the model is fed the attention mask (with fixed padding only where its tokenizer
    makes one, as transformers feeds it; with buckets always, so that the padding changes nothing)."""

    max_tokens: int  # rows are truncated to this many tokens (special tokens included)
    fixed: int = 0
    mask: bool = True

    def __post_init__(self) -> None:
        if self.fixed and self.fixed < self.max_tokens:
            raise ValueError(f"rows of up to {self.max_tokens} tokens cannot be padded to a fixed {self.fixed}")
        if not self.fixed and not self.mask:
            raise ValueError("bucketed padding is masked (a row's tokens must not see another length's padding)")

    @property
    def buckets(self) -> list[int]:
        return [self.fixed] if self.fixed else auto_buckets(self.max_tokens)

    def groups(self, lengths: Sequence[int], max_forward_tokens: int) -> list[ForwardGroup]:
        """Forward passes of rows of these lengths, each padded to its group's ``pad_length``."""
        return plan_forward_groups(lengths, self.buckets, max_forward_tokens)

    def record(self) -> dict[str, object]:
        """What a staged folder records (image_model.json): ``{"fixed": 64, "mask": false}`` or ``{"buckets": [16,
        32, 64, 77], "mask": true}``, with the token limit."""
        shape: dict[str, object] = {"fixed": self.fixed} if self.fixed else {"buckets": self.buckets}
        return {**shape, "mask": self.mask, "max_tokens": self.max_tokens}

    @classmethod
    def from_record(cls, record: dict[str, object]) -> PaddingRule:
        fixed = record.get("fixed") or 0
        max_tokens = record["max_tokens"]
        if not isinstance(fixed, int) or not isinstance(max_tokens, int):
            raise ValueError(f"a padding rule's fixed length and token limit are integers, got {record!r}")
        rule = cls(max_tokens, fixed, bool(record.get("mask", True)))
        if not fixed and record.get("buckets") != rule.buckets:
            raise ValueError(f"recorded buckets {record.get('buckets')!r} are not {rule.buckets}")
        return rule
