"""The compiled backends: jit (no recompilation after warm-up) and aot (a .pt2 built as the packaging step builds it).

Both run on a 1-layer, 32-wide BERT with the real tokenizer (tests/unit/tiny_minilm.py): the same model code, so the
same graphs and guards, at a fraction of the compile time of the real encoder.
"""

import json
import random
import shutil

import pytest
import torch

from handlers.core import runtime
from handlers.core.config import ConfigError
from handlers.text import backends
from handlers.text.model import load_sentence_encoder
from scripts import build_backends
from scripts.ops.handler_loader import load_handler, set_requests, statuses
from tests.unit.tiny_minilm import make_tiny_model_dir

WORDS = "the of serving tensor café 東京 🙂 batch token model request queue latency x".split()


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_minilm_dir):
    return tiny_minilm_dir


def load(model_dir, **handler_overrides):
    return load_handler(model_dir, "minilm", {"precision": "fp32", "cache_size": 0, **handler_overrides})


def mixed_load(seed=0):
    """Batches of 1..40 requests, texts from 1 to ~400 words (every bucket, truncation included)."""
    rng = random.Random(seed)
    batches = []
    for requests in (1, 3, 16, 2, 7, 1, 40):
        batch = []
        for _ in range(requests):
            texts = [
                " ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 3, 9, 20, 45, 100, 400])))
                for _ in range(rng.choice([1, 1, 2, 5]))
            ]
            batch.append({"input": texts})
        batches.append(batch)
    return batches


def answer_all(handler, context, batches):
    results = []
    for bodies in batches:
        set_requests(context, [{"Content-Type": "application/json"}] * len(bodies))
        answers = handler.handle([{"body": body} for body in bodies], context)
        assert statuses(context, len(bodies)) == [200] * len(bodies)
        results.append([torch.tensor([d["embedding"] for d in json.loads(a)["data"]]) for a in answers])
    return results


@pytest.fixture(scope="module")
def eager_answers(tiny_model_dir):
    handler, context = load(tiny_model_dir)
    return answer_all(handler, context, mixed_load())


def assert_same_answers(got, expected):
    for got_batch, expected_batch in zip(got, expected, strict=True):
        for got_rows, expected_rows in zip(got_batch, expected_batch, strict=True):
            assert torch.nn.functional.cosine_similarity(got_rows, expected_rows).min() > 0.9999


def test_jit_warmup_covers_every_served_shape_so_a_mixed_load_compiles_nothing(tiny_model_dir, eager_answers):
    handler, context = load(tiny_model_dir, backend="jit")
    before = runtime.compile_count()
    answers = answer_all(handler, context, mixed_load())
    assert runtime.compile_count() == before, "a served shape was not covered by warm-up"
    assert_same_answers(answers, eager_answers)


@pytest.fixture(scope="module")
def aot_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with backends/aot-fp32.pt2 built by the packaging step's own builder (about a minute)."""
    target = tmp_path_factory.mktemp("tiny-aot") / "model"
    shutil.copytree(tiny_model_dir, target)
    shutil.rmtree(target / "backends", ignore_errors=True)
    (target / "backends").mkdir()
    example = (torch.ones(4, 16, dtype=torch.long), torch.ones(4, 16, dtype=torch.long))
    build_backends.build_aot(target, load_sentence_encoder(target), example, "fp32", "cpu", 1024, 256)
    return target


def write_manifest(model_dir, candidates):
    entries = [
        {"backend": backend, "precision": precision, "rank": rank, **extra}
        for rank, (backend, precision, extra) in enumerate(candidates, start=1)
    ]
    manifest = {"format": 1, "built_on": {"flags": sorted(runtime.cpu_flags())}, "candidates": entries}
    (model_dir / backends.MANIFEST).write_text(json.dumps(manifest))


def test_aot_package_built_like_the_packaging_step_loads_and_matches_eager(aot_model_dir, eager_answers):
    write_manifest(aot_model_dir, [("aot", "fp32", {"device": "cpu", "max_batch": 1024, "max_tokens": 256})])
    compiles = runtime.compile_count()
    handler, context = load(aot_model_dir, backend="aot")
    assert runtime.compile_count() == compiles  # nothing is compiled in the worker
    assert (handler.describe()["backend"], handler.describe()["precision"]) == ("aot", "fp32")
    assert_same_answers(answer_all(handler, context, mixed_load()), eager_answers)

    # A worker whose forward passes could exceed the package's dynamic batch bound refuses to start.
    with pytest.raises(ConfigError, match="takes at most 1024 rows, a forward pass may hold 2048"):
        load(aot_model_dir, backend="aot", max_forward_tokens=32768)


@pytest.fixture
def isa_probes(monkeypatch):
    """Every vector-ISA probe inductor runs from now on (it compiles and loads a test program per ISA: seconds each
    on an empty inductor cache); its remembered answers are forgotten before and after, so a probe would show."""
    from torch._inductor import cpu_vec_isa

    def forget():
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        classes = {cls for isa in cpu_vec_isa.supported_vec_isa_list for cls in type(isa).__mro__}
        for cls in classes:
            for member in vars(cls).values():  # the functools.cache'd __bool__ of each ISA class
                if hasattr(member, "cache_clear"):
                    member.cache_clear()

    probed = []
    monkeypatch.setattr(cpu_vec_isa.VecISA, "check_build", lambda isa, code: probed.append(str(isa)) or True)
    forget()
    yield probed
    forget()


def test_a_worker_loads_an_aot_package_without_probing_the_compiler(aot_model_dir, isa_probes):
    write_manifest(aot_model_dir, [("aot", "fp32", {"device": "cpu", "max_batch": 1024, "max_tokens": 256})])
    handler, _ = load(aot_model_dir, backend="aot")

    assert handler.backend == "aot"
    assert isa_probes == []  # the package's ISA is checked against the manifest's flags, not by compiling


def test_auto_refuses_a_prebuilt_candidate_below_the_gate_and_serves_the_next_one(aot_model_dir, tmp_path):
    from tests.unit.test_embeddings_backends import convert_to_ir

    # rank 1: an OpenVINO IR of other weights, which runs but does not compute this model: the gate refuses it.
    convert_to_ir(make_tiny_model_dir(aot_model_dir, tmp_path / "other", seed=1), aot_model_dir)
    write_manifest(aot_model_dir, [("openvino", "fp32", {}), ("aot", "fp32", {})])
    handler, _ = load(aot_model_dir, backend="auto")

    [refused] = handler.describe()["backend_fallbacks"]
    assert (refused["backend"], refused["precision"]) == ("openvino", "fp32")
    assert refused["reason"].startswith("accuracy gate:")
    assert (handler.backend, handler.precision) == ("aot", "fp32")
    assert handler.describe()["backend_reason"] == "rank 2 of 2 in backends/manifest.json"
