"""minilm's backends (handlers/text/backends.py) and `backend: auto`'s walk over backends/manifest.json.

On the tiny MiniLM stand-in (tests/unit/tiny_minilm.py): its OpenVINO IR converts in about a second. Manifests are
written here, so each test states exactly which candidates the archive offers; a test that needs another kind of CPU
runs as that kind (TS_CPU_AS masks the flags the handler reads); the others assert what the kind they run as must do,
and `make test` runs them again as an AVX2-only CPU (marker cpu_kind).
"""

import json
import shutil

import pytest
import torch

from handlers.core import cpu, runtime
from handlers.core.config import ConfigError
from handlers.core.cores import LEASE_DIR_ENV, available_cores
from handlers.text import backends
from handlers.text.model import load_sentence_encoder
from scripts.ops.handler_loader import handler_class, load_handler, make_context, record_metrics, set_requests, statuses
from tests.unit.tiny_minilm import make_tiny_model_dir

openvino = pytest.importorskip("openvino")
pytestmark = pytest.mark.cpu_kind

TEXTS = ["short", "a somewhat longer sentence about serving", "東京 🙂 café " * 30, "x " * 400]


@pytest.fixture
def model_dir(tiny_minilm_dir, tmp_path):
    """A private copy of the tiny model folder, without any backends/ the staging step left."""
    target = tmp_path / "model"
    shutil.copytree(tiny_minilm_dir, target)
    shutil.rmtree(target / "backends", ignore_errors=True)
    return target


def convert_to_ir(weights_dir, model_dir):
    """model_dir's backends/openvino/model.xml converted from the encoder in ``weights_dir``, dynamic dims."""
    encoder = load_sentence_encoder(weights_dir)
    example = (torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    dynamic = (openvino.PartialShape([-1, -1]), openvino.Type.i64)
    with torch.inference_mode():
        converted = openvino.convert_model(encoder, example_input=example, input=[dynamic, dynamic])
    (model_dir / "backends" / "openvino").mkdir(parents=True, exist_ok=True)
    openvino.save_model(converted, str(model_dir / backends.OPENVINO_IR), compress_to_fp16=False)


@pytest.fixture(scope="module")
def tiny_ir(tiny_minilm_dir, tmp_path_factory):
    """The tiny model's IR, converted once for the module."""
    target = tmp_path_factory.mktemp("tiny-ir")
    convert_to_ir(tiny_minilm_dir, target)
    return target / "backends" / "openvino"


@pytest.fixture
def write_ir(tiny_ir):
    def write(model_dir):
        shutil.copytree(tiny_ir, model_dir / "backends" / "openvino")

    return write


def write_manifest(model_dir, candidates, flags=()):
    manifest = {
        "format": 1,
        "built_on": {"cpu": "test", "flags": sorted(flags)},
        "candidates": [{"backend": b, "precision": p, "rank": rank} for rank, (b, p) in enumerate(candidates, 1)],
        "refused": [],
    }
    (model_dir / "backends").mkdir(exist_ok=True)
    (model_dir / backends.MANIFEST).write_text(json.dumps(manifest))


def load(model_dir, **overrides):
    return load_handler(model_dir, "minilm", {"cache_size": 0, **overrides})


def embed(handler, context, texts=TEXTS):
    set_requests(context, [{"Content-Type": "application/json"}])
    [answer] = handler.handle([{"body": {"input": texts}}], context)
    assert statuses(context, 1) == [200]
    return torch.tensor([row["embedding"] for row in json.loads(answer)["data"]])


def refusals(handler):
    return [(f["backend"], f["precision"], f["reason"]) for f in handler.describe()["backend_fallbacks"]]


def test_openvino_fp32_serves_the_same_embeddings_as_eager_fp32(write_ir, model_dir):
    write_ir(model_dir)
    eager = embed(*load(model_dir, backend="eager", precision="fp32"))
    handler, context = load(model_dir, backend="openvino", precision="fp32")

    assert (handler.backend, handler.precision) == ("openvino", "fp32")
    assert isinstance(handler.model, backends.OpenVinoEncoder)
    served = embed(handler, context)
    assert served.dtype == torch.float32 and served.shape == eager.shape
    assert torch.nn.functional.cosine_similarity(served, eager).min() >= 0.999
    assert handler.describe()["backend_min_cosine"] >= 0.999


def test_under_a_core_lease_openvino_compiles_for_every_core_and_a_widened_batch_answers_the_same(
    write_ir, model_dir, tmp_path, monkeypatch
):
    """A worker's share is 1 thread; a batch that borrows the idle cores runs the model compiled for all of them
    (OpenVINO fixes a compiled model's threads), and its vectors match the narrow model's."""
    write_ir(model_dir)
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "lease"))
    handler, context = load(model_dir, backend="openvino", precision="fp32", threads=1, borrow_idle_cores=True)
    cores = available_cores()
    assert sorted(handler.model.requests) == sorted({1, cores})
    assert handler.describe()["borrow_idle_cores"] == {
        "enabled": True,
        "lease_cores": cores,
        "min_tokens": 0,
        "min_forward_ms": 0,
        "longest_row_ms": None,
    }
    widened = embed(handler, context)  # alone: it holds every core of the lease

    monkeypatch.delenv(LEASE_DIR_ENV)
    narrow, narrow_context = load(model_dir, backend="openvino", precision="fp32", threads=1, borrow_idle_cores=True)
    assert sorted(narrow.model.requests) == [1]
    assert narrow.describe()["borrow_idle_cores"]["lease_cores"] is None
    assert torch.allclose(widened, embed(narrow, narrow_context), atol=1e-5)

    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "lease"))
    default, _ = load(model_dir, backend="openvino", precision="fp32", threads=1)  # the option is off by default
    assert sorted(default.model.requests) == [1]
    assert default.describe()["borrow_idle_cores"] == {
        "enabled": False,
        "lease_cores": None,
        "min_tokens": 0,
        "min_forward_ms": 0,
        "longest_row_ms": None,
    }


