"""Readiness check for a TorchServe: ready when every registered model's default version has its workers up.

TorchServe 0.12's /ping answers 200 "Healthy" as soon as the frontend listens, while workers are still loading and
even when a model's workers cannot load at all (seen), so it cannot gate traffic. This asks the management API
instead (through scripts/ops/management.py, which the image carries beside it). It runs as a Kubernetes exec probe
inside the image (deploy/Dockerfile) and on a production host (it reads the management token from TorchServe's key
file when there is one).

    python -m scripts.ready_probe [--management-url http://127.0.0.1:8081] [--key-file key_file.json]

Exit codes: 0 ready; 1 not ready (one line says why: unreachable, no models, a model short of READY workers);
2 bad arguments.
"""

import argparse
import os
import sys

from scripts.ops.auth import KeyFileError, key_from_file
from scripts.ops.management import (
    DEFAULT_MANAGEMENT_URL,
    ManagementClient,
    ManagementError,
    ready_workers,
    wanted_workers,
)


def not_ready_reason(client):
    """None when every registered model's default version has max(1, minWorkers) READY workers, else why not."""
    try:
        models = client.list_models()
        if not models:
            return "no models registered"
        for entry in models:
            description = client.description(entry["modelName"])
            wanted, ready = wanted_workers(description), len(ready_workers(description))
            if ready < wanted:
                return f"{entry['modelName']} {description.get('modelVersion')}: {ready}/{wanted} workers READY"
    except ManagementError as error:
        if error.status is None:
            return f"management API at {client.url} unusable: {error}"
        return f"management API answered {error.status}: {error}"
    except (ValueError, KeyError, IndexError, TypeError) as error:
        return f"management API at {client.url} unusable: {error}"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.ready_probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--management-url", default=os.environ.get("TS_MANAGEMENT_URL", DEFAULT_MANAGEMENT_URL))
    parser.add_argument("--key-file", help="TorchServe's key_file.json, when token authorization is on")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per HTTP call (default 2)")
    args = parser.parse_args(argv)
    token = None
    if args.key_file and os.path.isfile(args.key_file):
        try:
            token = key_from_file(args.key_file, "management")
        except KeyFileError as error:
            print(f"not ready: {error}")
            return 1
    reason = not_ready_reason(
        ManagementClient(args.management_url, token, f"key file {args.key_file}", args.key_file, args.timeout)
    )
    if reason:
        print(f"not ready: {reason}")
        return 1
    print("ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
