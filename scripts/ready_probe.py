"""Readiness check for a TorchServe: ready when every registered model's default version has its workers up.

TorchServe 0.12's /ping answers 200 "Healthy" as soon as the frontend listens, while workers are still loading and
even when a model's workers cannot load at all (seen), so it cannot gate traffic. This asks the management API
instead. Standard library only: it runs as a Kubernetes exec probe inside the image (deploy/Dockerfile copies it)
and on a production host (it reads the management token from TorchServe's key file when there is one).

    python scripts/ready_probe.py [--management-url http://127.0.0.1:8081] [--key-file key_file.json]

Exit codes: 0 ready; 1 not ready (one line says why: unreachable, no models, a model short of READY workers);
2 bad arguments.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request


def get(url, token, timeout):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def not_ready_reason(management_url, token=None, timeout=2.0):
    """None when every registered model's default version has max(1, minWorkers) READY workers, else why not."""
    base = management_url.rstrip("/")
    try:
        models = get(f"{base}/models?limit=1000", token, timeout).get("models", [])
        if not models:
            return "no models registered"
        for entry in models:
            description = get(f"{base}/models/{entry['modelName']}", token, timeout)[0]
            wanted = max(1, int(description.get("minWorkers") or 1))
            ready = sum(1 for w in description.get("workers", []) if w.get("status") == "READY")
            if ready < wanted:
                return f"{entry['modelName']} {description.get('modelVersion')}: {ready}/{wanted} workers READY"
    except urllib.error.HTTPError as error:
        return f"management API answered {error.code}"
    except (OSError, ValueError, KeyError, IndexError) as error:
        return f"management API at {base} unusable: {error}"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--management-url", default=os.environ.get("TS_MANAGEMENT_URL", "http://127.0.0.1:8081"))
    parser.add_argument("--key-file", help="TorchServe's key_file.json, when token authorization is on")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per HTTP call (default 2)")
    args = parser.parse_args(argv)
    token = None
    if args.key_file and os.path.isfile(args.key_file):
        with open(args.key_file) as handle:
            token = json.load(handle).get("management", {}).get("key")
    reason = not_ready_reason(args.management_url, token, args.timeout)
    if reason:
        print(f"not ready: {reason}")
        return 1
    print("ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