def test_a_model_whose_longest_row_is_faster_than_borrow_min_forward_ms_gives_the_lease_up(
    model_dir, tmp_path, monkeypatch
):
    """borrow_min_forward_ms: the longest row is timed at load on the worker's own share; below the bound the worker
    computes on its own share only, and describe says how long the row took (at or above the bound the lease is kept:
    the test above, bound 0)."""
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "lease"))
    small, _ = load(model_dir, precision="fp32", threads=1, borrow_idle_cores=True, borrow_min_forward_ms=100_000)
    described = small.describe()["borrow_idle_cores"]
    assert described["lease_cores"] is None and described["min_forward_ms"] == 100_000
    assert 0 < described["longest_row_ms"] < 100_000


def test_describe_splits_the_load_time_into_phases_that_add_up_to_it(write_ir, model_dir):
    write_ir(model_dir)
    write_manifest(model_dir, [("openvino", "fp16"), ("openvino", "fp32")])
    handler, _ = load(model_dir, precision="fp32")

    described = handler.describe()
    phases = described["load_phases"]
    assert list(phases) == ["model", "reference_inputs", "gate_reference", "backend_load", "gate", "warmup", "other"]
    # OpenVINO compiled its IR and the gate and warm-up ran it: each took time of its own.
    assert min(handler.load_phases.seconds[name] for name in ("backend_load", "gate", "warmup")) > 0
    assert sum(handler.load_phases.seconds.values()) == pytest.approx(handler.load_seconds)
    assert sum(phases.values()) == pytest.approx(described["load_seconds"], abs=0.005 * (len(phases) + 1))


def test_auto_without_a_manifest_serves_eager_and_says_why(model_dir):
    handler, context = load(model_dir, precision="fp32")

    described = handler.describe()
    assert (described["backend"], described["requested_backend"], described["precision"]) == ("eager", "auto", "fp32")
    assert "the archive has no backends/manifest.json" in described["backend_reason"]
    assert described["backend_fallbacks"] == []
    assert embed(handler, context).shape == (len(TEXTS), 32)


