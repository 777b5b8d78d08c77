"""handler.decode_attention (handlers/generation/decode_attention.py, row_attention.py): a decoding step's attention
over each row's own columns. The cut into segments is checked against every possible cut, the attention against
sdpa over the padded batch, and greedy fp32 decoding on the demo model against the padded path and against
decoding without a cache: rows of very different lengths together, after the long one left (its columns dropped),
one row alone, and with chunked prefill's mixed passes. No expected tokens are hard-coded (the weights are random)."""

import itertools
import random

import pytest
import torch

from handlers.core.config import ConfigError
from handlers.generation import decode_attention, mixed_pass, row_attention
from handlers.generation.decoding import SamplingSettings, Sequence, recompute
from handlers.generation.running import RunningBatch, generate
from scripts.ops.handler_loader import load_handler

# These options shape the eager torch step, so these handlers decode eagerly (handler.decode_step).
EAGER = {"decode_step": "eager"}


@pytest.fixture(scope="module")
def model_dir(prepared_model_dir):
    return prepared_model_dir("generator")


@pytest.fixture(scope="module")
def per_row_handler(model_dir):
    torch.set_num_threads(1)
    handler, _ = load_handler(
        model_dir, "generator", {"decode_attention": "per_row", **EAGER}, continuous_batching=True
    )
    return handler


@pytest.fixture
def model(per_row_handler):
    model = per_row_handler.loaded.model
    yield model
    mixed_pass.use_per_row(model, True)  # as loaded, whatever a test switched


@pytest.fixture
def plans(monkeypatch):
    """Every cut the per-row attention made: [(starts, width, segments)]."""
    seen = []
    original = row_attention.segments

    def spy(starts, width, *args):
        plan = original(starts, width, *args)
        seen.append((starts, width, plan))
        return plan

    monkeypatch.setattr(row_attention, "segments", spy)
    return seen


def columns_read(plan, width):
    return sum((end - first) * (width - start) for first, end, start in plan)


def cost(plan, width):
    return columns_read(plan, width) + row_attention.CALL_COLUMNS * len(plan)


def test_the_cut_covers_every_row_in_order_and_is_the_cheapest_of_all_cuts():
    rng = random.Random(0)
    for _ in range(200):
        rows, width = rng.randrange(1, 8), rng.randrange(2, 300)
        starts = [rng.randrange(width) for _ in range(rows)]
        plan = row_attention.segments(starts, width)
        assert [first for first, _, _ in plan] == [0] + [end for _, end, _ in plan[:-1]]
        assert plan[-1][1] == rows
        assert all(start == min(starts[first:end]) for first, end, start in plan)  # no used column left out
        cheapest = min(
            cost([(a, b, min(starts[a:b])) for a, b in itertools.pairwise((0, *cuts, rows))], width)
            for count in range(rows)
            for cuts in itertools.combinations(range(1, rows), count)
        )
        assert cost(plan, width) == cheapest


def test_a_long_row_among_short_ones_is_cut_apart_and_equal_rows_stay_one_call():
    width = 266
    starts = [200] * 7 + [0] + [200] * 8  # one 266-token row among 66-token ones
    plan = row_attention.segments(starts, width)
    assert columns_read(plan, width) == width + 15 * (width - 200)  # each row reads its own columns only
    assert len(row_attention.segments([3] * 16, width)) == 1


def padded_mask(rows, width, rng):
    """[rows, 1, 1, width]: left padding of random length, and for some rows a gap (a prefix reused, then the rest)."""
    mask = torch.zeros((rows, 1, 1, width), dtype=torch.bool)
    for row in range(rows):
        start = rng.choice([0, width - 1, rng.randrange(width)])
        mask[row, ..., start:] = True
        if row % 3 == 1 and width - start > 4:
            mask[row, ..., start + 1 : start + 3] = False
    return mask


def test_per_row_attention_equals_sdpa_over_the_padded_batch():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rng = random.Random(1)
    module = torch.nn.Module()
    for rows, width in ((1, 40), (5, 90), (16, 300)):
        query = torch.randn(rows, 4, 1, 16)
        key = torch.randn(rows, 4, width + 8, 16)[:, :, :width]  # a view, as the cache's are
        value = torch.randn(rows, 4, width + 8, 16)[:, :, :width]
        mask = padded_mask(rows, width, rng)
        got, _ = row_attention.attention(module, query, key, value, mask, scaling=0.25)
        expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


PROMPTS = ([(7 * i + 3) % 500 for i in range(60)], [154, 99], [464, 206, 75], [42] * 5)
NEW_TOKENS = (3, 14, 9, 12)  # the long row leaves first


def greedy(model, per_row):
    mixed_pass.use_per_row(model, per_row)
    sequences = [Sequence(list(p), SamplingSettings(n)) for p, n in zip(PROMPTS, NEW_TOKENS, strict=True)]
    alone = Sequence(list(PROMPTS[1]), SamplingSettings(NEW_TOKENS[1]))
    with torch.inference_mode():
        generate(model, sequences, (), 0)
        generate(model, [alone], (), 0)
    return [sequence.token_ids for sequence in [*sequences, alone]]


