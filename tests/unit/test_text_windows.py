"""Long inputs by windows (handlers/text/windows.py), on the tiny minilm with no server: a text over the token limit
becomes overlapping windows, each an ordinary row of the engine, pooled into one vector; requests that do not ask
are answered exactly as before."""

import json

import pytest
import torch

from handlers.core.config import ConfigError
from handlers.core.errors import RequestError
from handlers.core.http import RequestView
from handlers.text.engine import TextEngine
from handlers.text.kinds import KINDS
from handlers.text.requests.common import TextLimits, text_or_input
from handlers.text.windows import WindowSettings, pool_windows, snap_to_words, window_spans, windows_needed
from scripts.ops.handler_loader import load_handler, set_requests, statuses

CONFIG = {"precision": "fp32", "backend": "eager", "cache_size": 64, "shared_cache": {"url": ""}}
SENTENCE = "The quick brown fox jumps over the lazy dog near the riverbank. "
LONG = SENTENCE * 40  # ~520 tokens: over the 256-token limit
SHORT = "A man is eating food."


@pytest.fixture(scope="module")
def minilm(tiny_minilm_dir):
    return load_handler(tiny_minilm_dir, "minilm", CONFIG)


def run(handler, context, bodies):
    set_requests(context, [{"Content-Type": "application/json"}] * len(bodies))
    answers = handler.handle([{"body": body} for body in bodies], context)
    return [json.loads(a) for a in answers], statuses(context, len(bodies))


def test_spans_overlap_and_cover_every_token():
    spans = window_spans(520, 254, 191)
    assert spans == [(0, 254), (191, 445), (382, 520)]
    assert windows_needed(520, 254, 191) == len(spans) and windows_needed(254, 254, 191) == 1
    covered = set().union(*(range(start, end) for start, end in spans))
    assert covered == set(range(520))
    # A span is shrunk to whole words: token 3 continues word 1, so the span starts at word 2 and ends before word 4
    # whose second piece is token 8.
    words = [0, 1, 1, 1, 2, 3, 4, 4, 4, 5]
    assert snap_to_words((2, 7), words) == (4, 6)
    assert snap_to_words((1, 3), [0, 0, 0, 0]) == (1, 3)  # one word longer than the span: kept as it is


def test_pooling_is_the_token_weighted_mean_renormalised():
    class Row:
        def __init__(self, value, tokens):
            self.value, self.tokens, self.truncated = torch.tensor(value), tokens, False

    one, two, alone = Row([1.0, 0.0], 3), Row([0.0, 1.0], 1), Row([0.6, 0.8], 5)
    first, second = pool_windows([one, two, alone], [2, 1], normalize=True)
    want = torch.tensor([0.75, 0.25])
    assert torch.allclose(first.value, want / want.norm()) and first.tokens == 4 and not first.truncated
    assert second is alone  # one window: the row as computed
    [raw] = pool_windows([one, two], [2], normalize=False)
    assert torch.allclose(raw.value, want)


def parsed(handler, body):
    """The request as the handler's native route parses it (its rows: the windows)."""
    return handler.route_table[""].parse(handler.api, body, RequestView(None, 0))


def test_a_long_text_by_windows_is_its_windows_rows_pooled(minilm):
    handler, context = minilm
    engine = handler.engine
    [answer], [status] = run(handler, context, [{"text": LONG, "long_input": "windows"}])
    assert status == 200 and answer["truncated"] is False and answer["windows"] == 3
    # The same windows through the engine as plain rows, pooled as specified, give the same vector.
    request = parsed(handler, {"text": LONG, "long_input": "windows"})
    assert request.windows == [3] and len(request.texts) == 3
    assert all(piece in LONG for piece in request.texts) and request.texts[0].startswith("The quick")
    rows = engine.encode(request.texts)
    assert not any(row.truncated for row in rows)
    weights = torch.tensor([row.tokens for row in rows], dtype=torch.float32)
    mean = (weights[:, None] * torch.stack([row.value for row in rows])).sum(0) / weights.sum()
    got = torch.tensor(answer["embedding"])
    assert torch.allclose(got, mean / mean.norm(), atol=1e-6)
    assert abs(float(got.norm()) - 1.0) < 1e-5
    [cut], _ = run(handler, context, [{"text": LONG}])
    assert cut["truncated"] is True and "windows" not in cut
    assert not torch.allclose(torch.tensor(cut["embedding"]), got, atol=1e-3)


