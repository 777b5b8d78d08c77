"""Bring-your-own model: scripts.prepare_generator copies a Hugging Face causal-LM folder's serving files only."""

import json
import shutil

from scripts import prepare_generator


def test_own_model_folder_is_copied_without_extras_and_labelled_user_supplied(prepared_model_dir, tmp_path):
    own = tmp_path / "my-hf-model"
    shutil.copytree(prepared_model_dir("generator") / "lm", own)
    (own / "README.md").write_text("not needed to serve")
    (own / "training_args.bin").write_bytes(b"pickled training state")
    out = tmp_path / "build"
    assert prepare_generator.main(["--out", str(out), "--model-dir", str(own), "--name", "mine"]) == 0
    copied = sorted(p.name for p in (out / "lm").iterdir())
    assert "README.md" not in copied and "training_args.bin" not in copied
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(copied)
    info = json.loads((out / "model_info.json").read_text())
    assert info["name"] == "mine" and info["weights"] == "user-supplied" and info["source"] == str(own)


def test_folder_with_only_pickled_weights_is_refused(tmp_path, capsys):
    own = tmp_path / "pickled"
    own.mkdir()
    (own / "config.json").write_text("{}")
    (own / "pytorch_model.bin").write_bytes(b"pickle")
    assert prepare_generator.main(["--out", str(tmp_path / "build"), "--model-dir", str(own)]) == 1
    assert "no *.safetensors weights (found ['pytorch_model.bin']" in capsys.readouterr().err
    assert not (tmp_path / "build" / "model_info.json").exists()


def test_a_verifier_without_an_embedder_is_refused_naming_the_fix(tmp_path, capsys):
    out = tmp_path / "build"
    assert prepare_generator.main(["--out", str(out), "--verifier", str(tmp_path / "cross-encoder")]) == 1
    assert "--var embedder=" in capsys.readouterr().err and not (out / "verifier").exists()
