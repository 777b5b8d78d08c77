"""scripts/build_decode_steps.py and handlers/generation/decoder_export.py: the generator's package-time walk (the
decoder exported without a second copy of its weights, every decoding step gated and ranked), what a worker makes
of it at load, and `make package` sending a causal LM's folder to the generator's template. The demo folder is the
one the generator spec's prepare step stages (tests/unit/tiny_models.py)."""

import json
import shutil

import pytest
import torch

from handlers.core import runtime
from handlers.generation import decoder_export
from scripts import build_decode_steps, package
from scripts.ops.handler_loader import load_handler

CONFIG = package.REPO / "models" / "generator" / "model-config.yaml"


@pytest.fixture(scope="module")
def staged(prepared_model_dir):
    return prepared_model_dir("generator")


def manifest_of(folder):
    return json.loads((folder / decoder_export.FOLDER / decoder_export.MANIFEST).read_text())


def test_the_prepare_step_exports_the_decoder_without_a_second_copy_of_the_weights(staged):
    manifest = manifest_of(staged)
    decoder = manifest["decoder"]
    assert decoder["exported"] and decoder_export.exported(staged)
    weights = sum(path.stat().st_size for path in (staged / "lm").glob("*.safetensors"))
    exported = sum((staged / name).stat().st_size for name in decoder["files"])
    assert decoder["bin_size"] >= weights * 0.99  # the IR's constants are the weights...
    assert decoder["bytes_from_model"] >= decoder["bin_size"] * 0.99  # ...taken from the model's own tensors
    assert exported < weights / 5  # so the archive holds the XML and a few bytes, not the weights again


def test_every_candidate_is_gated_and_timed_and_every_refusal_says_why(staged):
    manifest = manifest_of(staged)
    assert manifest["built_on"]["cpu_kind"] == runtime.cpu_kind()
    ranked = manifest["candidates"]
    assert [entry["rank"] for entry in ranked] == list(range(1, len(ranked) + 1))
    assert [entry["ms_per_token"] for entry in ranked] == sorted(entry["ms_per_token"] for entry in ranked)
    assert {"step": "eager", "precision": "fp32"}.items() <= next(e for e in ranked if e["step"] == "eager").items()
    rows = manifest["ranking"]["rows"]
    assert rows == [1, 16] and manifest["ranking"]["rounds"] >= 3
    # Built candidates are timed whether or not their gate passed: what each would give is on record.
    for entry in ranked + [e for e in manifest["refused"] if e["kind"] in ("slower", "gate")]:
        assert set(entry["ms_per_step"]) == {"1", "16"} and all(ms > 0 for ms in entry["ms_per_step"].values())
        if (entry["step"], entry["precision"]) != ("eager", "fp32"):
            assert entry["gate"]["passed"] == (entry.get("kind") != "gate")
            assert entry["gate"]["logprob_threshold"] == 0.1
    tried = {(e["step"], e["precision"]) for e in ranked + manifest["refused"]}
    native = ["fp32", "bf16"] if runtime.cpu_has_native_bf16() else ["fp32"]
    paged = {("openvino", "int8")}  # int8 weights: the paged step's alone, on any CPU
    assert tried == {(step, precision) for step in ("eager", "openvino") for precision in native} | paged
    for entry in manifest["refused"]:
        assert entry["kind"] in ("gate", "slower", "compile", "convert", "run") and entry["reason"]
        if entry["kind"] == "gate":
            assert entry["reason"].startswith(f"decoding gate: greedy {entry['precision']} tokens")


def test_a_worker_reads_the_exported_decoder_and_passes_the_gate_with_it(staged):
    torch.set_num_threads(1)
    handler, _ = load_handler(staged, "generator", {"decode_step": "openvino"}, continuous_batching=True)
    step = handler.describe()["decode_step"]
    assert step["serving"] == "openvino" and step["gate"]["passed"], step["reason"]
    assert step["decoder"] == "read from the archive's decode/openvino/decoder.xml"
    assert step["package_time"]["decoder_exported"] and step["package_time"]["ranked"]


