"""Model folders for in-process handler tests, made in seconds without built archives (no `make mar`, no server).

`prepared_model_dir(name)` runs the model spec's own prepare step (models/<name>/model.yaml) into a temporary build
folder and adds the spec's model-config.yaml: for the classifier (deterministic training, ~5 s) and the generator (the
seeded random demo GPT-2, ~5 s) that is the same model folder the archive holds, so a test reads the same numbers.
`tiny_minilm_dir` is minilm's folder with a 1-layer 32-wide encoder of seeded random weights (tiny_minilm.py): the
real tokenizer, limits and file layout, but loaded and warmed up in a fraction of a second. Tests that compare with
the real MiniLM's numbers (accuracy gates, parity with sentence-transformers on the real weights) keep the archive.

tests/conftest.py registers this module as a plugin, so every test can ask for these fixtures by name; none of them is
in its SLOW_FIXTURES, so a test that uses only these runs in `make test-fast`.
"""

import shutil
import sys

import pytest

from scripts import package

# minilm's compiled backends are built for the real weights (the tiny stand-in replaces them) and take minutes to
# build and rank: the staged folder leaves them out.
STAGING_VARS = {"minilm": {"backends": "none"}, "generator": {"decode_rank_seconds": "3"}}


def stage_model_dir(name, target):
    """The model folder NAME's archive gives a worker, minus the handler code: prepare outputs + model-config.yaml."""
    spec = package.load_spec(name)
    build_dir = target / "build"
    values = {str(k): str(v) for k, v in ({**(spec.get("vars") or {}), **STAGING_VARS.get(name, {})}).items()}
    values.update(python=sys.executable, build=build_dir, repo=package.REPO, version=str(spec["version"]))
    package.run_prepare(spec, build_dir, values, force=True, log=lambda *_: None)
    model_dir = target / "model"
    model_dir.mkdir(parents=True)
    for source, name_in_archive in package.archive_entries(spec, build_dir):
        destination = model_dir / name_in_archive
        shutil.copytree(source, destination) if source.is_dir() else shutil.copy2(source, destination)
    shutil.copy2(spec["dir"] / spec["config"], model_dir / "model-config.yaml")
    shutil.rmtree(build_dir)
    return model_dir


@pytest.fixture(scope="session")
def prepared_model_dir(tmp_path_factory):
    """prepared_model_dir("classifier") -> a model folder built by the spec's prepare step (once per session)."""
    cache = {}

    def prepare(name):
        if name not in cache:
            cache[name] = stage_model_dir(name, tmp_path_factory.mktemp(f"prepared-{name}"))
        return cache[name]

    return prepare


@pytest.fixture(scope="session")
def tiny_minilm_dir(prepared_model_dir, tmp_path_factory):
    """minilm's model folder with a 1-layer 32-wide random encoder in place of the 6-layer MiniLM weights."""
    from tests.unit.tiny_minilm import make_tiny_model_dir

    return make_tiny_model_dir(prepared_model_dir("minilm"), tmp_path_factory.mktemp("tiny-minilm"))
