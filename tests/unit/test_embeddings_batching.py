"""Length bucketing (handlers/text/buckets.py) and the LRU cache (handlers/text/cache.py), without a model."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.text.buckets import bucket_length, check_buckets, padding_ratio, plan_forward_groups
from handlers.text.cache import CachedRow, RowCache

BUCKETS = [16, 32, 64, 128, 256]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=2, max_value=256), max_size=80),
    max_forward_tokens=st.sampled_from([256, 1000, 8192]),
)
def test_every_row_lands_in_exactly_one_group_in_order_and_fits(lengths, max_forward_tokens):
    groups = plan_forward_groups(lengths, BUCKETS, max_forward_tokens)
    rows = [row for group in groups for row in group.rows]
    assert sorted(rows) == list(range(len(lengths)))
    for group in groups:
        assert group.rows == sorted(group.rows)  # relative order kept inside a group
        assert group.pad_length * len(group.rows) <= max(max_forward_tokens, group.pad_length)
        for row in group.rows:
            assert group.pad_length == bucket_length(lengths[row], BUCKETS) >= lengths[row]


def test_one_long_text_no_longer_pads_the_short_ones():
    lengths = [12] * 31 + [256]
    groups = plan_forward_groups(lengths, BUCKETS, 8192)
    assert [(g.pad_length, len(g.rows)) for g in groups] == [(16, 31), (256, 1)]
    bucketed = padding_ratio(groups, lengths)
    padded_to_longest = 256 * len(lengths) / sum(lengths)
    assert bucketed == pytest.approx((16 * 31 + 256) / sum(lengths))  # 1.20: only the bucket round-up is padding
    assert padded_to_longest > 13 and bucketed < padded_to_longest / 10


def test_a_full_bucket_is_split_into_passes_of_bounded_size():
    groups = plan_forward_groups([200] * 70, BUCKETS, 8192)
    assert [len(g.rows) for g in groups] == [32, 32, 6]
    assert [g.rows[0] for g in groups] == [0, 32, 64]


@pytest.mark.parametrize(
    "buckets, fragment",
    [
        ([], "integers"),
        ([16, 8, 256], "increasing"),
        ([16, 16, 256], "increasing"),
        ([16, 128], "token limit 256"),
        ([1, 256], "integers >= 2"),
        ([16.0, 256], "integers"),
    ],
)
def test_bad_bucket_lists_are_refused(buckets, fragment):
    with pytest.raises(ValueError, match=fragment):
        check_buckets(buckets, 256)


def entry(value):
    return CachedRow(torch.full((2,), float(value)), value, False)


def test_cache_evicts_the_least_recently_used_entry():
    cache = RowCache(2)
    cache.put("a", entry(1))
    cache.put("b", entry(2))
    assert cache.get("a").tokens == 1  # a is now the most recently used
    cache.put("c", entry(3))
    assert cache.get("b") is None and cache.get("a").tokens == 1 and cache.get("c").tokens == 3
    assert len(cache) == 2


def test_cache_of_size_zero_stores_nothing():
    cache = RowCache(0)
    cache.put("a", entry(1))
    assert cache.get("a") is None and len(cache) == 0
