"""The packaging step (scripts/package.py): incremental builds, --force, model-config.yaml validation, and builds that
cannot harm: a model folder at $TMPDIR/<name> left intact, links out of a model folder refused, archives replaced
whole and one build of a name at a time.

Each test builds a small throw-away model spec (an entry module whose options take every precision, a tiny extra file,
no prepare step) into a temporary model store, so model_store/ and the real specs are never touched.
"""

import json
import shutil
import tempfile
import threading
import zipfile
from pathlib import Path

import pytest
import yaml

from handlers.core import identity
from scripts import package

REPO = Path(package.__file__).resolve().parent.parent
VALID_CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 16,
    "maxBatchDelay": 5,
    "responseTimeout": 30,
    "startupTimeout": 120,
    "handler": {"precision": "fp32", "backend": "eager", "threads": 1},
}


@pytest.fixture
def spec(monkeypatch):
    """A models/ folder with one spec `unitpkg`, inside the repository's ignored build/ (paths are shown relative
    to the repository), and an empty store; returns a small object to edit them."""
    build_root = REPO / "build"
    build_root.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="test-package-", dir=build_root))
    model_dir = root / "models" / "unitpkg"
    model_dir.mkdir(parents=True)
    (model_dir / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "unitpkg",
                "version": "1.0",
                "handler": "handlers/embeddings.py",
                "config": "model-config.yaml",
                "files": ["notes.txt"],
            }
        )
    )
    (model_dir / "notes.txt").write_text("weights would go here\n")
    monkeypatch.setattr(package, "MODELS_DIR", root / "models")

    class Spec:
        dir = model_dir
        store = root / "store"

        def write_config(self, config):
            (model_dir / "model-config.yaml").write_text(yaml.safe_dump(config))

        def manifest(self):
            return json.loads((self.store / "manifest.json").read_text())

        def archive(self):
            return self.store / "unitpkg.mar"

    made = Spec()
    made.write_config(VALID_CONFIG)
    yield made
    shutil.rmtree(root, ignore_errors=True)


def build(spec, **kwargs):
    return package.build("unitpkg", spec.store, log=lambda *_: None, **kwargs)


def test_unchanged_inputs_are_not_rebuilt(spec):
    first = build(spec)
    assert first["rebuilt"] and spec.archive().is_file()
    mtime = spec.archive().stat().st_mtime_ns
    recorded = spec.manifest()["unitpkg.mar"]
    assert recorded["input_hash"] == first["input_hash"] and recorded["version"] == "1.0"

    second = build(spec)
    assert not second["rebuilt"]
    assert spec.archive().stat().st_mtime_ns == mtime
    assert spec.manifest()["unitpkg.mar"] == recorded


def test_changed_config_rebuilds(spec):
    first = build(spec)
    spec.write_config({**VALID_CONFIG, "batchSize": 8})
    second = build(spec)
    assert second["rebuilt"]
    assert second["input_hash"] != first["input_hash"]
    assert spec.manifest()["unitpkg.mar"]["batchSize"] == 8


def test_changed_packed_file_rebuilds(spec):
    first = build(spec)
    (spec.dir / "notes.txt").write_text("retrained weights\n")
    second = build(spec)
    assert second["rebuilt"] and second["input_hash"] != first["input_hash"]


def test_force_rebuilds_unchanged_inputs(spec):
    first = build(spec)
    forced = build(spec, force=True)
    assert forced["rebuilt"]
    assert forced["input_hash"] == first["input_hash"]
    assert spec.manifest()["unitpkg.mar"]["built_at"] == forced["built_at"]


def test_dependency_pins_are_part_of_the_input_hash(spec, monkeypatch):
    hashed = []
    real_digest = package.digest

    def recording_digest(paths, extra=""):
        hashed.extend(paths)
        return real_digest(paths, extra)

    monkeypatch.setattr(package, "digest", recording_digest)
    build(spec)
    assert REPO / "requirements.txt" in hashed


def test_other_version_goes_to_its_own_archive(spec):
    build(spec)
    other = build(spec, version="2.0")
    assert other["archive"] == "unitpkg-2.0.mar" and (spec.store / "unitpkg-2.0.mar").is_file()
    assert spec.manifest()["unitpkg-2.0.mar"]["version"] == "2.0"
    assert not build(spec)["rebuilt"]  # the 1.0 archive is still up to date