def test_greedy_tokens_equal_the_padded_paths_and_decoding_without_a_cache(model, plans):
    got = greedy(model, True)
    assert any(len(plan) > 1 for _, _, plan in plans)  # the long row was computed apart from the short ones
    assert greedy(model, False) == got
    reference = [Sequence(list(p), SamplingSettings(n)) for p, n in zip(PROMPTS, NEW_TOKENS, strict=True)]
    with torch.inference_mode():
        recompute(model, reference, frozenset(), 0, None)
    assert [sequence.token_ids for sequence in reference] == got[:-1]


def test_rows_go_on_with_their_tokens_after_the_long_row_leaves_and_its_columns_are_dropped(model, plans):
    def decoded(per_row):
        mixed_pass.use_per_row(model, per_row)
        batch = RunningBatch(model, 0, [])
        rows = [Sequence(list(p), SamplingSettings(n)) for p, n in zip(PROMPTS, NEW_TOKENS, strict=True)]
        with torch.inference_mode():
            batch.prefill(rows[:1])
            batch.prefill(rows[1:])
            widths = []
            while batch.rows:
                batch.step()
                batch.remove_finished()
                widths.append(batch.width)
        return [row.token_ids for row in rows], widths

    got, widths = decoded(True)
    assert widths[0] > len(PROMPTS[0]) > widths[-1]  # the long row's columns went with it
    assert decoded(False) == (got, widths)


def test_mixed_passes_with_rows_of_different_lengths_give_the_padded_paths_tokens(model, plans):
    def decoded(per_row):
        mixed_pass.use_per_row(model, per_row)
        batch = RunningBatch(model, 0, [], chunk_tokens=6)
        assert batch.mixable
        running = [Sequence(list(PROMPTS[0]), SamplingSettings(30)), Sequence(list(PROMPTS[1]), SamplingSettings(30))]
        joining = Sequence(list(PROMPTS[3]) * 4, SamplingSettings(8))
        with torch.inference_mode():
            batch.prefill(running[:1])
            batch.prefill(running[1:])
            batch.begin_filling([joining])
            while batch.filling is not None:
                batch.advance()
            while batch.rows:
                batch.advance()
                batch.remove_finished()
        return [sequence.token_ids for sequence in [*running, joining]]

    got = decoded(True)
    assert plans and any(len(plan) > 1 for _, _, plan in plans)
    assert decoded(False) == got


def test_per_row_is_on_once_the_check_passed_and_describe_says_so(per_row_handler):
    described = per_row_handler.describe()["decode_attention"]
    assert described["setting"] == "per_row" and described["per_row"] is True
    assert described["reason"] == "greedy fp32 tokens equal to the padded path's"
    assert mixed_pass.uses_per_row(per_row_handler.loaded.model)


def test_padded_leaves_sdpa_and_checks_nothing(model_dir):
    handler, _ = load_handler(model_dir, "generator", {"decode_attention": "padded", **EAGER}, continuous_batching=True)
    described = handler.describe()["decode_attention"]
    reason = "handler.decode_attention is padded"
    assert described == {"setting": "padded", "per_row": False, "reason": reason, "seconds": 0.0}
    assert not mixed_pass.uses_per_row(handler.loaded.model)


def test_auto_is_the_default_and_keeps_per_row_only_with_the_timing_it_measured(model_dir):
    handler, _ = load_handler(model_dir, "generator", EAGER, continuous_batching=True)
    described = handler.describe()["decode_attention"]
    assert described["setting"] == "auto"
    assert mixed_pass.uses_per_row(handler.loaded.model) is described["per_row"]
    assert " ms" in described["reason"]  # the steps' timings, whichever way they went
    assert described["reason"].startswith(
        "greedy fp32 tokens equal to the padded path's; steps " if described["per_row"] else "per-row steps are not"
    )


def test_a_per_row_attention_that_changes_tokens_is_put_back_to_padded_with_the_reason(model_dir, monkeypatch, caplog):
    original = row_attention.attention

    def wrong(*args, **kwargs):
        out, weights = original(*args, **kwargs)
        return out * 1.5, weights

    monkeypatch.setattr(row_attention, "attention", wrong)
    overrides = {"decode_attention": "per_row", "decode_step": "eager"}  # the attention is the eager step's
    handler, _ = load_handler(model_dir, "generator", overrides, continuous_batching=True)
    described = handler.describe()["decode_attention"]
    assert described["per_row"] is False
    assert described["reason"].startswith("greedy fp32 tokens differ from the padded path's on ")
    assert not mixed_pass.uses_per_row(handler.loaded.model)
    assert "decoding attention stays padded" in caplog.text


def test_a_model_whose_attention_is_not_sdpa_stays_padded(per_row_handler):
    class Config:
        _attn_implementation = "eager"
        vocab_size = 50257

    class EagerModel:
        config = Config()

    outcome = decode_attention.select(EagerModel(), "per_row", 0, 4, 64)
    assert outcome.per_row is False and "(eager) is not sdpa" in outcome.reason


def test_a_value_other_than_auto_per_row_padded_is_refused_naming_the_key(model_dir):
    with pytest.raises(
        ConfigError, match=r"handler.decode_attention: 'packed' is not one of \['auto', 'per_row', 'padded'\]"
    ):
        load_handler(model_dir, "generator", {"decode_attention": "packed"})
