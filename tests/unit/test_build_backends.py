"""scripts/build_backends.py on the tiny MiniLM stand-in (tests/unit/tiny_minilm.py): gate, packing, ranking, reuse.

OpenVINO only: its IR builds in about a second for the tiny model (AOTInductor compiles for a minute even for it).
"""

import json
import shutil

import pytest

from handlers.core import runtime
from handlers.text.model import load_sentence_encoder
from scripts import build_backends
from tests.unit.tiny_minilm import make_tiny_model_dir

pytest.importorskip("openvino")
pytestmark = pytest.mark.cpu_kind  # what is built depends on the CPU kind (precisions()): make test runs it as avx2 too


@pytest.fixture
def model_dir(tiny_minilm_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(tiny_minilm_dir, target)
    return target


@pytest.fixture(scope="module")
def built(tiny_minilm_dir, tmp_path_factory):
    """(a tiny model folder with its backends built, the manifest); candidates slower than eager are kept, since
    for a 1-layer model the call overhead decides that."""
    target = tmp_path_factory.mktemp("built") / "model"
    shutil.copytree(tiny_minilm_dir, target)
    return target, build(target, beat_eager=False)


def precisions():
    return ["fp32", "bf16"] if runtime.cpu_has_native_bf16() else ["fp32"]


def build(model_dir, **options):
    options = {"backends": ["openvino"], "precisions": precisions(), "rank_seconds": 0.2, "device": "cpu"} | options
    return build_backends.build(model_dir, **options)


def test_a_candidate_below_the_gate_is_not_packed_and_says_why(model_dir, tmp_path, monkeypatch):
    # A broken build: the IR of a model with other weights. It loads and runs like a good one; only the gate can tell.
    other_weights = load_sentence_encoder(make_tiny_model_dir(model_dir, tmp_path / "other", seed=1))
    real_builder = build_backends.BUILDERS["openvino"]

    def build_other_weights(model_dir, fp32_model, *args):
        return real_builder(model_dir, other_weights, *args)

    monkeypatch.setitem(build_backends.BUILDERS, "openvino", build_other_weights)
    manifest = build(model_dir)

    assert manifest["candidates"] == []
    refused = {(entry["backend"], entry["precision"]): entry["reason"] for entry in manifest["refused"]}
    assert set(refused) == {("openvino", precision) for precision in precisions()}
    assert all(reason.startswith("gate: min cosine to eager fp32") for reason in refused.values()), refused
    assert all(entry["gate_min_cosine"] < 0.999 for entry in manifest["refused"])
    assert not (model_dir / "backends" / "openvino").exists()
    assert json.loads((model_dir / "backends" / "manifest.json").read_text())["refused"] == manifest["refused"]


def test_candidates_that_pass_are_packed_and_ranked_best_first(built):
    model_dir, manifest = built

    candidates = manifest["candidates"]
    assert [(c["backend"], c["precision"]) for c in candidates] != []
    assert [c["rank"] for c in candidates] == list(range(1, len(candidates) + 1))
    assert [c["ms_per_text"] for c in candidates] == sorted(c["ms_per_text"] for c in candidates)
    for candidate in candidates:
        assert candidate["gate_min_cosine"] >= manifest["gate"]["min_cosine_bound"]
        assert all((model_dir / name).is_file() for name in candidate["files"])
    assert manifest["ranking_benchmark"]["threads"] == 1
    assert set(manifest["ranking_benchmark"]["eager_ms_per_text"]) == set(precisions())


def test_a_candidate_slower_than_eager_at_its_precision_is_refused():
    def candidate(backend, precision, ms):
        return {"backend": backend, "precision": precision, "device": "cpu", "files": [], "ms_per_text": ms}

    kept, slower = build_backends.order_candidates(
        [candidate("aot", "bf16", 4.0), candidate("openvino", "bf16", 2.0), candidate("openvino", "fp32", 9.0)],
        {"fp32": 8.0, "bf16": 5.0},
    )

    assert [(c["backend"], c["precision"], c["rank"]) for c in kept] == [("openvino", "bf16", 1), ("aot", "bf16", 2)]
    assert [(s["backend"], s["precision"]) for s in slower] == [("openvino", "fp32")]
    assert "slower than eager/fp32 (8.0 ms/text)" in slower[0]["reason"]


def test_a_rebuild_with_the_same_inputs_keeps_the_backends_and_a_changed_option_rebuilds(built, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(built[0], model_dir)
    first = built[1]
    xml = model_dir / "backends" / "openvino" / "model.xml"
    built_at = xml.stat().st_mtime_ns

    again = build(model_dir, beat_eager=False)
    assert again["rebuilt"] is False
    assert again["candidates"] == first["candidates"] and again["build_key"] == first["build_key"]
    assert xml.stat().st_mtime_ns == built_at

    changed = build(model_dir, beat_eager=False, min_cosine=0.99)
    assert changed["rebuilt"] is True
    assert changed["gate"]["min_cosine_bound"] == 0.99


def test_cli_refuses_an_unknown_backend(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_backends.main(["--model-dir", "x", "--backends", "onnx"])
    assert exit_info.value.code == 2
    assert "choose from openvino, aot" in capsys.readouterr().err


def test_cli_says_which_files_a_model_folder_lacks(tmp_path, capsys):
    assert build_backends.main(["--model-dir", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert "lacks text_model.json and reference_sentences.json" in error
    assert "stage the model first with python -m scripts.prepare_text_model" in error


def test_lengths_where_eager_is_clearly_faster_are_routed_to_eager():
    candidate = {16: 1.8, 64: 4.2, 128: 7.5, 256: 32.0}
    eager = {16: 9.5, 64: 12.7, 128: 7.0, 256: 19.7}  # 128: eager only 7 % faster (within the margin): no routing

    routed = build_backends.route_to_eager(candidate, eager)

    assert routed == {16: 1.8, 64: 4.2, 128: 7.5, 256: 19.7}
    shares = {"16": 0.5, "64": 0.3, "128": 0.1, "256": 0.1}
    assert build_backends.weighted_ms(routed, shares) == round(0.9 + 1.26 + 0.75 + 1.97, 3)


def test_the_manifest_records_per_bucket_times_and_the_eager_buckets(built):
    _, manifest = built
    eager = manifest["ranking_benchmark"]["eager_ms_per_bucket"]
    for candidate in manifest["candidates"]:
        own = candidate["ms_per_bucket"]
        assert set(own) == set(eager[candidate["precision"]])
        for bucket in candidate["eager_buckets"]:  # routed only where eager was faster by the margin
            assert eager[candidate["precision"]][str(bucket)] < own[str(bucket)] * (
                1 - build_backends.EAGER_ROUTE_MARGIN
            )
