"""The classifier called directly (no server): the network handler with the classifier folder's hooks
(models/classifier/handler.py): its native request and answer, validation, batching bookkeeping."""

import json
import math
import re

import numpy as np
import pytest
import torch

from handlers.core.config import ConfigError
from handlers.network_model import NetworkModelHandler
from scripts.ops.handler_loader import load_handler, set_requests, statuses
from scripts.reliability.references import load_classifier_dir

# A POST /predictions/classifier request as TorchServe hands it over (the url_path header tells it from /v2/.../infer).
PREDICTIONS = {"Content-Type": "application/json", "url_path": ""}


def load(model_dir, **handler_overrides):
    return load_handler(model_dir, "classifier", handler_overrides)


@pytest.fixture(scope="module")
def classifier(prepared_model_dir):
    return load(prepared_model_dir("classifier"))


@pytest.fixture(scope="module")
def reference_model(prepared_model_dir):
    return load_classifier_dir(prepared_model_dir("classifier"))


def reference(model, rows):
    with torch.inference_mode():
        return torch.softmax(model(torch.tensor(rows, dtype=torch.float32)), dim=-1)


def test_the_classifier_is_served_by_the_network_handler_with_its_hooks(classifier):
    handler, _ = classifier
    assert isinstance(handler, NetworkModelHandler)
    description = handler.describe()
    assert description["hooks"] == ["preprocess", "postprocess"]
    assert description["max_rows_per_request"] == 64
    [inputs] = description["metadata"]["inputs"]
    assert inputs["name"] == "inputs" and inputs["datatype"] == "FP32" and inputs["shape"] == [-1, 128]
    assert [output["name"] for output in description["metadata"]["outputs"]] == ["logits"]


def run(handler, context, bodies):
    set_requests(context, [PREDICTIONS] * len(bodies))
    answers = handler.handle([{"body": body} for body in bodies], context)
    # compact JSON text, not a dict TorchServe would indent
    assert all(isinstance(answer, str | bytes) for answer in answers)
    return [json.loads(answer) for answer in answers]


def test_single_row_answers_label_and_probabilities(classifier, reference_model):
    handler, context = classifier
    row = torch.randn(128, generator=torch.Generator().manual_seed(3)).tolist()
    [answer] = run(handler, context, [{"inputs": row}])
    expected = reference(reference_model, [row])[0]
    assert answer["label"] == int(expected.argmax())
    assert len(answer["probabilities"]) == 10
    assert math.isclose(sum(answer["probabilities"]), 1.0, rel_tol=1e-5)
    assert torch.allclose(torch.tensor(answer["probabilities"]), expected, atol=1e-6)


def test_probabilities_are_written_as_float32_shortest_text(classifier):
    """Each probability is the shortest text that reads back as its float32 (at most 9 significant digits), not the
    float64 repr of that float32 (17 digits: 0.10000000149011612)."""
    handler, context = classifier
    row = torch.randn(128, generator=torch.Generator().manual_seed(6)).tolist()
    set_requests(context, [PREDICTIONS])
    [raw] = handler.handle([{"body": {"inputs": row}}], context)
    raw = raw.decode() if isinstance(raw, bytes) else raw
    tokens = re.search(r'"probabilities":\[([^\]]*)\]', raw).group(1).split(",")
    assert len(tokens) == 10
    for token in tokens:
        digits = re.sub(r"e.*$", "", token).lstrip("-").replace(".", "").lstrip("0")
        assert len(digits) <= 9, token
        assert np.float32(token) == np.float32(float(token))


def test_requests_with_different_row_counts_get_their_own_rows(classifier, reference_model):
    handler, context = classifier
    generator = torch.Generator().manual_seed(4)
    bodies = [{"inputs": torch.randn(n, 128, generator=generator).tolist()} for n in (3, 1, 5)]
    bodies.insert(1, {"inputs": torch.randn(128, generator=generator).tolist()})
    answers = run(handler, context, bodies)
    assert statuses(context, 4) == [200] * 4
    assert isinstance(answers[1], dict)
    for body, answer in zip(bodies, answers, strict=True):
        rows = body["inputs"] if isinstance(body["inputs"][0], list) else [body["inputs"]]
        got = answer if isinstance(answer, list) else [answer]
        assert len(got) == len(rows)
        expected = reference(reference_model, rows)
        assert [g["label"] for g in got] == expected.argmax(1).tolist()
        assert torch.allclose(torch.tensor([g["probabilities"] for g in got]), expected, atol=1e-6)


