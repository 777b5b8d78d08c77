"""Shared fixtures: archives built once, real TorchServe servers on free ports, always stopped afterwards.

`ts_server` is the session's server: the project's own config.properties, every model it loads, its own TMPDIR.
`start_ts_server(...)` starts more (another profile, other models); every server started is stopped at session end,
also when tests fail. Every TorchServe of the session uses the session's own shared embedding cache server
(`cache_server`, on a free port, through $TS_SHARED_CACHE_URL) unless it is given another `env=`, never the one a
`make serve` may be running; `start_cache_server()` starts more (one a test may kill).
"""

import concurrent.futures
import contextlib
import os
from pathlib import Path

import pytest
import requests

from handlers.core import cpu

# Before anything imports torch's kernels: a TS_CPU_AS kind (the masked pass of `make test`, `make test-cpu-kinds`)
# caps ATen and oneDNN here, and a kind this machine cannot be run as stops the session with the reason.
try:
    os.environ.update(cpu.library_environment())
    cpu.cpu_flags()
except cpu.CpuKindUnavailable as error:
    raise pytest.UsageError(str(error)) from None

from handlers.text.shared_cache import URL_ENV  # noqa: E402 (after the CPU kind's caps)
from scripts import package  # noqa: E402
from scripts.ops import server as ops_server  # noqa: E402
from scripts.ops.cache_server import CacheServer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def skip_unless_served(server, model):
    """Skip the calling test when this session's server does not load ``model``'s archive (TS_TEST_MODELS)."""
    if f"{model}.mar" not in server.props.get("load_models", ""):
        pytest.skip(f"{model} is not served by this session's server (TS_TEST_MODELS)")


@pytest.fixture(scope="module", params=["openvino", "eager"])
def decode_step(request):
    """What runs the generator's decoding passes (handler.decode_step): the OpenVINO paged step and eager torch.
    Generation tests whose handler takes this run on both."""
    return request.param


@pytest.fixture(scope="session")
def model_store():
    """Every model's archive, built (incrementally) by the project's packaging step into model_store/."""
    store = REPO / "model_store"
    only = os.environ.get("TS_TEST_MODELS")
    with this_machine_as_it_is():
        for name in only.split(",") if only else package.all_model_names():
            package.build(name, store, log=lambda *_: None)
    return store


@contextlib.contextmanager
def this_machine_as_it_is():
    """Without the session's TS_CPU_AS mask (and its library caps) for what runs inside, its subprocesses too.

    The archives are built for this machine even in a masked pass: that pass serves the normal pass's archives, as a
    machine of the masked kind serves archives built on another, instead of rebuilding them as that kind."""
    names = (cpu.CPU_KIND_ENV, *cpu.LIBRARY_VARIABLES) if cpu.requested_kind() else ()
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@pytest.fixture(scope="session")
def java_home():
    return ops_server.java_home()


@pytest.fixture(scope="session")
def start_cache_server(tmp_path_factory):
    """Factory: start_cache_server(password_file=None) -> a running cache server (Valkey/Redis) on a free port."""
    started = []

    def start(name="cache", password_file=None):
        run_dir = tmp_path_factory.mktemp(name)
        server = CacheServer(ops_server.free_ports(1)[0], run_dir, password_file=password_file)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()


@pytest.fixture(scope="session")
def cache_server(start_cache_server):
    """The session's shared embedding cache server, which every TorchServe of the session uses by default."""
    return start_cache_server(name="session-cache")


@pytest.fixture(scope="session")
def start_ts_server(tmp_path_factory, model_store, java_home, cache_server):
    """Factory: start_ts_server(config=..., overrides={...}, models=[...], env={...}, store=...) -> a READY Server on
    free ports (env: extra environment for its workers; default: the session's cache server; store: another model
    store than model_store/)."""
    started = []

    def start(
        config=REPO / "config.properties", overrides=None, models=None, name="ts", wait=900, env=None, store=None
    ):
        # start_isolated stops a server that fails to become READY; the ones that start are stopped below.
        env = {URL_ENV: cache_server.url, **(env or {})}
        server = ops_server.start_isolated(
            config, tmp_path_factory.mktemp(name), store or model_store, java_home, models, overrides, wait, env
        )
        started.append(server)
        return server

    yield start
    stop_all(started)


def stop_all(servers):
    """Stop every server at once: TorchServe's frontend takes seconds to shut down (its event loops' quiet periods, its
    workers' exits) while using almost no CPU, so a session's servers stopped one after another spent about a minute
    of the suite waiting."""
    with concurrent.futures.ThreadPoolExecutor(max(1, len(servers))) as pool:
        for future in [pool.submit(server.stop) for server in servers]:
            with contextlib.suppress(Exception):
                future.result()


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


class ImageModels:
    """The tiny image folders of the integration tests, packaged into one private store and served by one TorchServe."""

    def __init__(self, folders, store, server):
        self.folders, self.store, self.server = folders, store, server


