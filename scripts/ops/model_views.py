"""Management-API answers turned into what `modelctl` shows: plain dicts for --json and lines for people.

Pure functions of the descriptions (plus a local RSS reading for workers on this machine), so the formatting can be
read and tested without a server.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlparse

from scripts.ops.management import Description, ready_workers

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def local_rss(pid: int | None, management_url: str) -> int | None:
    """Resident memory of a worker on this machine (TorchServe reports memoryUsage 0 between metric collections)."""
    if urlparse(management_url).hostname not in LOCAL_HOSTS or not pid:
        return None
    try:
        import psutil

        process = psutil.Process(int(pid))
        if not any("model_service_worker" in part for part in process.cmdline()):
            return None
        return process.memory_info().rss
    except Exception:  # gone, not ours, no permission: no number rather than a wrong one
        return None


def mib(size: float) -> str:
    return f"{size / 2**20:.1f} MiB"


def version_row(description: Description) -> dict[str, Any]:
    """One version in `modelctl list`."""
    return {
        "version": description["modelVersion"],
        "archive": description.get("modelUrl"),
        "ready_workers": len(ready_workers(description)),
        "min_workers": description.get("minWorkers"),
        "max_workers": description.get("maxWorkers"),
    }


def list_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table of `modelctl list`: one line per version, the default marked."""
    lines = [f"{'MODEL':16} {'VERSION':10} {'DEFAULT':8} {'WORKERS':12} ARCHIVE"]
    for row in rows:
        for v in row["versions"]:
            workers = f"{v['ready_workers']} READY/{v['min_workers']}-{v['max_workers']}"
            lines.append(
                f"{row['model']:16} {v['version']:10} "
                f"{'*' if v['version'] == row['default_version'] else '':8} {workers:12} {v['archive']}"
            )
    if not rows:
        lines.append("(no models registered)")
    return lines


def worker_view(worker: dict[str, Any], management_url: str) -> dict[str, Any]:
    reported = worker.get("memoryUsage") or 0
    measured = None if reported else local_rss(worker.get("pid"), management_url)
    return {
        "id": worker.get("id"),
        "status": worker.get("status"),
        "pid": worker.get("pid"),
        "memory_bytes": reported or measured,
        "memory_source": "server" if reported else ("local rss" if measured else None),
        "started": worker.get("startTime"),
        "gpu": worker.get("gpu"),
    }


def parsed_metadata(metadata: Any) -> Any:
    """customizedMetadata as data: TorchServe passes the handler's describe on as a JSON string."""
    if isinstance(metadata, str):
        try:
            return json.loads(metadata)
        except ValueError:
            return metadata
    return metadata


def version_view(
    description: Description, default: str, management_url: str, customized: bool = False
) -> dict[str, Any]:
    """One version in `modelctl describe`."""
    view = {
        "model": description["modelName"],
        "version": description["modelVersion"],
        "default": description["modelVersion"] == default,
        "archive": description.get("modelUrl"),
        "min_workers": description.get("minWorkers"),
        "max_workers": description.get("maxWorkers"),
        "ready_workers": len(ready_workers(description)),
        "workers": [worker_view(w, management_url) for w in description.get("workers", [])],
        "batch": {k: description.get(k) for k in ("batchSize", "maxBatchDelay", "responseTimeout", "startupTimeout")},
        "queue": description.get("jobQueueStatus", {}),
    }
    if customized:
        view["customized"] = parsed_metadata(description.get("customizedMetadata"))
    return view


def as_text(value: Any) -> str:
    """A value for a line of text: a string as it is, anything else as JSON (null, true, {"a": 1}: never a Python
    repr such as None or {'a': 1})."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def describe_lines(view: dict[str, Any]) -> list[str]:
    """The text of one version in `modelctl describe`."""
    lines = [
        f"{view['model']} {view['version']}{' (default)' if view['default'] else ''}   archive {view['archive']}",
        f"  workers   {view['ready_workers']} READY, min {view['min_workers']} / max {view['max_workers']}",
    ]
    for w in view["workers"]:
        memory = f"{mib(w['memory_bytes'])} ({w['memory_source']})" if w["memory_bytes"] else "memory n/a"
        lines.append(f"    {w['id']:>6}  {w['status']:9} pid {w['pid']:<8} {memory:26} started {w['started']}")
    b, q = view["batch"], view["queue"]
    lines.append(
        f"  batching  batchSize {b['batchSize']}, maxBatchDelay {b['maxBatchDelay']} ms, "
        f"responseTimeout {b['responseTimeout']} s, startupTimeout {b['startupTimeout']} s"
    )
    lines.append(f"  queue     {q.get('pendingRequests', '?')} pending, {q.get('remainingCapacity', '?')} free slots")
    if "customized" in view:
        handler = view["customized"]
        if isinstance(handler, dict):
            lines.append("  handler   " + ", ".join(f"{k} {as_text(v)}" for k, v in handler.items()))
        else:
            lines.append(f"  handler   {as_text(handler)}")
    return lines
