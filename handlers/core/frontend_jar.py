"""The installed TorchServe frontend (``ts/frontend/model-server.jar``) and the fixes this project patched into it.

``scripts/frontend_fixes`` patches the jar and writes :data:`MARKER` into it, listing the calls it redirected; a
worker reads the same marker (:func:`installed_fixes`) to know what the frontend it runs under can take (e.g. a
per-step call's stream pieces, handlers/generation/streaming.py)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

MARKER = "META-INF/serving-fixes.json"


def installed_jar() -> Path:
    """The installed torchserve wheel's frontend jar (ImportError without torchserve)."""
    import ts

    return Path(ts.__file__).resolve().parent / "frontend" / "model-server.jar"


def marker(jar: Path) -> dict[str, Any] | None:
    """The fixes marker of ``jar`` (None: not patched)."""
    with zipfile.ZipFile(jar) as archive:
        if MARKER not in archive.namelist():
            return None
        return json.loads(archive.read(MARKER))


def installed_fixes() -> list[str]:
    """The fixes the installed frontend lists ([]: no torchserve, no jar, an unreadable jar, or not patched)."""
    try:
        found = marker(installed_jar())
    except (ImportError, OSError, ValueError, zipfile.BadZipFile):
        return []
    return list((found or {}).get("fixes", []))