# The image server's models (image_models), each with the scripts/tiny_image_models.py function that builds its folder;
# docs/clients.md's image examples name them, and tests/integration/test_docs_examples.py runs those against it.
IMAGE_MODELS = {
    "t-vit": "make_vit_classifier",
    "t-clip": "make_clip",
    "t-siglip": "make_siglip",
    "t-st-clip": "make_sentence_transformers_clip",
}


def template_for_cli(folder):
    """What `python -m scripts.package --template-for FOLDER` (the Makefile's question) prints, run in this process."""
    import contextlib
    import io

    from scripts import package

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert package.main(["--template-for", str(folder)]) == 0
    return printed.getvalue().strip()


@pytest.fixture(scope="session")
def image_models(start_ts_server, tmp_path_factory):
    """A tiny random ViT classifier (t-vit), CLIP (t-clip), SigLIP (t-siglip) and sentence-transformers CLIP
    (t-st-clip) built offline (scripts/tiny_image_models.py), each packaged with the template `make package` picks for
    its folder (the four packaging steps run at once), one fp32 worker each (the answers are compared with the
    reference libraries in fp32; bf16 would serve within the gate, not equal), on one shared server."""
    import subprocess
    import sys

    from scripts import tiny_image_models

    root = tmp_path_factory.mktemp("image-folders")
    folders = {name: getattr(tiny_image_models, make)(root / name) for name, make in IMAGE_MODELS.items()}
    store = tmp_path_factory.mktemp("image-store")
    # The template `make package` picks for each folder: what `python -m scripts.package --template-for` prints.
    assert {name: template_for_cli(folder) for name, folder in folders.items()} == dict.fromkeys(folders, "image-model")
    running = {}
    for name, folder in folders.items():
        command = [sys.executable, "-m", "scripts.package", "image-model", "--name", name]
        command += ["--var", f"model_dir={folder}", "--store", str(store)]
        # No compiled backends: these answers are compared with transformers' fp32 ones, which eager fp32 equals and an
        # OpenVINO IR (fp16-stored weights) only approaches; tests/unit/test_image_backends.py builds and serves them.
        command += ["--var", "backends=none"]
        command += ["--config", "minWorkers=1", "--config", "maxWorkers=1", "--config", "handler.precision=fp32"]
        log = open(store / f"{name}.package.log", "w+")  # noqa: SIM115 -- read back below, closed there
        running[name] = (subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True), log)
    for name, (process, log) in running.items():
        code = process.wait(timeout=900)
        log.seek(0)
        output = log.read()
        log.close()
        assert code == 0, f"packaging {name} failed:\n{output}"
    server = start_ts_server(name="image-models", models=sorted(folders), store=store)
    return ImageModels(folders, store, server)


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


@pytest.fixture(scope="session")
def archive_as_version():
    """archive_as_version(archive, version) -> the path of `<model>-<version>.mar` beside `archive`: the same files
    with `version` as the manifest's modelVersion. For tests that need a second version of a model, not other files:
    packaging one (scripts/package.py builds each version in its own build folder) runs its prepare step again, which
    for minilm is a minute of staging, backend building and ranking."""
    import json
    import zipfile

    def rename(archive, version):
        archive = Path(archive)
        with zipfile.ZipFile(archive) as source:
            manifest = json.loads(source.read(MAR_MANIFEST))
            manifest["model"]["modelVersion"] = version
            target = archive.with_name(f"{manifest['model']['modelName']}-{version}.mar")
            partial = target.with_suffix(".partial")
            # Stored, not deflated again: the weights do not shrink, and TorchServe extracts either.
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as copy:
                for entry in source.infolist():
                    data = json.dumps(manifest, indent=2) if entry.filename == MAR_MANIFEST else source.read(entry)
                    copy.writestr(entry, data, compress_type=zipfile.ZIP_STORED)
        partial.replace(target)
        return target

    return rename


MAR_MANIFEST = "MAR-INF/MANIFEST.json"

# Model folders made without archives (tests/unit/tiny_models.py): prepared_model_dir, tiny_minilm_dir.
pytest_plugins = ["tests.unit.tiny_models"]

# Fixtures that build or read the real model archives, or start a TorchServe server: a test that uses one (directly or
# through another fixture) is `slow`, and `make test-fast` leaves it out.
SLOW_FIXTURES = frozenset(
    {"model_store", "unpacked_model", "java_home", "start_ts_server", "ts_server", "predict", "image_models"}
)


def pytest_report_header(config):
    kind = cpu.requested_kind()
    own = cpu.kind_of(cpu.machine_flags())
    return f"CPU kind: {kind.name} ({cpu.CPU_KIND_ENV}; this machine is {own})" if kind else f"CPU kind: {own}"


def pytest_collection_modifyitems(config, items):
    """Mark each test by its folder (unit, integration) and mark `slow` those that need archives or a server."""
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        folder = item.path.relative_to(tests_dir).parts[0] if item.path.is_relative_to(tests_dir) else None
        if folder in ("unit", "integration"):
            item.add_marker(folder)
        if folder == "integration" or SLOW_FIXTURES.intersection(item.fixturenames):
            item.add_marker("slow")
