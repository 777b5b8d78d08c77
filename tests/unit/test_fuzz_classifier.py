"""Property-based fuzzing of the classifier's request parsing (the network handler with the classifier folder's
preprocess hook): no input makes it raise anything but RequestError."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.core.errors import RequestError
from scripts.ops.handler_loader import load_handler

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=40,
)
rows = st.lists(st.floats(allow_nan=True, allow_infinity=True) | st.integers(), min_size=120, max_size=136)
near_valid = st.fixed_dictionaries({"inputs": rows | st.lists(rows, max_size=3) | json_values})


class Request:
    """A POST /predictions/classifier request's view (TorchServe's url_path header: the model's own route)."""

    over_grpc = False
    url_path = ""

    def __init__(self, content_type):
        self.content_type = content_type
        self.headers = {"url_path": "", "Content-Type": content_type}

    def header(self, name):
        return self.headers.get(name)


@pytest.fixture(scope="module")
def handler(prepared_model_dir):
    handler, _ = load_handler(prepared_model_dir("classifier"), "classifier")
    return handler


def parse_or_reject(handler, body, content_type="application/json"):
    try:
        payload = handler.parse_request(body, Request(content_type))
    except RequestError as error:
        assert 400 <= error.code < 500 and error.message
        return None
    [(name, rows)] = payload.wires.items()
    assert payload.dialect == "hooks" and name == "inputs" and rows.shape[1] == 128
    assert np.isfinite(np.frombuffer(rows.raw, dtype=np.float32)).all()
    return payload


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=json_values | near_valid)
def test_parsed_json_values(handler, body):
    parse_or_reject(handler, body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | near_valid.map(lambda v: json.dumps(v).encode())
)
def test_raw_bodies(handler, raw):
    parse_or_reject(handler, raw, content_type="application/octet-stream")
    parse_or_reject(handler, raw.decode("utf-8", "replace"), content_type="text/plain")