def test_a_mixed_batch_answers_each_request_with_its_own_rows(minilm):
    handler, context = minilm
    alone = {}
    bodies = [
        {"text": LONG, "long_input": "windows"},
        {"text": LONG},
        {"input": [SHORT, LONG], "long_input": "windows"},
        {"text": SHORT, "long_input": "windows"},
        {"input": [LONG, SHORT]},
    ]
    for number, body in enumerate(bodies):
        handler.engine.cache = type(handler.engine.cache)(0)  # no cache: each alone is computed, not recalled
        handler.cache = handler.engine.cache
        alone[number] = run(handler, context, [body])[0][0]
    batch, codes = run(handler, context, bodies)
    assert codes == [200] * len(bodies)
    assert batch == [alone[number] for number in range(len(bodies))]
    windowed, truncated, listed, short, plain = batch
    assert windowed["embedding"] != truncated["embedding"]
    assert [item["truncated"] for item in listed["data"]] == [False, False]
    assert [item["truncated"] for item in plain["data"]] == [True, False]
    assert listed["data"][1]["embedding"] == windowed["embedding"]  # the same text windowed in either shape
    assert listed["data"][0]["embedding"] == plain["data"][1]["embedding"]  # a short text is its one row
    assert short["windows"] == 1 and short["embedding"] == plain["data"][1]["embedding"]
    assert "windows" not in listed and set(listed["data"][0]) == {"object", "index", "embedding", "truncated"}


def test_the_windowed_and_the_truncated_answer_of_one_text_never_share_a_cache_entry(tiny_minilm_dir):
    handler, context = load_handler(tiny_minilm_dir, "minilm", CONFIG)
    [cut], _ = run(handler, context, [{"text": LONG}])
    [windowed], _ = run(handler, context, [{"text": LONG, "long_input": "windows"}])
    [again], _ = run(handler, context, [{"text": LONG}])
    assert windowed["truncated"] is False and windowed["embedding"] != cut["embedding"]
    assert again == cut
    keys = {handler.engine.cache_key(text) for text in parsed(handler, {"text": LONG, "long_input": "windows"}).texts}
    assert handler.engine.cache_key(LONG) not in keys


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": LONG, "long_input": "chunks"}, "'long_input' 'chunks' is not supported; use one of 'truncate', "),
        ({"input": [LONG], "long_input": True}, "'long_input' True is not supported"),
        ({"text": LONG, "long_input": 3}, "'long_input' 3 is not supported"),
    ],
)
def test_a_bad_long_input_is_a_400_naming_the_field_and_the_rest_of_the_batch_is_served(minilm, body, message):
    handler, context = minilm
    (refused, served), codes = run(handler, context, [body, {"text": SHORT}])
    assert codes == [400, 200] and message in refused["message"]
    assert served["truncated"] is False and "windows" not in served


def test_a_text_needing_more_windows_than_allowed_is_a_413_naming_the_limit(tiny_minilm_dir):
    handler, context = load_handler(tiny_minilm_dir, "minilm", {**CONFIG, "max_windows": 2})
    (answer, fits), codes = run(handler, context, [{"text": LONG, "long_input": "windows"}, {"text": SHORT}])
    assert codes == [413, 200]
    assert "3 windows of 254 tokens; handler.max_windows is 2" in answer["message"]
    assert fits["truncated"] is False


def test_the_model_default_windows_applies_to_requests_that_do_not_say(tiny_minilm_dir, minilm):
    handler, context = load_handler(tiny_minilm_dir, "minilm", {**CONFIG, "long_inputs": "windows"})
    [by_default, asked_cut, short], _ = run(
        handler, context, [{"text": LONG}, {"text": LONG, "long_input": "truncate"}, {"text": SHORT}]
    )
    default_handler, default_context = minilm
    [windowed, cut, short_default], _ = run(
        default_handler,
        default_context,
        [{"text": LONG, "long_input": "windows"}, {"text": LONG}, {"text": SHORT}],
    )
    assert by_default == windowed and asked_cut == cut
    assert short == {**short_default, "windows": 1}
    assert handler.describe()["long_inputs"] == {"default": "windows", "overlap": 0.25, "max_windows": 16}
    assert handler.describe()["max_forward_tokens"] == 8192


def test_other_kinds_refuse_windows_in_config_and_in_requests(tiny_minilm_dir, monkeypatch):
    limits = TextLimits(4, 100, 100)
    with pytest.raises(RequestError, match="'long_input' is not accepted here: long inputs by windows are for"):
        text_or_input({"text": SHORT, "long_input": "windows"}, "application/json", limits, {"truncate"})
    engine = TextEngine.load(tiny_minilm_dir, {**CONFIG, "long_inputs": "windows"}, kind="embedding")
    monkeypatch.setattr(type(engine.kind), "pools_windows", False)  # what every kind but the embedding kind says
    with pytest.raises(ConfigError, match="handler.long_inputs: 'windows' is for embedding models"):
        TextEngine.load(tiny_minilm_dir, {**CONFIG, "long_inputs": "windows"}, kind="embedding")
    assert [name for name, kind in KINDS.items() if kind.pools_windows] == []  # (embedding patched above)


def test_window_settings_read_the_request_field():
    settings = WindowSettings("truncate", 0.25, 16)
    assert settings.mode({}) == "truncate" and settings.mode({"long_input": None}) == "truncate"
    assert settings.mode({"long_input": "windows"}) == "windows"