BAD_BODIES = {
    "not json": (b"{not json", "not valid JSON"),
    "not an object": ([1, 2, 3], "JSON object"),
    # TorchServe hands a JSON body over parsed: null as None, a JSON string as a str.
    "json null": (None, "got null"),
    "json string": ("inputs", "got str"),
    "nested too deeply": (b"[" * 100000, "nested too deeply"),
    "missing inputs": ({"rows": [[0.0] * 128]}, "unknown field"),
    "empty object": ({}, "missing field 'inputs'"),
    "wrong length": ({"inputs": [0.0] * 127}, "127 values; expected 128"),
    "ragged rows": ({"inputs": [[0.0] * 128, [0.0] * 3]}, "'inputs'[1] has 3 values"),
    "string value": ({"inputs": [0.0] * 127 + ["x"]}, "is str, not a number"),
    "bool value": ({"inputs": [True] + [0.0] * 127}, "is bool, not a number"),
    "nan": ({"inputs": [float("nan")] + [0.0] * 127}, "finite"),
    "inf": ({"inputs": [float("inf")] + [0.0] * 127}, "finite"),
    "huge int": ({"inputs": [10**400] + [0.0] * 127}, "finite"),
    "empty list": ({"inputs": []}, "non-empty"),
    "inputs not a list": ({"inputs": "0,1,2"}, "non-empty list"),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_invalid_request_gets_its_own_400_and_the_batch_survives(classifier, case):
    handler, context = classifier
    body, fragment = BAD_BODIES[case]
    good = {"inputs": [0.5] * 128}
    answers = run(handler, context, [good, body, good])
    assert statuses(context, 3) == [200, 400, 200]
    assert answers[1]["code"] == 400 and answers[1]["type"] == "InvalidRequest"
    assert fragment in answers[1]["message"]
    assert answers[0] == answers[2] and "label" in answers[0]


def test_too_many_rows_is_a_413_naming_the_limit(classifier):
    handler, context = classifier
    good = {"inputs": [0.5] * 128}
    answers = run(handler, context, [good, {"inputs": [[0.0] * 128] * 65}, good])
    assert statuses(context, 3) == [200, 413, 200]
    assert answers[1]["type"] == "RequestTooLarge" and "65 rows; at most 64" in answers[1]["message"]


def test_the_row_limit_is_the_handlers_max_rows_per_request(prepared_model_dir):
    handler, context = load(prepared_model_dir("classifier"), max_rows_per_request=3)
    answers = run(handler, context, [{"inputs": [[0.5] * 128] * 3}, {"inputs": [[0.5] * 128] * 4}])
    assert statuses(context, 2) == [200, 413]
    assert len(answers[0]) == 3 and "4 rows; at most 3" in answers[1]["message"]


def test_unknown_handler_option_is_refused_with_its_name(prepared_model_dir):
    with pytest.raises(ConfigError, match="unknown key.*'precison'"):
        load(prepared_model_dir("classifier"), precison="bf16")


def test_inputs_that_overflow_inside_the_model_get_a_422_and_the_batch_mates_are_answered(classifier, reference_model):
    """Regression (issue 11, repro 2): 1e38 x 128 used to answer 200 with NaN probabilities (not JSON)."""
    handler, context = classifier
    good = torch.randn(128, generator=torch.Generator().manual_seed(5)).tolist()
    overflow = {"inputs": [1e38] * 128}
    mixed = {"inputs": [good, [-2.9e38, 2.9e38] * 64]}
    set_requests(context, [PREDICTIONS] * 4)
    raw = handler.handle([{"body": body} for body in ({"inputs": good}, overflow, mixed, {"inputs": good})], context)

    def strict_loads(answer):
        return json.loads(answer, parse_constant=lambda token: pytest.fail(f"{token} in {answer[:80]}"))

    answers = [strict_loads(answer) for answer in raw]
    assert statuses(context, 4) == [200, 422, 422, 200]
    assert answers[1]["type"] == "InputOverflow" and "overflow inside the model" in answers[1]["message"]
    assert "rows [1]" in answers[2]["message"]
    assert answers[0] == answers[3] and answers[0]["label"] == int(reference(reference_model, [good])[0].argmax())


def test_every_finite_float32_value_is_accepted_and_larger_ones_are_refused(classifier):
    """Regression (issue 11, repro 2): 3.3e38 is a float32 (max 3.4028e38) and was refused as not finite."""
    handler, context = classifier
    largest = float(torch.finfo(torch.float32).max)
    answers = run(
        handler,
        context,
        [
            {"inputs": [3.3e38] + [0.0] * 127},
            {"inputs": [-largest] + [0.0] * 127},
            {"inputs": [1e-45, 5e-324] + [0.0] * 126},
            {"inputs": [3.5e38] + [0.0] * 127},
        ],
    )
    codes = statuses(context, 4)
    assert codes[0] in (200, 422) and codes[1] in (200, 422)  # accepted: answered, or an overflow named as such
    assert codes[2] == 200 and codes[3] == 400
    assert "at most 3.4028235e+38 in magnitude" in answers[3]["message"]


def test_every_batch_records_its_size_and_stage_times(classifier):
    from scripts.ops.handler_loader import record_metrics

    handler, context = classifier
    metrics = record_metrics(context)
    try:
        run(handler, context, [{"inputs": [[0.5] * 128] * 3}, {"inputs": [0.5] * 128}, {"inputs": []}])
    finally:
        context.metrics = None
    assert metrics.values("Batches") == [1] and metrics.values("BatchRequests") == [3]
    assert metrics.values("BatchRows") == [4]  # the accepted requests' rows; the refused one has none
    assert metrics.values("RequestErrors") == [1] and len(metrics.values("InferenceSeconds")) == 1
