"""The model identity (handlers/core/identity.py): a content digest of everything in an archive that decides an
answer, recorded at package time and put in every cache key.

Same content -> same digest (wherever the folder lies, however often it is packaged); one changed weight byte ->
another digest; build reports (times, source paths) left out; the caches' keys differ by identity."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from handlers.core import identity
from handlers.generation.prefix_cache import PrefixCache
from handlers.text.cache import cache_key

OPTIONS = {"precision": "fp32", "backend": "auto", "max_inputs": 64, "threads": 1}


def make_folder(root: Path, weights: bytes = b"\x00\x01\x02\x03" * 1000) -> Path:
    """A model folder shaped like a staged text model: weights, tokenizer, a module folder, backends, reports."""
    (root / "1_Pooling").mkdir(parents=True)
    (root / "backends" / "openvino").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(weights)
    (root / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (root / "backends" / "openvino" / "model.bin").write_bytes(b"compiled")
    (root / "backends" / "aot").mkdir()
    (root / "backends" / "aot" / "model.pt2").write_bytes(b"compiled too")  # sorts before manifest.json
    (root / "backends" / "manifest.json").write_text('{"ranked": [{"ms": 1.25}]}')
    (root / "model_source.json").write_text(json.dumps({"folder": str(root)}))
    return root


def record_of(folder: Path, options=OPTIONS) -> dict:
    return identity.compute([(child, child.name) for child in folder.iterdir()], options)


def test_the_same_content_in_two_places_has_the_same_identity(tmp_path):
    first = record_of(make_folder(tmp_path / "a"))
    second = record_of(make_folder(tmp_path / "elsewhere" / "b"))
    assert first["identity"] == second["identity"] and first["identity"].startswith("sha256:")
    assert first == second


def test_one_changed_weight_byte_changes_the_identity_and_its_part(tmp_path):
    weights = bytearray(b"\x00\x01\x02\x03" * 1000)
    before = record_of(make_folder(tmp_path / "a", bytes(weights)))
    weights[1234] ^= 1
    after = record_of(make_folder(tmp_path / "b", bytes(weights)))
    assert after["identity"] != before["identity"]
    assert after["parts"]["model.safetensors"] != before["parts"]["model.safetensors"]
    assert after["parts"]["tokenizer.json"] == before["parts"]["tokenizer.json"]


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}'),
        lambda root: (root / "backends" / "openvino" / "model.bin").write_bytes(b"compiled again"),
        lambda root: (root / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0}}}'),
        lambda root: (root / "1_Pooling" / "config.json").rename(root / "1_Pooling" / "other.json"),
    ],
    ids=["pooling module", "backend artifact", "tokenizer", "a file's name"],
)
def test_every_file_that_decides_an_answer_is_in_it(tmp_path, change):
    folder = make_folder(tmp_path / "a")
    before = record_of(folder)["identity"]
    change(folder)
    assert record_of(folder)["identity"] != before


def test_build_reports_and_options_that_do_not_change_values_are_left_out(tmp_path):
    folder = make_folder(tmp_path / "a")
    before = record_of(folder)["identity"]
    (folder / "backends" / "manifest.json").write_text('{"ranked": [{"ms": 9.75}]}')  # another ranking run's times
    (folder / "model_source.json").write_text('{"folder": "/somewhere/else"}')
    assert record_of(folder)["identity"] == before
    assert record_of(folder, {**OPTIONS, "max_inputs": 8, "threads": 2})["identity"] == before
    assert record_of(folder, {**OPTIONS, "precision": "bf16"})["identity"] != before


def test_files_are_hashed_in_chunks_as_a_whole(tmp_path):
    big = tmp_path / "weights.bin"
    content = bytes(range(256)) * (3 * identity.CHUNK // 256 + 7)  # several chunks and a partial one
    big.write_bytes(content)
    assert identity.file_digest(big) == hashlib.sha256(content).digest()


def test_a_worker_reads_the_recorded_identity_and_a_part_reads_its_parents(tmp_path):
    archive = make_folder(tmp_path / "archive")
    make_folder(archive / "embedder", b"embedder weights")
    record = record_of(archive)
    identity.write(archive, record)
    assert identity.of_folder(str(archive), OPTIONS)["identity"] == record["identity"]
    # the generator's embedder/ is served by its own handler on its own folder: its part of the archive's record
    assert identity.of_folder(str(archive / "embedder"), {})["identity"] == record["parts"]["embedder"]
    # an archive packaged before identities, as TorchServe extracts it: the same digest, computed at load
    old = tmp_path / "old"
    shutil.copytree(archive, old)
    (old / identity.IDENTITY_FILE).unlink()
    (old / "MAR-INF").mkdir()
    manifest = {"model": {"modelName": "m", "handler": "embeddings.py", "configFile": "model-config.yaml"}}
    (old / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    (old / "embeddings.py").write_text("class Handler: ...\n")
    (old / "model-config.yaml").write_text("batchSize: 8\n")
    (old / "handlers").mkdir()
    (old / "handlers" / "__init__.py").write_text("")
    packed = identity.compute([(child, child.name) for child in archive.iterdir()], OPTIONS, code=old / "handlers")
    assert identity.of_folder(str(old), OPTIONS)["identity"] == packed["identity"]


def test_the_handler_code_is_part_of_the_identity(tmp_path):
    """A handler change that may alter answers must not serve what an older handler put in the shared cache."""
    folder = make_folder(tmp_path / "model")
    code = tmp_path / "handlers"
    code.mkdir()
    (code / "engine.py").write_text("SCALE = 1.0\n")
    before = identity.compute([(child, child.name) for child in folder.iterdir()], OPTIONS, code=code)
    again = identity.compute([(child, child.name) for child in folder.iterdir()], OPTIONS, code=code)
    assert before == again and before["parts"][identity.CODE_PART].startswith("sha256:")
    (code / "engine.py").write_text("SCALE = 2.0\n")
    after = identity.compute([(child, child.name) for child in folder.iterdir()], OPTIONS, code=code)
    assert after["identity"] != before["identity"]
    assert {k: v for k, v in after["parts"].items() if k != identity.CODE_PART} == {
        k: v for k, v in before["parts"].items() if k != identity.CODE_PART
    }
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "engine.cpython-311.pyc").write_bytes(b"compiled")
    cached = identity.compute([(c, c.name) for c in folder.iterdir()], OPTIONS, code=code)
    assert cached["identity"] == after["identity"]


def test_cache_keys_differ_by_identity():
    one, other = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    assert cache_key("text", "1.0", "fp32", 256, identity=one) != cache_key("text", "1.0", "fp32", 256, identity=other)
    assert cache_key("text", "1.0", "fp32", 256, identity=one) == cache_key("text", "1.0", "fp32", 256, identity=one)
    tokens = list(range(32))
    kv = [(torch.zeros(1, 32, 2), torch.zeros(1, 32, 2))]
    cache = PrefixCache(1 << 20, 8, identity=one)
    cache.store(tokens, 0, kv)
    assert cache.lookup(tokens + [99]).length == 32
    assert PrefixCache(1 << 20, 8, identity=other).chain(tokens, 4) != cache.chain(tokens, 4)
