"""The base handler's promises, proved with a toy handler (no archive, no server):

- every answer is strict JSON: a NaN/Infinity result becomes that request's 500, never a 200 with a NaN token;
- exactly one result per request: a missing one is a 500 for that request alone, never `null`;
- a request can only fail itself: when the shared batch step raises, the other requests are retried without it;
- out of memory is recognised by the exception's type (507), not by its message.
"""

import json
import math
from dataclasses import dataclass

import pytest
import torch

from handlers.core.base import Loaded, ServingHandler
from handlers.core.errors import RequestError
from handlers.core.http import to_json
from scripts.ops.handler_loader import make_context, set_requests, statuses

JSON = {"Content-Type": "application/json"}


def strict_loads(text):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@dataclass
class ToyBatch:
    values: list

    @property
    def rows(self):
        return len(self.values)


class ToyHandler(ServingHandler):
    """Body {"x": number}; answer {"y": 2x}. ``x`` = "boom" makes any batch holding it raise in inference."""

    def __init__(self):
        super().__init__()
        self.batches = []  # the x values of every batch inference saw
        self.drop_last_result = False
        self.failure = RuntimeError("simulated kernel failure")

    def load_model(self, model_dir):
        return Loaded(torch.nn.Identity())

    def reference_batch(self, loaded):
        return torch.ones(1)

    def forward(self, model, batch):
        return model(batch)

    def parse_request(self, body, request):
        if not isinstance(body, dict) or "x" not in body:
            raise RequestError("missing field 'x'")
        if body["x"] == "parser bug":
            raise KeyError("a bug in validation")
        return body["x"]

    def preprocess(self, payloads):
        return ToyBatch(list(payloads))

    def inference(self, batch, scope):
        self.batches.append(batch.values)
        if "boom" in batch.values:
            raise self.failure
        return batch.values

    def postprocess(self, outputs, payloads):
        results = [{"y": 2 * x} for x in outputs]
        return results[:-1] if self.drop_last_result else results


@pytest.fixture()
def toy(tmp_path):
    handler = ToyHandler()
    context = make_context(tmp_path, "toy")
    context.model_yaml_config = {"handler": {"precision": "fp32"}}
    handler.initialize(context)
    return handler, context


def run(handler, context, bodies):
    set_requests(context, [JSON] * len(bodies))
    answers = handler.handle([{"body": body} for body in bodies], context)
    assert all(isinstance(answer, str) for answer in answers)
    return [strict_loads(answer) for answer in answers]


def test_to_json_refuses_non_finite_numbers_and_unencodable_text():
    assert to_json({"a": [1.5, -0.0], "b": "é"}) == '{"a":[1.5,-0.0],"b":"é"}'
    for bad in (math.nan, math.inf, -math.inf, "\ud800"):
        with pytest.raises(ValueError):
            to_json({"value": bad})


def test_a_nan_result_is_that_requests_500_and_the_others_are_answered(toy):
    handler, context = toy
    answers = run(handler, context, [{"x": 1}, {"x": math.nan}, {"x": 3}, {"x": math.inf}])
    assert statuses(context, 4) == [200, 500, 200, 500]
    assert answers[0] == {"y": 2} and answers[2] == {"y": 6}
    assert answers[1]["code"] == 500 and "non-finite" in answers[1]["message"]


def test_a_missing_result_is_a_500_for_that_request_alone_never_null(toy):
    handler, context = toy
    handler.drop_last_result = True
    answers = run(handler, context, [{"x": 1}, {"x": 2}, {"x": 3}])
    assert statuses(context, 3) == [200, 200, 500]
    assert answers[:2] == [{"y": 2}, {"y": 4}]
    assert answers[2]["code"] == 500 and "no result" in answers[2]["message"]


def test_a_failing_batch_step_is_retried_without_the_request_that_broke_it(toy):
    handler, context = toy
    answers = run(handler, context, [{"x": 1}, {"x": "boom"}, {"x": 3}])
    assert statuses(context, 3) == [200, 500, 200]
    assert answers[0] == {"y": 2} and answers[2] == {"y": 6}
    assert answers[1] == {"code": 500, "type": "InternalServerError", "message": "inference failed: RuntimeError"}
    # One failed batch of three, then each request alone.
    assert handler.batches == [[1, "boom", 3], [1], ["boom"], [3]]


def test_out_of_memory_is_recognised_by_type(toy):
    handler, context = toy
    handler.failure = torch.OutOfMemoryError("CUDA error: no message that mentions memory")
    answers = run(handler, context, [{"x": "boom"}, {"x": 5}])
    assert statuses(context, 2) == [507, 200]
    assert answers[0]["type"] == "InsufficientStorage" and answers[1] == {"y": 10}
    handler.failure = RuntimeError("out of memory")  # a message alone is not an out-of-memory error
    run(handler, context, [{"x": "boom"}])
    assert statuses(context, 1) == [500]


def test_a_bug_in_request_validation_fails_that_request_only(toy):
    handler, context = toy
    answers = run(handler, context, [{"x": 1}, {"x": "parser bug"}, {}])
    assert statuses(context, 3) == [200, 500, 400]
    assert answers[0] == {"y": 2} and answers[1]["code"] == 500 and answers[2]["message"] == "missing field 'x'"


def test_config_refusals_say_what_the_key_is_for_and_the_docs_table_lists_every_key():
    from handlers.core.config import COMMON_OPTIONS, ConfigError, options_table, validate

    with pytest.raises(ConfigError, match=r"handler.threads: expected int, got 'two' \(threads: torch intra-op"):
        validate({"threads": "two"}, COMMON_OPTIONS)
    table = options_table(COMMON_OPTIONS)
    for key, option in COMMON_OPTIONS.items():
        assert f"| `{key}` |" in table and option.help in table
    assert "auto | fp32 | bf16 | fp16 | int8" in table and "float (>= 0, <= 1)" in table
