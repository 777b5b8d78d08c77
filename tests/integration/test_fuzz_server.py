"""The fuzzer's short seeded form, as `make test` runs it: 300 generated requests per served model against the
session server, sent from 24 clients at once so that bad and good requests share batches.

Fails on any answer that is not strict JSON (TorchServe's own 413 excepted), a 5xx for a client body, a valid request
not answered 200 or answered differently from its in-process reference, an invalid request answered 200, a 4xx
without a message, or a worker restart. `make reliability` runs the full form (5,000 per model); the failure printout
has a command that reproduces each failing request."""

import json

import pytest

from scripts.reliability import fuzz

REQUESTS = 300
SEED = 11


@pytest.mark.parametrize("model", fuzz.FUZZ_MODELS)
def test_fuzz_campaign(ts_server, model_store, model):
    if model not in ts_server.props.get("load_models", ""):
        pytest.skip(f"{model} is not served by this session's server (TS_TEST_MODELS)")
    row = fuzz.campaign(ts_server, model, model_store, requests=REQUESTS, seed=SEED, clients=24)
    details = row.details
    assert row.passed, f"{row.figure}\n{json.dumps(details['examples'], indent=1)[:6000]}"
    assert details["requests"] == REQUESTS and sum(int(n) for n in details["statuses"].values()) == REQUESTS
    # The campaign really mixed valid and invalid requests, and valid ones were answered.
    assert details["expected"]["ok"] > REQUESTS // 5 and details["expected"]["error"] > REQUESTS // 5
    assert details["statuses"].get("200", 0) >= details["expected"]["ok"]
    assert details["worker_restarts"] == 0
