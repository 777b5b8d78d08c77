"""Shared fixtures: archives built once, real TorchServe servers on free ports, always stopped afterwards.

`ts_server` is the session's server: the project's own config.properties, every model it loads, its own TMPDIR.
`start_ts_server(...)` starts more (another profile, other models); every server started is stopped at session end,
also when tests fail.
"""

import contextlib
import os
import sys
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts import package  # noqa: E402
from scripts.server import start_isolated  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def model_store():
    """Every model's archive, built (incrementally) by the project's packaging step into model_store/."""
    store = REPO / "model_store"
    only = os.environ.get("TS_TEST_MODELS")
    for name in only.split(",") if only else package.all_model_names():
        package.build(name, store, log=lambda *_: None)
    return store


@pytest.fixture(scope="session")
def java_home():
    from scripts.java_home import find_java_home

    return os.environ.get("JAVA_HOME") or str(find_java_home(verbose=False))


@pytest.fixture(scope="session")
def start_ts_server(tmp_path_factory, model_store, java_home):
    """Factory: start_ts_server(config=..., overrides={...}, models=[...]) -> a READY Server on free ports."""
    started = []

    def start(config=REPO / "config.properties", overrides=None, models=None, name="ts", wait=900):
        # start_isolated stops a server that fails to become READY; the ones that start are stopped below.
        server = start_isolated(config, tmp_path_factory.mktemp(name), model_store, java_home, models, overrides, wait)
        started.append(server)
        return server

    yield start
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()


@pytest.fixture(scope="session")
def ts_server(start_ts_server):
    """The session's TorchServe: the project's own config.properties with every model it loads.

    TS_TEST_MODELS=classifier (comma-separated) restricts it, for a quick local run of one model's tests."""
    only = os.environ.get("TS_TEST_MODELS")
    return start_ts_server(name="main", models=only.split(",") if only else None)


@pytest.fixture(scope="session")
def predict(ts_server):
    """POST helper against the session server: predict(model, json=... | data=..., headers=...)."""
    session = requests.Session()

    def call(model, **kwargs):
        kwargs.setdefault("timeout", 60)
        return session.post(f"{ts_server.inference_url}/predictions/{model}", **kwargs)

    return call


@pytest.fixture(scope="session")
def unpacked_model(model_store, tmp_path_factory):
    """unpacked_model("classifier") -> a folder holding that archive's files, as a worker's model_dir would."""
    import zipfile

    cache = {}

    def unpack(name, archive=None):
        if name not in cache:
            target = tmp_path_factory.mktemp(f"mar-{name}")
            with zipfile.ZipFile(model_store / (archive or f"{name}.mar")) as mar:
                mar.extractall(target)
            cache[name] = target
        return cache[name]

    return unpack