def test_auto_skips_candidates_this_worker_cannot_run_with_their_reasons_and_serves_the_next(write_ir, model_dir):
    write_ir(model_dir)
    write_manifest(model_dir, [("openvino", "fp16"), ("aot", "fp32"), ("openvino", "bf16"), ("openvino", "fp32")])
    context = make_context(model_dir, "minilm")
    context.model_yaml_config["handler"].update(cache_size=0, precision="fp32")
    recorded = record_metrics(context)
    handler = handler_class("minilm")()
    handler.initialize(context)

    assert (handler.backend, handler.precision) == ("openvino", "fp32")
    # A CPU without native bf16 (avx2) refuses bf16 for that before the configured precision is compared.
    no_native_bf16 = runtime.machine_can_run("bf16", torch.device("cpu"))
    assert refusals(handler) == [
        ("openvino", "fp16", "fp16 is served on CUDA only; this worker runs on cpu"),
        ("aot", "fp32", "no backends/aot-fp32.pt2 in the archive (scripts/build_backends.py builds it)"),
        ("openvino", "bf16", no_native_bf16 or "handler.precision is fp32"),
    ]
    assert (no_native_bf16 is None) == (runtime.cpu_kind() in ("avx512-bf16", "amx"))
    described = handler.describe()
    assert described["backend_reason"] == "rank 4 of 4 in backends/manifest.json"
    assert described["requested_backend"] == "auto" and described["backend_min_cosine"] >= 0.999
    assert recorded.values("ServedBackend") == [1]
    embed(handler, context)


def test_auto_refuses_a_candidate_below_the_accuracy_gate_and_serves_the_next(model_dir, tmp_path):
    # An IR of other weights: it runs, but its embeddings are not the model's; the gate must catch that.
    convert_to_ir(make_tiny_model_dir(model_dir, tmp_path / "other", seed=1), model_dir)
    write_manifest(model_dir, [("openvino", "fp32"), ("eager", "fp32")])
    handler, context = load(model_dir, precision="fp32")

    [(backend, precision, reason)] = refusals(handler)
    assert (backend, precision) == ("openvino", "fp32")
    assert reason.startswith("accuracy gate: min cosine") and "below the bound 0.999" in reason
    assert (handler.backend, handler.precision, handler.backend_reason) == (
        "eager",
        "fp32",
        "rank 2 of 2 in backends/manifest.json",
    )


def test_a_cpu_without_native_bf16_skips_bf16_candidates_and_auto_precision_becomes_fp32(
    write_ir, model_dir, monkeypatch
):
    monkeypatch.setenv(cpu.CPU_KIND_ENV, "avx2")
    write_ir(model_dir)
    write_manifest(model_dir, [("openvino", "bf16"), ("openvino", "fp32")])
    handler, _ = load(model_dir)  # precision: auto

    assert refusals(handler) == [("openvino", "bf16", "this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16)")]
    assert (handler.backend, handler.precision) == ("openvino", "fp32")
    assert handler.describe()["cpu_kind"] == "avx2"


def test_an_aot_package_compiled_for_instructions_this_cpu_lacks_is_refused_before_it_is_loaded(model_dir, monkeypatch):
    monkeypatch.setenv(cpu.CPU_KIND_ENV, "avx2")
    # Loading it would run machine code this CPU cannot execute (the worker dies of SIGILL): it must not be opened.
    (model_dir / "backends").mkdir()
    (model_dir / backends.aot_package("fp32")).write_bytes(b"not a package")
    write_manifest(model_dir, [("aot", "fp32")], flags={"avx2", "avx512f", "amx_bf16", "amx_tile", "fma"})
    handler, _ = load(model_dir)

    [(backend, _, reason)] = refusals(handler)
    assert backend == "aot"
    assert reason.endswith("it was compiled on a CPU with amx_bf16 amx_tile avx512f, which this CPU lacks")
    assert (handler.backend, handler.precision) == ("eager", "fp32")


@pytest.mark.parametrize(
    ("backend", "missing"), [("openvino", r"backends/openvino/model\.xml"), ("aot", r"backends/aot-fp32\.pt2")]
)
def test_an_explicit_backend_that_cannot_run_fails_the_worker_with_every_reason(model_dir, backend, missing):
    # An archive without that backend's files (built elsewhere, or its build refused it), on every kind of CPU.
    with pytest.raises(ConfigError, match=rf"{backend} fp32: no {missing} in the archive"):
        load(model_dir, backend=backend, precision="fp32", warmup=False)


def test_backend_options_are_validated_with_the_key_named(model_dir):
    with pytest.raises(ConfigError, match="handler.backend: 'tensorrt' is not one of"):
        load(model_dir, backend="tensorrt")
