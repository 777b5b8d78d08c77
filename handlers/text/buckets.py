"""Length-aware batching: group rows by token length so one long text does not pad many short ones.

Each row goes into the smallest bucket that holds its length and is padded to that bucket's length; a bucket's rows
run in forward passes of at most ``max_forward_tokens`` padded tokens. Bucket lengths are a short fixed list, so the
shapes a worker serves are known in advance (warm-up covers them) and padding stays bounded.
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
