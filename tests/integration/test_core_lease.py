"""The core lease served (handlers/core/cores.py): minilm built with handler.borrow_idle_cores on, under a server the
project starts (it exports the lease), computes a lone batch on every core, and its vectors are exactly those of the
same archive under a server without the lease (TS_CORE_LEASE_DIR unset, as a bare ``torchserve --start`` runs);
describe shows the setting on both, and the shipped archive (borrowing off) says so."""

import re
import uuid

import numpy as np
import pytest
import requests

from handlers.core.cores import LEASE_DIR_ENV, available_cores
from handlers.text.shared_cache import URL_ENV
from scripts.bench_cores import borrowing_store

MODEL = "minilm"
RUN = uuid.uuid4().hex[:8]  # texts no cache of the session has seen, so both servers compute them
TEXTS = [
    f"a short query {RUN}",
    " ".join([f"A long document {RUN} that the worker pads to the last length bucket, computed on every core."] * 20),
]


@pytest.fixture(scope="module")
def borrowing(model_store, tmp_path_factory):
    """A model store with a copy of minilm's archive that borrows idle cores."""
    return borrowing_store(MODEL, model_store, tmp_path_factory.mktemp("borrowing-store"))


@pytest.fixture(scope="module")
def with_lease(start_ts_server, borrowing):
    """minilm alone, without the shared tier (it would hand one server the other's rows)."""
    return start_ts_server(name="lease", models=[MODEL], store=borrowing, env={URL_ENV: ""})


@pytest.fixture(scope="module")
def without_lease(start_ts_server, borrowing):
    return start_ts_server(name="no-lease", models=[MODEL], store=borrowing, env={LEASE_DIR_ENV: "", URL_ENV: ""})


def embed(server, text):
    response = requests.post(f"{server.inference_url}/predictions/{MODEL}", json={"input": [text]}, timeout=120)
    assert response.status_code == 200, response.text
    return np.asarray(response.json()["data"][0]["embedding"], dtype=np.float32)


def forward_cores(server):
    metrics = requests.get(f"{server.metrics_url}/metrics", timeout=30).text
    found = re.search(rf'^ForwardCores{{[^}}]*ModelName="{MODEL}"[^}}]*}} ([0-9.e+]+)', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_served_model_with_the_lease_answers_exactly_as_without_it(with_lease, without_lease):
    for text in TEXTS:  # one at a time: the other worker is idle, so each batch may borrow its core
        assert np.array_equal(embed(with_lease, text), embed(without_lease, text)), text
    # Each lone batch ran on every core (its own and the idle one): the lease was in use, not bypassed.
    assert forward_cores(with_lease) == len(TEXTS) * available_cores()
    assert forward_cores(without_lease) == len(TEXTS) * max(1, available_cores() // 2)  # its share of 2 workers

    leased = with_lease.management(timeout=60).handler_choices(MODEL)["borrow_idle_cores"]
    assert leased == {"enabled": True, "lease_cores": available_cores(), "min_tokens": 0, "min_forward_ms": 0}
    bare = without_lease.management(timeout=60).handler_choices(MODEL)["borrow_idle_cores"]
    assert bare["enabled"] is True and bare.get("lease_cores") is None  # configured, but no lease to borrow from


def test_the_shipped_archive_does_not_borrow(ts_server):
    shipped = ts_server.management(timeout=60).handler_choices(MODEL)["borrow_idle_cores"]
    assert shipped["enabled"] is False and shipped.get("lease_cores") is None