def test_auto_leaves_out_what_the_build_refused_and_says_so(staged, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(staged, folder)
    manifest = manifest_of(folder)
    gate = {"kind": "gate", "reason": "decoding gate: greedy fp32 tokens differ (made up here)"}
    manifest["refused"] = [{"step": "openvino", "precision": "fp32", **gate}]
    (folder / decoder_export.FOLDER / decoder_export.MANIFEST).write_text(json.dumps(manifest))
    handler, _ = load_handler(folder, "generator", {"decode_step": "auto"}, continuous_batching=True)
    step = handler.describe()["decode_step"]
    assert step["serving"] == "eager" and step["reason"] == f"fp32: at package time: {gate['reason']}"
    assert step["refused"] == [{"precision": "fp32", "kind": "package", "reason": f"at package time: {gate['reason']}"}]
    # openvino still tries it (a forced setting), and the load-time gate has the last word
    handler, _ = load_handler(folder, "generator", {"decode_step": "openvino"}, continuous_batching=True)
    assert handler.describe()["decode_step"]["serving"] == "openvino"


def test_only_refusals_about_the_model_carry_over_to_another_kind_of_cpu():
    manifest = {
        "built_on": {"cpu_kind": "amx"},
        "refused": [
            {"step": "openvino", "precision": "bf16", "kind": "slower", "reason": "slower"},
            {"step": "openvino", "precision": "fp32", "kind": "gate", "reason": "tokens differ"},
            {"step": "eager", "precision": "bf16", "kind": "gate", "reason": "not the paged step's"},
        ],
    }
    kept, refused = decoder_export.planned(manifest, ["bf16", "fp32"], "avx512-bf16")
    assert kept == ["bf16"] and refused == [
        {"precision": "fp32", "kind": "package", "reason": "at package time: tokens differ"}
    ]
    kept, refused = decoder_export.planned(manifest, ["bf16", "fp32"], "amx")  # where it was measured slower
    assert kept == [] and [entry["precision"] for entry in refused] == ["bf16", "fp32"]
    manifest["refused"] = [{"step": "openvino", "precision": "bf16", "kind": "machine", "reason": "no bf16"}]
    assert decoder_export.planned(manifest, ["bf16"], "amx") == (["bf16"], [])  # a machine refusal never carries
    manifest["refused"] = [{"step": "openvino", "precision": "int8", "kind": "run", "reason": "no rows"}]
    assert decoder_export.planned(manifest, ["int8"], "avx2") == (["int8"], [])  # its kernels may run elsewhere
    assert decoder_export.planned(manifest, ["int8"], "amx")[0] == []


def test_on_the_cpu_kind_it_was_measured_on_the_walk_follows_the_ranking():
    manifest = {
        "built_on": {"cpu_kind": "amx"},
        "candidates": [
            {"rank": 1, "step": "openvino", "precision": "int8"},
            {"rank": 2, "step": "eager", "precision": "fp32"},
            {"rank": 3, "step": "openvino", "precision": "fp32"},
            {"rank": 4, "step": "openvino", "precision": "bf16"},
        ],
        "refused": [],
    }
    assert decoder_export.planned(manifest, ["bf16", "fp32", "int8"], "amx")[0] == ["int8", "fp32", "bf16"]
    assert decoder_export.planned(manifest, ["bf16", "fp32", "int8"], "avx2")[0] == ["bf16", "fp32", "int8"]
    manifest["candidates"] = manifest["candidates"][1:3]  # bf16 and int8 not ranked: they keep their place, after
    assert decoder_export.planned(manifest, ["bf16", "fp32", "int8"], "amx")[0] == ["fp32", "bf16", "int8"]


def test_int8_weights_are_held_to_eager_fp32_and_refused_as_slower_than_it():
    def timed(step, precision, ms):
        candidate = build_decode_steps.Candidate(step, precision)
        candidate.samples = {1: [ms / 1000], 16: [16 * ms / 1000]}
        return candidate

    kept, refused = build_decode_steps.order([timed("eager", "fp32", 10), timed("openvino", "int8", 12),
                                              timed("openvino", "fp32", 9)])  # fmt: skip
    assert [(e["step"], e["precision"]) for e in kept] == [("openvino", "fp32"), ("eager", "fp32")]
    assert refused[0]["precision"] == "int8" and refused[0]["kind"] == "slower"
    assert refused[0]["reason"] == "12.0 ms per token, over 10 % slower than eager/fp32 (10.0)"


def test_an_export_that_does_not_fit_the_model_is_refused_by_name_and_the_worker_traces_instead(staged, tmp_path):
    from transformers import AutoModelForCausalLM

    from handlers.generation import paged_openvino

    model = AutoModelForCausalLM.from_pretrained(staged / "lm", dtype=torch.float32).eval()
    folder = tmp_path / "model"
    shutil.copytree(staged / decoder_export.FOLDER, folder / decoder_export.FOLDER)
    recipe_path = folder / decoder_export.FOLDER / decoder_export.WEIGHTS
    recipe = json.loads(recipe_path.read_text())
    named = next(segment for segment in recipe["segments"] if "tensor" in segment)
    named["tensor"] = "no.such.weight"
    recipe_path.write_text(json.dumps(recipe))
    with pytest.raises(decoder_export.ExportError, match="reads tensor 'no.such.weight', which this model lacks"):
        decoder_export.read(model, folder)
    _, _, source = paged_openvino.convert(model, folder)
    assert source.startswith("traced at load (the archive's export: the exported decoder reads tensor")


def test_a_rebuild_with_the_same_inputs_keeps_what_is_there(staged, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(staged, folder)
    before = manifest_of(folder)
    build_decode_steps.build(folder, CONFIG, rank_seconds=3.0)
    assert "up to date" in capsys.readouterr().out and manifest_of(folder) == before
    assert build_decode_steps.main(["--model-dir", str(tmp_path / "nothing"), "--config", str(CONFIG)]) == 1
    assert "does not load as the generator's model folder" in capsys.readouterr().err


def test_make_package_sends_a_causal_lm_folder_to_the_generator_and_an_embedding_decoder_to_text(staged, tmp_path):
    causal = tmp_path / "causal"
    shutil.copytree(staged / "lm", causal)
    assert package.template_for(causal) == "generator"
    embedding = tmp_path / "embedding"
    shutil.copytree(staged / "lm", embedding)
    (embedding / "modules.json").write_text("[]")  # a sentence-transformers model (a decoder used for embeddings)
    assert package.template_for(embedding) == "text-model"


def test_a_model_the_paged_transformation_refuses_is_recorded_and_the_eager_steps_still_rank(
    staged, tmp_path, monkeypatch
):
    from handlers.generation import paged_openvino

    def refuse(stateful):
        raise paged_openvino.Unconvertible("the attention was not recognised (made up here)")

    monkeypatch.setattr(paged_openvino, "to_paged", refuse)
    folder = tmp_path / "model"
    shutil.copytree(staged, folder)
    manifest = build_decode_steps.build(folder, CONFIG, rank_seconds=1.0, force=True)
    assert manifest["decoder"]["reason"] == "not paged: the attention was not recognised (made up here)"
    paged = [entry for entry in manifest["refused"] if entry["step"] == "openvino"]
    assert paged and all(entry["kind"] == "convert" for entry in paged)
    assert all(entry["reason"].endswith("(made up here)") for entry in paged)
    assert {entry["step"] for entry in manifest["candidates"]} == {"eager"}


def test_the_generators_prepare_step_reruns_when_the_code_decode_is_built_from_changes():
    import yaml

    for name in ("generator", "generator-124m"):
        spec = yaml.safe_load((package.REPO / "models" / name / "model.yaml").read_text())
        missing = set(build_decode_steps.CODE_INPUTS) - set(spec["prepare"]["inputs"])
        assert not missing, f"models/{name}/model.yaml: prepare inputs lack {sorted(missing)}"
