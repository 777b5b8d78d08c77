"""A model's identity: one content digest of everything in its archive that decides an answer.

Why: a cache key that names a model by name and version keeps serving the vectors of the model that was packaged
under that name before (re-packaging ``my-model`` 1.0 from retrained weights left the old vectors in the shared
tier). The identity is computed once, at package time (scripts/package.py), over the model's own files as they go
into the archive (weights, tokenizer, configs, sentence-transformers module folders, compiled backend artifacts,
calibration, the generator's embedder/ and verifier/), the project's handler code packed with it (the
``handlers`` package: a code change that alters answers must not serve entries an older handler cached) and the
handler options that change values (precision, backend), and recorded in ``identity.json`` at the archive's root.
Every worker reads it at load, shows it in describe and in each answer's ``X-Model-Identity`` header, and puts it in
every cache key.

Deterministic: names and contents only, sorted (no times, no absolute paths), so the same content packaged twice, on
two replicas or under another name, has the same identity and shares cache entries; changing one byte of a weight
changes it. Reports written beside the model that hold times or the folder's path (``model_source.json``, the backend
ranking's ``backends/manifest.json``) are left out: they describe a build, not what the model computes. Files are
hashed in 1 MiB chunks (weights can be hundreds of MB).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

IDENTITY_FILE = "identity.json"
HEADER = "X-Model-Identity"
FORMAT = 2  # 2: the handler code is part of the identity
PREFIX = "sha256:"
# Handler options that change the numbers a model answers (the rest bound requests or size caches).
VALUE_OPTIONS = ("precision", "backend")
# Never part of the model's content: what TorchServe and the packager put beside the model in every archive (the
# handler code counts as its own part, ``CODE_PART``).
NOT_CONTENT = frozenset({IDENTITY_FILE, "handlers", "MAR-INF", "model-config.yaml", "__pycache__"})
CODE_PART = "handlers"
CHUNK = 1 << 20


def is_report(relative: tuple[str, ...]) -> bool:
    """A build report (times, source paths), not model content: see the module docstring."""
    return relative[-1] == "model_source.json" or relative[-2:] == ("backends", "manifest.json")


def file_digest(path: Path) -> bytes:
    hasher = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            hasher.update(chunk)
    return hasher.digest()


def entry_digest(path: Path, name: str | None = None) -> str:
    """The digest of one archive entry (``name``: where it lies in the archive, default its own name): a file's
    content, or a folder's relative names and contents (sorted)."""
    hasher = hashlib.sha256()
    if path.is_dir():
        files = sorted(
            (tuple(file.relative_to(path).parts), file)
            for file in path.rglob("*")
            if file.is_file() and "__pycache__" not in file.parts
        )
        for relative, file in files:
            if is_report((name or path.name, *relative)):
                continue
            encoded = "/".join(relative).encode()
            hasher.update(len(encoded).to_bytes(4, "little") + encoded + file_digest(file))
    else:
        hasher.update(b"file\0" + file_digest(path))
    return PREFIX + hasher.hexdigest()


def combine(parts: Mapping[str, str], options: Mapping[str, Any]) -> str:
    """One identity from the entries' digests and the value-changing options (canonical JSON: order-free)."""
    text = json.dumps({"format": FORMAT, "parts": dict(parts), "options": dict(options)}, sort_keys=True)
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()


def value_options(handler_config: Mapping[str, Any] | None) -> dict[str, Any]:
    config = handler_config or {}
    return {name: config[name] for name in VALUE_OPTIONS if name in config}


def compute(
    entries: Iterable[tuple[Path, str]], handler_config: Mapping[str, Any] | None, code: Path | None = None
) -> dict[str, Any]:
    """The identity record of an archive: ``entries`` are (source path, name at the archive's root) as packed,
    ``handler_config`` the packed ``handler:`` section, ``code`` the handlers package packed with it. ``parts`` keeps
    each entry's own digest, so a part served on its own (the generator's embedder/) has an identity too."""
    parts = {
        name: entry_digest(Path(source), name)
        for source, name in sorted(entries, key=lambda pair: pair[1])
        if name not in NOT_CONTENT and not is_report((name,))
    }
    if code is not None and Path(code).is_dir():
        parts[CODE_PART] = entry_digest(Path(code), CODE_PART)
    options = value_options(handler_config)
    return {"format": FORMAT, "identity": combine(parts, options), "options": options, "parts": parts}


def write(folder: Path, record: Mapping[str, Any]) -> Path:
    path = Path(folder) / IDENTITY_FILE
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def of_folder(model_dir: str, handler_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The identity record a worker serves with, from the first of:

    - the archive's ``identity.json`` in ``model_dir``;
    - the part recorded for this folder in its parent's ``identity.json`` (the generator's embedder/ and verifier/,
      each served by a stand-in handler on its own folder);
    - the same digest computed now over the folder: an archive packaged before identities existed, or a folder
      loaded directly as the unit tests do (what the packager would have recorded, at the cost of reading the files
      once)."""
    root = Path(model_dir)
    record = read_record(root / IDENTITY_FILE)
    if record is not None:
        return record
    parent = read_record(root.parent / IDENTITY_FILE)
    part = (parent or {}).get("parts", {}).get(root.name)
    if isinstance(part, str) and part.startswith(PREFIX):
        return {"format": FORMAT, "identity": part, "options": {}, "parts": {}}
    packed_alongside = archiver_entries(root)
    children = ((child, child.name) for child in root.iterdir() if child.name not in packed_alongside)
    return compute(children, handler_config, code=root / CODE_PART)


def archiver_entries(root: Path) -> set[str]:
    """What torch-model-archiver put at an extracted archive's root besides the model: the handler's entry module
    and the config file its manifest names (the model's own files are what the packager hashes)."""
    path = root / "MAR-INF" / "MANIFEST.json"
    if not path.is_file():
        return set()
    model = json.loads(path.read_text()).get("model") or {}
    return {str(model[key]) for key in ("handler", "configFile") if model.get(key)}


def read_record(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if isinstance(record, dict) and str(record.get("identity", "")).startswith(PREFIX):
        return record
    return None
