"""Archive variants for the tuner: a copy of a .mar with keys of its model-config.yaml changed (workers, batching,
the handler's threads), so every worker count runs with threads set deliberately (cores // workers) rather than
N workers x all cores of torch threads (oversubscribed CPUs collapse throughput)."""

import json
import zipfile
from pathlib import Path

import yaml

from scripts.ops.machine import cores


def threads_for(workers, available=None):
    """torch threads per worker so that all workers together use each core once."""
    return max(1, (available or cores()) // max(1, workers))


def variant_archive(source, destination, config_overrides, handler_overrides):
    """Copy a .mar, changing keys of its model-config.yaml (top level and ``handler:``); returns the new config."""
    with zipfile.ZipFile(source) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
        config_name = manifest["model"].get("configFile")
        if not config_name:
            raise RuntimeError(f"{source} has no model-config.yaml (MANIFEST configFile); cannot set threads")
        config = yaml.safe_load(archive.read(config_name)) or {}
        config.update(config_overrides)
        config["handler"] = {**(config.get("handler") or {}), **handler_overrides}
        Path(destination).parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_STORED) as variant:
            for item in archive.infolist():
                data = archive.read(item.filename)
                if item.filename == config_name:
                    data = yaml.safe_dump(config, sort_keys=False).encode()
                variant.writestr(item, data)
    return config
