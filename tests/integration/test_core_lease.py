"""The core lease served (handlers/core/cores.py): a server started by the project exports it, a lone minilm batch
borrows the idle core, and the vectors are exactly those of a server without the lease (TS_CORE_LEASE_DIR unset,
as a bare ``torchserve --start`` runs); describe shows the setting on both."""

import re
import uuid

import numpy as np
import pytest
import requests

from handlers.core.cores import LEASE_DIR_ENV, available_cores
from handlers.text.shared_cache import URL_ENV

MODEL = "minilm"
RUN = uuid.uuid4().hex[:8]  # texts no cache of the session has seen, so both servers compute them
TEXTS = [
    f"a short query {RUN}",
    " ".join([f"A long document {RUN} that the worker pads to the last length bucket, computed on every core."] * 20),
]


@pytest.fixture(scope="module")
def without_lease(start_ts_server):
    """minilm alone with no lease and no shared tier (which would hand it the lease server's rows)."""
    return start_ts_server(name="no-lease", models=[MODEL], env={LEASE_DIR_ENV: "", URL_ENV: ""})


def embed(server, text):
    response = requests.post(f"{server.inference_url}/predictions/{MODEL}", json={"input": [text]}, timeout=120)
    assert response.status_code == 200, response.text
    return np.asarray(response.json()["data"][0]["embedding"], dtype=np.float32)


def forward_cores(server):
    metrics = requests.get(f"{server.metrics_url}/metrics", timeout=30).text
    found = re.search(rf'^ForwardCores{{[^}}]*ModelName="{MODEL}"[^}}]*}} ([0-9.e+]+)', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_served_model_with_the_lease_answers_exactly_as_without_it(ts_server, without_lease):
    before = forward_cores(ts_server)
    for text in TEXTS:  # one at a time: the other worker is idle, so each batch may borrow its core
        assert np.array_equal(embed(ts_server, text), embed(without_lease, text)), text
    if available_cores() > 1:
        # Each lone batch ran on every core (its own and the idle one): the lease was in use, not bypassed.
        assert forward_cores(ts_server) - before == len(TEXTS) * available_cores()

    with_lease = ts_server.management(timeout=60).handler_choices(MODEL)["borrow_idle_cores"]
    assert with_lease == {"enabled": True, "lease_cores": available_cores(), "min_tokens": 0}
    bare = without_lease.management(timeout=60).handler_choices(MODEL)["borrow_idle_cores"]
    assert bare["enabled"] is True and bare.get("lease_cores") is None  # configured, but no lease to borrow from
