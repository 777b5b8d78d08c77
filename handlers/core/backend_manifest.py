"""The compiled-backend manifest an archive carries (``backends/manifest.json``, written by scripts/build_backends.py
for every family that builds backends: text, image, network): where it lies, its format, and reading it at load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BACKENDS_DIR = "backends"
MANIFEST = f"{BACKENDS_DIR}/manifest.json"
MANIFEST_FORMAT = 1


def read_manifest(model_dir: str | Path) -> tuple[dict[str, Any] | None, str]:
    """(the archive's backends/manifest.json, "") or (None, why there is none usable)."""
    path = Path(model_dir) / MANIFEST
    if not path.is_file():
        return None, f"the archive has no {MANIFEST}"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return None, f"{MANIFEST} is unreadable ({error})"
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None, f"{MANIFEST} is not format {MANIFEST_FORMAT}"
    candidates = manifest.get("candidates")
    if not isinstance(candidates, list) or not all(
        isinstance(c, dict) and isinstance(c.get("backend"), str) and isinstance(c.get("precision"), str)
        for c in candidates
    ):
        return None, f"{MANIFEST}: candidates must be a list of {{backend, precision, ...}}"
    return manifest, ""