def test_cli_builds_then_reports_up_to_date(spec, capsys):
    assert package.main(["unitpkg", "--store", str(spec.store)]) == 0
    assert "building unitpkg.mar" in capsys.readouterr().out
    assert package.main(["unitpkg", "--store", str(spec.store)]) == 0
    assert "unitpkg.mar up to date" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, named",
    [
        ({"batchsize": 16}, "batchsize"),  # unknown (misspelt) TorchServe key
        ({"batchSize": "16"}, "batchSize"),  # wrong type
        ({"responseTimeout": True}, "responseTimeout"),  # a bool is not an int
        ({"startupTimeout": 5}, "startupTimeout"),  # too short for load and warm-up
        ({"handler": {**VALID_CONFIG["handler"], "precison": "fp32"}}, "precison"),  # unknown handler option
        ({"handler": {**VALID_CONFIG["handler"], "threads": "two"}}, "handler.threads"),
        ({"minWorkers": 3}, "minWorkers"),  # more than maxWorkers
    ],
)
def test_invalid_model_config_fails_naming_the_key(spec, capsys, change, named):
    spec.write_config({**VALID_CONFIG, **change})
    assert package.main(["unitpkg", "--store", str(spec.store)]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "model-config.yaml" in error and named in error
    assert not spec.archive().exists()


def test_missing_required_key_fails(spec, capsys):
    spec.write_config({k: v for k, v in VALID_CONFIG.items() if k != "maxBatchDelay"})
    assert package.main(["unitpkg", "--store", str(spec.store)]) == 1
    assert "maxBatchDelay" in capsys.readouterr().err


def test_unknown_model_fails_listing_known_ones(spec, capsys):
    assert package.main(["nosuchmodel", "--store", str(spec.store)]) == 1
    error = capsys.readouterr().err
    assert "nosuchmodel" in error and "unitpkg" in error


def test_undeclared_var_is_refused(spec, capsys):
    # A typo (--var sed=1) must not quietly build a "retrained" archive identical to the current one.
    assert package.main(["unitpkg", "--store", str(spec.store), "--version", "2.0", "--var", "sed=1"]) == 1
    error = capsys.readouterr().err
    assert "sed" in error and "vars:" in error
    assert not (spec.store / "unitpkg-2.0.mar").exists()


def test_manifest_keeps_entries_written_by_a_concurrent_build(spec):
    build(spec)
    # Another build finishes while this one runs: its entry lands between our read and our write.
    real_make_archive = package.make_archive

    def make_archive_while_another_build_finishes(*args, **kwargs):
        package.update_manifest(spec.store, "other.mar", {"model": "other", "version": "1.0"})
        return real_make_archive(*args, **kwargs)

    package.make_archive = make_archive_while_another_build_finishes
    try:
        build(spec, force=True)
    finally:
        package.make_archive = real_make_archive
    assert set(spec.manifest()) == {"unitpkg.mar", "other.mar"}
    assert not list(spec.store.glob(".manifest.json.*.tmp"))


def test_the_archive_holds_the_handlers_subpackages_and_a_change_in_one_rebuilds(spec, monkeypatch):
    import zipfile

    handlers_copy = spec.dir.parent.parent / "handlers"
    shutil.copytree(package.HANDLERS_DIR, handlers_copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(package, "HANDLERS_DIR", handlers_copy)
    first = build(spec)
    with zipfile.ZipFile(spec.archive()) as archive:
        names = set(archive.namelist())
    for module in (
        "handlers/core/base.py",
        "handlers/text/batch.py",
        "handlers/generation/decoding.py",
        "handlers/network/engine.py",
        "embeddings.py",
    ):
        assert module in names, module
    nested = handlers_copy / "text" / "requests" / "embedding.py"
    nested.write_text(nested.read_text() + "# a change deep in a subpackage\n")
    second = build(spec)
    assert second["rebuilt"] and second["input_hash"] != first["input_hash"]


def test_metrics_yaml_is_generated_from_the_handlers_declarations():
    from handlers.core.metrics import MODEL_METRICS, dimension_names

    assert package.METRICS_CONFIG.read_text() == package.render_metrics_config(), (
        "config/metrics.yaml is out of step with handlers/core/metrics.py: run python -m scripts.package --metrics"
    )
    declared = yaml.safe_load(package.METRICS_CONFIG.read_text())["model_metrics"]
    for name, metric in MODEL_METRICS.items():
        [entry] = [e for e in declared[metric.kind] if e["name"] == name]
        assert entry["dimensions"] == dimension_names(name) and entry["unit"] == metric.unit
        # TorchServe's histograms have fixed buckets (0.005 .. 10): only times fit them, in seconds (5 ms .. 10 s) or,
        # for sub-millisecond round trips, in milliseconds (5 us .. 10 ms).
        assert metric.kind != "histogram" or metric.unit in ("s", "ms"), name


PER_KIND = {
    "native-bf16": {"minWorkers": 3, "maxWorkers": 3, "batchSize": 16},
    "avx2": {"minWorkers": 2, "maxWorkers": 2, "batchSize": 4},
}


def packed_model_config(archive):
    import zipfile

    with zipfile.ZipFile(archive) as mar:
        return yaml.safe_load(mar.read("model-config.yaml"))


@pytest.mark.parametrize("kind", ["native-bf16", "avx2", "other"])
def test_per_cpu_kind_values_are_packed_for_the_kind_built_for(spec, kind):
    spec.write_config({**VALID_CONFIG, "per_cpu_kind": PER_KIND})
    entry = build(spec, cpu_kind=kind)
    packed = packed_model_config(spec.archive())
    expected = {**VALID_CONFIG, **PER_KIND.get(kind, {})}
    assert "per_cpu_kind" not in packed
    assert {key: packed[key] for key in expected} == expected
    assert entry["cpu_kind"] == kind and spec.manifest()["unitpkg.mar"]["batchSize"] == expected["batchSize"]


def test_another_cpu_kind_rebuilds(spec):
    spec.write_config({**VALID_CONFIG, "per_cpu_kind": PER_KIND})
    first = build(spec, cpu_kind="avx2")
    again = build(spec, cpu_kind="avx2")
    other = build(spec, cpu_kind="native-bf16")
    assert not again["rebuilt"] and other["rebuilt"] and other["input_hash"] != first["input_hash"]


@pytest.mark.parametrize(
    "per_kind, named",
    [
        ({"avx512": {"batchSize": 8}}, "unknown CPU kind"),
        ({"avx2": {"handler": {"threads": 2}}}, "per_cpu_kind.avx2"),
        ({"avx2": {"batchSize": "many"}}, "batchSize"),
        ({"avx2": {"minWorkers": 4}}, "minWorkers"),  # above the base maxWorkers 1
        ({"avx2": {"lotsOfWorkers": 4}}, "lotsOfWorkers"),
    ],
)
def test_bad_per_cpu_kind_is_refused_naming_it(spec, per_kind, named):
    spec.write_config({**VALID_CONFIG, "per_cpu_kind": per_kind})
    with pytest.raises(package.PackagingError, match=named):
        build(spec, cpu_kind="native-bf16")


@pytest.fixture
def folder_spec(spec):
    """The spec packing a model folder named by --var model_dir, which its prepare step copies (as the text-model
    templates do); built with model_name="unitpkg" (the user's own name, as `make package NAME=` does)."""
    copy = "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)"
    described = yaml.safe_load((spec.dir / "model.yaml").read_text())
    described.update(
        vars={"model_dir": ""},
        prepare={"command": ["{python}", "-c", copy, "{model_dir}", "{build}/model"], "inputs": ["{model_dir}"]},
        files=["model/"],
    )
    (spec.dir / "model.yaml").write_text(yaml.safe_dump(described))
    yield spec
    shutil.rmtree(REPO / "build" / "unitpkg", ignore_errors=True)


def build_folder(spec, folder, **kwargs):
    return build(spec, variables={"model_dir": str(folder)}, model_name="unitpkg", **kwargs)


def archive_names(path):
    with zipfile.ZipFile(path) as archive:
        return set(archive.namelist())


def test_a_model_folder_at_tmpdir_slash_its_name_is_left_intact(folder_spec, tmp_path, monkeypatch):
    # `unzip model.zip -d /tmp/my-model; make package NAME=my-model MODEL_DIR=/tmp/my-model`: torch-model-archiver
    # stages in $TMPDIR/<model name> and deletes it, so it must not see the user's TMPDIR.
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads $TMPDIR again
    folder = temp / "unitpkg"
    folder.mkdir()
    (folder / "weights.txt").write_text("the user's only copy\n")
    assert build_folder(folder_spec, folder)["rebuilt"]
    assert (folder / "weights.txt").read_text() == "the user's only copy\n"
    assert "weights.txt" in archive_names(folder_spec.archive())


def test_a_link_out_of_the_model_folder_is_refused_naming_it(folder_spec, tmp_path, capsys):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "weights.txt").write_text("weights\n")
    secret = tmp_path / "id_rsa"
    secret.write_text("not for an archive\n")
    (folder / "tokenizer.json").symlink_to(secret)
    argv = ["unitpkg", "--name", "unitpkg", "--var", f"model_dir={folder}", "--store", str(folder_spec.store)]
    assert package.main(argv) == 1
    error = capsys.readouterr().err
    assert str(folder / "tokenizer.json") in error and str(secret) in error
    assert "outside the model folder" in error and "cp --dereference" in error
    assert not list(folder_spec.store.glob("*.mar"))
    assert not (REPO / "build" / "unitpkg" / "model").exists()  # not even staged


def test_links_inside_the_folder_and_a_hub_snapshots_blobs_are_packed(folder_spec, tmp_path):
    # A hub download: models--org--name/snapshots/<revision>/config.json -> ../../blobs/<hash>.
    download = tmp_path / "models--org--name"
    (download / "blobs").mkdir(parents=True)
    (download / "blobs" / "0123abcd").write_text("{}\n")
    folder = download / "snapshots" / "f00d"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").symlink_to("../../blobs/0123abcd")
    (folder / "sub" / "weights.txt").write_text("weights\n")
    (folder / "weights.txt").symlink_to("sub/weights.txt")
    build_folder(folder_spec, folder)
    assert {"config.json", "weights.txt", "sub/weights.txt"} <= archive_names(folder_spec.archive())


def test_a_failed_build_leaves_the_previous_archive_as_it_was(spec, monkeypatch):
    build(spec)
    before = spec.archive().read_bytes()
    real_run_archiver = package.run_archiver

    def archiver_killed_midway(model_name, version, handler, extra_files, config, export_path):
        real_run_archiver(model_name, version, handler, extra_files, config, export_path)
        mar = Path(export_path) / f"{model_name}.mar"
        mar.write_bytes(mar.read_bytes()[:100])  # half written
        raise package.PackagingError(f"{model_name}: torch-model-archiver failed: killed")

    monkeypatch.setattr(package, "run_archiver", archiver_killed_midway)
    (spec.dir / "notes.txt").write_text("retrained weights\n")
    with pytest.raises(package.PackagingError, match="killed"):
        build(spec)
    assert spec.archive().read_bytes() == before
    # Nothing half-built is left in the store (the hidden folder it was written in is gone) ...
    assert not list(spec.store.glob(f"{package.BUILDING}*"))
    assert [path.name for path in spec.store.glob("*.mar")] == ["unitpkg.mar"]
    # ... and a folder a killed build (SIGKILL: no clean-up ran) left is removed by the next build of that name.
    (spec.store / f"{package.BUILDING}unitpkg.mar-killed").mkdir()
    monkeypatch.setattr(package, "run_archiver", real_run_archiver)
    assert build(spec)["rebuilt"] and spec.archive().read_bytes() != before
    assert not list(spec.store.glob(f"{package.BUILDING}*"))


def test_two_builds_of_one_archive_run_one_after_the_other(spec, monkeypatch):
    build(spec)
    real_run_archiver = package.run_archiver
    events = []
    first_inside, release_first = threading.Event(), threading.Event()

    def recording_archiver(*args):
        events.append(f"{threading.current_thread().name} starts")
        if threading.current_thread().name == "first":
            first_inside.set()
            release_first.wait(60)
        real_run_archiver(*args)
        events.append(f"{threading.current_thread().name} ends")

    monkeypatch.setattr(package, "run_archiver", recording_archiver)
    results = {}

    def run(name):
        results[name] = build(spec, force=True)

    first = threading.Thread(target=run, args=("first",), name="first")
    first.start()
    assert first_inside.wait(60)
    second = threading.Thread(target=run, args=("second",), name="second")
    second.start()
    second.join(2)  # it waits for the lock, not for this: without the lock it would be in the archiver by now
    assert events == ["first starts"]
    release_first.set()
    first.join(120)
    second.join(120)
    assert events == ["first starts", "first ends", "second starts", "second ends"]
    assert results["first"]["rebuilt"] and results["second"]["rebuilt"]
    assert zipfile.is_zipfile(spec.archive())


def packed_identity(spec):
    with zipfile.ZipFile(spec.archive()) as archive:
        return json.loads(archive.read("identity.json"))


def test_the_archive_records_its_content_identity_deterministically(spec):
    first = build(spec)
    recorded = packed_identity(spec)
    assert recorded["identity"].startswith("sha256:") and recorded["identity"] == first["identity"]
    # the model's files and the handler code packed with them, not the config
    assert set(recorded["parts"]) == {"notes.txt", identity.CODE_PART}
    assert recorded["parts"][identity.CODE_PART] == identity.entry_digest(package.HANDLERS_DIR, identity.CODE_PART)
    assert spec.manifest()["unitpkg.mar"]["identity"] == first["identity"]
    # packaged again from the same content: the same identity (replicas and re-packages share cache entries)
    assert build(spec, force=True)["identity"] == first["identity"]
    # a config change that does not change values (batching) keeps it; one that does (precision) does not
    spec.write_config({**VALID_CONFIG, "batchSize": 8})
    assert build(spec)["identity"] == first["identity"]
    spec.write_config({**VALID_CONFIG, "handler": {**VALID_CONFIG["handler"], "precision": "bf16"}})
    assert build(spec)["identity"] != first["identity"]


def test_retrained_weights_under_the_same_name_and_version_get_another_identity(spec):
    first = build(spec)
    (spec.dir / "notes.txt").write_text("weights would go here!\n")
    second = build(spec)
    assert second["version"] == first["version"] and second["identity"] != first["identity"]
    assert packed_identity(spec)["identity"] == second["identity"]
