"""The network handler's ``backend`` / ``precision`` options (handlers/network/backends.load_served, called by
handlers/network/handler.py): a folder packaged by the prepare step with an OpenVINO candidate (it converts in about a
second), then loaded as a worker loads it under each option: ``auto`` serves the recorded winner, an explicit value
serves that one, and what cannot serve falls back to eager fp32 with the reason; describe shows the choice, why, and
each candidate's gate values and speed."""

import json

import pytest
import torch

from handlers.core.config import ConfigError
from handlers.network import backends
from handlers.network.program import load_program
from handlers.network_model import NetworkModelHandler
from scripts import prepare_network_model, tiny_networks
from tests.unit.test_network_handler import PREDICTIONS, Context, handle

pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    """The tiny MLP staged with an OpenVINO candidate at fp32 (kept even where it ranks slower than eager: the
    ranking of a 2-layer program is noise), and the same program staged with --backends none."""
    root = tmp_path_factory.mktemp("network-options")
    source = tiny_networks.make_mlp(root / "source")
    built, bare = root / "built", root / "bare"
    common = ["--source", str(source), "--rank-seconds", "0.3"]
    assert (
        prepare_network_model.main([*common, "--out", str(built), "--backends", "openvino", "--keep-slower", "true"])
        == 0
    )
    assert prepare_network_model.main([*common, "--out", str(bare), "--backends", "none"]) == 0
    return built, bare


def served(folder, backend="auto", precision="auto"):
    loaded = load_program(folder)
    return backends.load_served(folder, loaded.program, loaded.signature, backend=backend, precision=precision)


def manifest_of(folder):
    return json.loads((folder / backends.MANIFEST).read_text())


def test_packaging_records_the_gated_candidates_and_none_when_asked(packaged):
    built, bare = packaged
    manifest = manifest_of(built)
    assert {c["backend"] for c in manifest["candidates"]} == {"openvino"}
    fp32 = backends.candidate_entry(manifest, "openvino", "fp32")
    assert fp32["gate_max_relative"] <= backends.FP32_MAX_RELATIVE and fp32["ms_per_row"] > 0
    assert (built / backends.OPENVINO_IR).is_file()
    assert manifest_of(bare)["candidates"] == [] and not (bare / backends.OPENVINO_IR).exists()


def test_auto_serves_the_recorded_winner_and_fp32_restricts_it(packaged):
    built, _ = packaged
    winner = backends.ranked(manifest_of(built))[0]
    chosen = served(built)
    assert (chosen.backend, chosen.precision) == (winner["backend"], winner["precision"])
    assert chosen.why.startswith(f"rank 1 of {len(manifest_of(built)['candidates'])} in backends/manifest.json")

    at_fp32 = served(built, precision="fp32")
    assert (at_fp32.backend, at_fp32.precision) == ("openvino", "fp32")
    assert at_fp32.gate["gate_max_relative"] <= backends.FP32_MAX_RELATIVE


@pytest.mark.parametrize(
    ("backend", "precision", "expected", "why"),
    [
        ("eager", "auto", ("eager", "fp32"), "configured: backend eager"),
        ("openvino", "fp32", ("openvino", "fp32"), "rank "),
        ("aot", "auto", ("eager", "fp32"), "eager: every candidate asked for was passed over"),
        ("auto", "fp16", ("eager", "fp32"), "eager: backends/manifest.json lists no candidate at fp16"),
    ],
)
def test_explicit_values_serve_what_they_name_or_eager_with_the_reason(packaged, backend, precision, expected, why):
    built, _ = packaged
    chosen = served(built, backend, precision)
    assert (chosen.backend, chosen.precision) == expected
    assert chosen.why.startswith(why)
    if backend == "aot":
        assert chosen.passed_over == [
            "aot/fp32: no backends/aot-fp32.pt2 in the archive (scripts/build_backends.py builds it)"
        ]


def test_an_archive_packaged_without_backends_serves_eager_saying_so(packaged):
    _, bare = packaged
    chosen = served(bare)
    assert (chosen.backend, chosen.precision) == ("eager", "fp32")
    assert chosen.why == "eager: backends/manifest.json lists none (no backends asked (--backends none))"


def test_the_handler_serves_the_option_describes_it_and_answers_as_eager(packaged):
    built, _ = packaged
    context = Context(built)
    context.model_yaml_config = {"handler": {"threads": 1, "backend": "openvino", "precision": "fp32"}}
    handler = NetworkModelHandler()
    handler.initialize(context)
    described = handler.describe()
    assert (described["backend"], described["precision"]) == ("openvino", "fp32")
    assert described["requested_backend"] == "openvino" and described["backend_reason"].startswith("rank ")
    [candidate] = [c for c in described["backends"]["candidates"] if c["precision"] == "fp32"]
    assert candidate["backend"] == "openvino" and candidate["ms_per_row"] > 0
    assert candidate["gate_max_relative"] <= backends.FP32_MAX_RELATIVE

    rows = torch.randn(5, 6, generator=torch.Generator().manual_seed(11))
    [(status, _, body)] = handle(handler, [(PREDICTIONS, {"inputs": {"x": rows.tolist()}})])
    assert status == 200
    got = torch.tensor(json.loads(body)["outputs"]["output0"])
    with torch.inference_mode():
        expected = tiny_networks.seeded(tiny_networks.MLP)(rows)
    assert ((got - expected).abs().max() / expected.abs().max()).item() <= backends.FP32_MAX_RELATIVE


def test_an_unknown_backend_option_is_refused_naming_it(packaged):
    built, _ = packaged
    context = Context(built)
    context.model_yaml_config = {"handler": {"threads": 1, "backend": "tensorrt"}}
    with pytest.raises(ConfigError, match="backend"):
        NetworkModelHandler().initialize(context)
