"""Register, scale, describe, switch and roll out models on a running TorchServe through its management API.

    python -m scripts.modelctl list
    python -m scripts.modelctl describe classifier [--version 2.0 | --all] [--customized]
    python -m scripts.modelctl register classifier-2.0.mar [--batch-size 16] [--max-batch-delay 5]
                                        [--initial-workers 1] [--response-timeout 30] [--async [--wait]]
    python -m scripts.modelctl scale classifier --min 2 --max 2 [--version 2.0]
    python -m scripts.modelctl set-default classifier 2.0
    python -m scripts.modelctl unregister classifier [1.0 | --all-versions]
    python -m scripts.modelctl rollout classifier-2.0.mar     # register, wait READY, make default, drain, retire old
    python -m scripts.modelctl refresh-token [--type management|inference]

ARCHIVE is a file name in the server's model store (what `python -m scripts.package` builds into model_store/).
Note that an archive's own model-config.yaml wins over --initial-workers for min/max workers and over
--response-timeout (TorchServe's precedence); --batch-size/--max-batch-delay override it.

Token authorization: the management token is, in this order, --token, $TS_MANAGEMENT_TOKEN, or the "management" key
of TorchServe's key file (key_file.json in the server's working directory; --key-file, default .run/key_file.json as
written by `make serve`). A dev server without token authorization needs none.

Every command prints a human-readable result, or one JSON document with --json. Errors are one line on stderr.
Exit codes: 0 ok; 1 the operation failed (server error, timeout, rollout rolled back); 2 bad arguments;
3 TorchServe unreachable; 4 model, version or archive unknown; 5 the version is already registered (409);
6 token missing or refused.
"""

import argparse
import json
import os
import sys
import time
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import requests

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MANAGEMENT_URL = "http://127.0.0.1:8081"
DEFAULT_KEY_FILE = REPO / ".run" / "key_file.json"

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_AUTH = 0, 1, 2, 3, 4, 5, 6


class CtlError(Exception):
    """A failure to report as one line, with the exit code that classifies it."""

    def __init__(self, message, exit_code=EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


# --------------------------------------------------------------------------------------------------- HTTP client
def read_key_file(path):
    """TorchServe's key file: {"management": {"key", "expiration time"}, "inference": {...}, "API": {"key"}}."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as error:
        raise CtlError(f"cannot read key file {path}: {error.strerror}", EXIT_AUTH) from None
    except ValueError:
        raise CtlError(f"key file {path} is not JSON (is it TorchServe's key_file.json?)", EXIT_AUTH) from None


class ManagementClient:
    """Thin wrapper over TorchServe's management API that turns every failure into a CtlError."""

    def __init__(self, url, token=None, token_source=None, key_file=None, timeout=30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.token_source = token_source
        self.key_file = key_file
        self.timeout = timeout
        self.session = requests.Session()

    def call(self, method, path, params=None, timeout=None):
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = self.session.request(method, f"{self.url}{path}", params=params, headers=headers,
                                            timeout=timeout or self.timeout)
        except requests.ConnectionError:
            raise CtlError(f"cannot reach TorchServe's management API at {self.url} (is the server running? "
                           f"`make serve`; or pass --management-url)", EXIT_UNREACHABLE) from None
        except requests.Timeout:
            raise CtlError(f"{method} {path}: no answer from {self.url} within {timeout or self.timeout:.0f}s",
                           EXIT_FAILED) from None
        if response.status_code < 300:
            try:
                return response.json()
            except ValueError:
                return {"status": response.text.strip()}
        raise self.error_for(method, path, response)

    def error_for(self, method, path, response):
        try:
            body = response.json()
        except ValueError:
            body = {}
        kind = body.get("type", "")
        message = body.get("message") or response.text.strip() or response.reason
        code = response.status_code
        # TorchServe 0.12 refuses a missing or wrong token with 400 InvalidKeyException (not 401).
        if kind == "InvalidKeyException" or code == 401 or (code == 403 and "Version" not in kind):
            if self.token:
                hint = (f"the token from {self.token_source} was refused: it is for another server, or it expired "
                        f"(tokens live token_expiration_min minutes; `modelctl refresh-token` renews it, "
                        f"a restarted server writes a new key_file.json)")
            else:
                found = "not found" if not Path(self.key_file or "").is_file() else "it has no management key"
                hint = (f"this server requires a token and none was given: pass --token, or --key-file pointing "
                        f"at TorchServe's key_file.json (in the server's working directory; looked for "
                        f"{self.key_file}: {found})")
            return CtlError(f"{method} {path}: refused ({code} {kind or 'unauthorized'}): {hint}", EXIT_AUTH)
        exit_code = {404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT}.get(code, EXIT_FAILED)
        return CtlError(f"{method} {path}: {code} {kind}: {message}".replace("\n", " "), exit_code)

    # The management API, one method per endpoint we use.
    def list_models(self):
        models, token = [], None
        while True:
            page = self.call("GET", "/models", params={"limit": 100, **({"next_page_token": token} if token else {})})
            models += page.get("models", [])
            token = page.get("nextPageToken")
            if not token:
                return models

    def versions(self, name):
        return self.call("GET", f"/models/{name}/all")

    def describe(self, name, version=None, customized=False):
        path = f"/models/{name}" + (f"/{version}" if version else "")
        return self.call("GET", path, params={"customized": "true"} if customized else None)

    def default_version(self, name):
        return self.describe(name)[0]["modelVersion"]

    def register(self, archive, synchronous, timeout, **options):
        params = {"url": archive, "synchronous": str(synchronous).lower(),
                  **{k: v for k, v in options.items() if v is not None}}
        return self.call("POST", "/models", params=params, timeout=timeout)

    def scale(self, name, version, min_workers, max_workers, timeout):
        path = f"/models/{name}" + (f"/{version}" if version else "")
        params = {"min_worker": min_workers, "max_worker": max_workers, "synchronous": "true"}
        return self.call("PUT", path, params=params, timeout=timeout)

    def set_default(self, name, version):
        return self.call("PUT", f"/models/{name}/{version}/set-default")

    def unregister(self, name, version):
        return self.call("DELETE", f"/models/{name}/{version}")


# --------------------------------------------------------------------------------------------------- helpers
def ready_workers(description):
    return [w for w in description.get("workers", []) if w.get("status") == "READY"]


def archive_identity(archive, model_store):
    """(name, version) from the archive's MAR-INF/MANIFEST.json when the store is readable here, else None."""
    path = Path(model_store) / archive
    try:
        with zipfile.ZipFile(path) as mar:
            model = json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]
        return model["modelName"], str(model["modelVersion"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def find_registered(client, archive):
    """(name, version) of the registered version whose modelUrl is this archive (for stores we cannot read)."""
    for entry in client.list_models():
        for version in client.versions(entry["modelName"]):
            if version.get("modelUrl") == archive:
                return version["modelName"], str(version["modelVersion"])
    return None


def wait_until_ready(client, name, version, timeout, poll=1.0, log=lambda *_: None):
    """Wait until the version has as many READY workers as its minWorkers (at least one); returns its description."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            description = client.describe(name, version)[0]
            wanted = max(1, int(description.get("minWorkers") or 1))
            ready = len(ready_workers(description))
            if ready >= wanted:
                return description
            state = f"{ready}/{wanted} workers READY"
        except CtlError as error:
            if error.exit_code != EXIT_NOT_FOUND:  # an async registration may not be visible yet
                raise
            state = "not registered yet"
        if state != last:
            log(f"  {name} {version}: {state}")
            last = state
        if time.monotonic() >= deadline:
            raise CtlError(f"{name} {version} not READY after {timeout:.0f}s ({state}); see the server's "
                           f"model_log.log", EXIT_FAILED)
        time.sleep(poll)


def drain(client, name, version, quiet_seconds, timeout, poll=0.25):
    """Wait until no request has been queued for this version for `quiet_seconds` (after a default switch,
    requests that resolved the old default a moment earlier may still arrive and must be answered)."""
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while True:
        description = client.describe(name, version)[0]
        if description.get("jobQueueStatus", {}).get("pendingRequests", 0) > 0:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_seconds:
            return
        if time.monotonic() >= deadline:
            raise CtlError(f"{name} {version} still had queued requests after {timeout:.0f}s", EXIT_FAILED)
        time.sleep(poll)


def local_rss(pid, management_url):
    """Resident memory of a worker on this machine (TorchServe reports memoryUsage 0 between metric collections)."""
    if urlparse(management_url).hostname not in ("127.0.0.1", "localhost", "::1") or not pid:
        return None
    try:
        import psutil

        process = psutil.Process(int(pid))
        if not any("model_service_worker" in part for part in process.cmdline()):
            return None
        return process.memory_info().rss
    except Exception:  # gone, not ours, no permission: no number rather than a wrong one
        return None


def mib(size):
    return f"{size / 2**20:.1f} MiB"


# --------------------------------------------------------------------------------------------------- commands
def cmd_list(client, args, log):
    rows = []
    for entry in client.list_models():
        name = entry["modelName"]
        versions = client.versions(name)
        default = client.default_version(name)
        rows.append({
            "model": name, "default_version": default,
            "versions": [{"version": v["modelVersion"], "archive": v.get("modelUrl"),
                          "ready_workers": len(ready_workers(v)), "min_workers": v.get("minWorkers"),
                          "max_workers": v.get("maxWorkers")} for v in versions],
        })
    log(f"{'MODEL':16} {'VERSION':10} {'DEFAULT':8} {'WORKERS':12} ARCHIVE")
    for row in rows:
        for v in row["versions"]:
            workers = f"{v['ready_workers']} READY/{v['min_workers']}-{v['max_workers']}"
            log(f"{row['model']:16} {v['version']:10} {'*' if v['version'] == row['default_version'] else '':8} "
                f"{workers:12} {v['archive']}")
    if not rows:
        log("(no models registered)")
    return {"models": rows}


def worker_view(worker, management_url):
    reported = worker.get("memoryUsage") or 0
    measured = None if reported else local_rss(worker.get("pid"), management_url)
    return {"id": worker.get("id"), "status": worker.get("status"), "pid": worker.get("pid"),
            "memory_bytes": reported or measured,
            "memory_source": "server" if reported else ("local rss" if measured else None),
            "started": worker.get("startTime"), "gpu": worker.get("gpu")}


def cmd_describe(client, args, log):
    if args.all:
        descriptions = client.versions(args.model)
        if args.customized:  # /all does not ask the handlers; ask each version
            descriptions = [client.describe(args.model, d["modelVersion"], customized=True)[0] for d in descriptions]
    else:
        descriptions = client.describe(args.model, args.version, customized=args.customized)
    default = client.default_version(args.model)
    result = []
    for d in descriptions:
        view = {
            "model": d["modelName"], "version": d["modelVersion"], "default": d["modelVersion"] == default,
            "archive": d.get("modelUrl"), "min_workers": d.get("minWorkers"), "max_workers": d.get("maxWorkers"),
            "ready_workers": len(ready_workers(d)),
            "workers": [worker_view(w, client.url) for w in d.get("workers", [])],
            "batch": {k: d.get(k) for k in ("batchSize", "maxBatchDelay", "responseTimeout", "startupTimeout")},
            "queue": d.get("jobQueueStatus", {}),
        }
        if args.customized:
            metadata = d.get("customizedMetadata")
            if isinstance(metadata, str):
                try:
                    metadata = json.loads(metadata)
                except ValueError:
                    pass
            view["customized"] = metadata
        result.append(view)
        log(f"{view['model']} {view['version']}{' (default)' if view['default'] else ''}   archive {view['archive']}")
        log(f"  workers   {view['ready_workers']} READY, min {view['min_workers']} / max {view['max_workers']}")
        for w in view["workers"]:
            memory = f"{mib(w['memory_bytes'])} ({w['memory_source']})" if w["memory_bytes"] else "memory n/a"
            log(f"    {w['id']:>6}  {w['status']:9} pid {w['pid']:<8} {memory:26} started {w['started']}")
        b = view["batch"]
        log(f"  batching  batchSize {b['batchSize']}, maxBatchDelay {b['maxBatchDelay']} ms, "
            f"responseTimeout {b['responseTimeout']} s, startupTimeout {b['startupTimeout']} s")
        q = view["queue"]
        log(f"  queue     {q.get('pendingRequests', '?')} pending, {q.get('remainingCapacity', '?')} free slots")
        if args.customized:
            c = view["customized"]
            if isinstance(c, dict):
                log("  handler   " + ", ".join(f"{k} {v}" for k, v in c.items()))
            else:
                log(f"  handler   {c!r}")
    return {"model": args.model, "default_version": default, "versions": result}


def request_timeout(args):
    # A synchronous call returns when the workers are up: allow for a slow start.
    return max(args.timeout, args.wait_timeout)


def cmd_register(client, args, log):
    started = time.monotonic()
    identity = archive_identity(args.archive, args.model_store)
    response = client.register(
        args.archive, synchronous=not args.async_, timeout=request_timeout(args), model_name=args.model_name,
        batch_size=args.batch_size, max_batch_delay=args.max_batch_delay, initial_workers=args.initial_workers,
        response_timeout=args.response_timeout,
    )
    log(response.get("status", response))
    if args.model_name and identity:
        identity = (args.model_name, identity[1])
    identity = identity or find_registered(client, args.archive)
    result = {"archive": args.archive, "status": response.get("status"), "synchronous": not args.async_}
    if identity:
        name, version = identity
        result.update(model=name, version=version)
        if args.async_ and args.wait:
            description = wait_until_ready(client, name, version, args.wait_timeout, log=log)
        else:
            description = client.describe(name, version)[0]
        result["ready_workers"] = len(ready_workers(description))
        log(f"{name} {version}: {result['ready_workers']} worker(s) READY ({time.monotonic() - started:.1f}s)")
    elif args.wait:
        raise CtlError(f"registered {args.archive}, but cannot tell its model name and version to wait for "
                       f"(pass --model-store where the archive is, or --model-name)")
    return result


def cmd_scale(client, args, log):
    if args.max_workers < args.min_workers:
        raise CtlError(f"--max ({args.max_workers}) must be at least --min ({args.min_workers})", EXIT_USAGE)
    response = client.scale(args.model, args.version, args.min_workers, args.max_workers, request_timeout(args))
    description = client.describe(args.model, args.version)[0]
    ready = len(ready_workers(description))
    log(f"{response.get('status', response)}; {ready} READY")
    return {"model": args.model, "version": description["modelVersion"], "min_workers": args.min_workers,
            "max_workers": args.max_workers, "ready_workers": ready}


def cmd_set_default(client, args, log):
    response = client.set_default(args.model, args.version)
    log(response.get("status", response))
    return {"model": args.model, "default_version": args.version}


def cmd_unregister(client, args, log):
    versions = [v["modelVersion"] for v in client.versions(args.model)]
    if args.version and args.all_versions:
        raise CtlError("give either a VERSION or --all-versions, not both", EXIT_USAGE)
    if args.version:
        targets = [args.version]
    elif args.all_versions or len(versions) == 1:
        default = client.default_version(args.model)
        targets = [v for v in versions if v != default] + [default]  # TorchServe refuses to drop the default first
    else:
        raise CtlError(f"{args.model} has versions {versions}: name one, or pass --all-versions", EXIT_USAGE)
    for version in targets:
        if args.drain_seconds:
            drain(client, args.model, version, args.drain_seconds, args.drain_timeout)
        client.unregister(args.model, version)
        log(f"unregistered {args.model} {version}")
    return {"model": args.model, "unregistered": targets}


def cmd_rollout(client, args, log):
    """Register the new version beside the old, wait for its workers, switch the default, drain and retire the old.

    On any failure before the switch the new version is removed again and the old one keeps serving."""
    started = time.monotonic()
    identity = archive_identity(args.archive, args.model_store)
    if identity is None:
        raise CtlError(f"cannot read {Path(args.model_store) / args.archive} (rollout needs the archive's model name "
                       f"and version before it registers it; pass --model-store)", EXIT_NOT_FOUND)
    name, version = identity
    try:
        before = [v["modelVersion"] for v in client.versions(name)]
        old_default = client.default_version(name)
    except CtlError as error:
        if error.exit_code != EXIT_NOT_FOUND:
            raise
        before, old_default = [], None
    if version in before:
        raise CtlError(f"{name} {version} is already registered (versions: {before}); a rollout needs a new "
                       f"version: build one with `python -m scripts.package {name} --version X`", EXIT_CONFLICT)
    log(f"rollout {name}: {old_default or '(none)'} -> {version} from {args.archive}")

    client.register(args.archive, synchronous=False, timeout=args.timeout)
    log(f"  registered {name} {version}; waiting for its workers")
    try:
        wait_until_ready(client, name, version, args.wait_timeout, log=log)
        if args.smoke_test_seconds:
            time.sleep(args.smoke_test_seconds)
            wait_until_ready(client, name, version, 0)  # still READY: the workers did not crash after loading
        client.set_default(name, version)
    except CtlError as error:
        # Roll back: the new version never took traffic through the default route; remove it again.
        rollback = "removed it again"
        try:
            client.unregister(name, version)
        except CtlError as cleanup_error:
            rollback = f"could not remove it ({cleanup_error})"
        keeps = f"{name} {old_default} keeps serving" if old_default else "nothing was serving before"
        raise CtlError(f"rollout of {name} {version} failed: {error}; {rollback}; {keeps}", EXIT_FAILED) from None
    log(f"  {name} {version} is the default; draining {[v for v in before] or 'nothing'}")

    retired, kept = [], []
    for old in before:
        if args.keep_old:
            kept.append(old)
            continue
        try:
            drain(client, name, old, args.drain_seconds, args.wait_timeout)
            client.unregister(name, old)
            retired.append(old)
            log(f"  unregistered {name} {old}")
        except CtlError as error:
            raise CtlError(f"{name} {version} serves as default, but retiring {old} failed: {error}",
                           EXIT_FAILED) from None
    seconds = time.monotonic() - started
    log(f"rollout done in {seconds:.1f}s: {name} {version} is the default"
        + (f"; kept {kept}" if kept else ""))
    return {"model": name, "version": version, "previous_default": old_default, "unregistered": retired,
            "kept": kept, "seconds": round(seconds, 2)}


def cmd_refresh_token(client, args, log):
    """Ask TorchServe for a new management or inference key (it rewrites key_file.json); needs the file's API key."""
    keys = read_key_file(args.key_file)
    api_key = keys.get("API", {}).get("key")
    if not api_key:
        raise CtlError(f"{args.key_file} has no API key", EXIT_AUTH)
    client.token, client.token_source = api_key, f"the API key in {args.key_file}"
    response = client.call("GET", "/token", params={"type": args.type})
    refreshed = read_key_file(args.key_file).get(args.type, {})
    log(f"new {args.type} key written to {args.key_file}; expires {refreshed.get('expiration time', '?')}")
    return {"type": args.type, "key_file": str(args.key_file), "expires": refreshed.get("expiration time"),
            "response": response}


# --------------------------------------------------------------------------------------------------- CLI
def build_parser():
    parser = argparse.ArgumentParser(prog="python -m scripts.modelctl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--management-url", default=os.environ.get("TS_MANAGEMENT_URL", DEFAULT_MANAGEMENT_URL),
                        help=f"management API (default $TS_MANAGEMENT_URL or {DEFAULT_MANAGEMENT_URL})")
    parser.add_argument("--token", default=os.environ.get("TS_MANAGEMENT_TOKEN"),
                        help="management token (default $TS_MANAGEMENT_TOKEN, else from --key-file)")
    parser.add_argument("--key-file", type=Path, default=Path(os.environ.get("TS_KEY_FILE", DEFAULT_KEY_FILE)),
                        help="TorchServe's key_file.json (default $TS_KEY_FILE or .run/key_file.json)")
    parser.add_argument("--model-store", type=Path, default=REPO / "model_store",
                        help="where archives can be read to learn their name and version (default model_store/)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call (default 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("list", help="models, versions, default, READY workers")

    describe = commands.add_parser("describe", help="status, workers (PID, memory), batching, queue of a model")
    describe.add_argument("model")
    describe.add_argument("--version", help="a version (default: the default version)")
    describe.add_argument("--all", action="store_true", help="every version")
    describe.add_argument("--customized", action="store_true",
                          help="also ask the handler what it chose at load (precision, compile, threads...)")

    register = commands.add_parser("register", help="register an archive from the model store")
    register.add_argument("archive", help="archive file name in the server's model store, e.g. classifier-2.0.mar")
    register.add_argument("--model-name", help="register under this name instead of the archive's")
    register.add_argument("--batch-size", type=int)
    register.add_argument("--max-batch-delay", type=int, help="ms")
    register.add_argument("--initial-workers", type=int)
    register.add_argument("--response-timeout", type=int, help="s")
    register.add_argument("--async", dest="async_", action="store_true",
                          help="return when TorchServe accepted the archive, before workers are up")
    register.add_argument("--wait", action="store_true", help="with --async: poll until the workers are READY")

    scale = commands.add_parser("scale", help="set min/max workers (waits until they are up)")
    scale.add_argument("model")
    scale.add_argument("--version", help="default: the default version")
    scale.add_argument("--min", dest="min_workers", type=int, required=True)
    scale.add_argument("--max", dest="max_workers", type=int, required=True)

    default = commands.add_parser("set-default", help="route /predictions/MODEL to this version")
    default.add_argument("model")
    default.add_argument("version")

    unregister = commands.add_parser("unregister", help="remove one version, or all")
    unregister.add_argument("model")
    unregister.add_argument("version", nargs="?")
    unregister.add_argument("--all-versions", action="store_true")
    unregister.add_argument("--drain-seconds", type=float, default=0.0,
                            help="first wait until the version's queue stayed empty this long: TorchServe never "
                                 "answers requests still queued at a version it unregisters (default 0)")
    unregister.add_argument("--drain-timeout", type=float, default=60.0,
                            help="give up (exit 1) if the queue is not quiet within this many seconds (default 60)")

    rollout = commands.add_parser(
        "rollout", help="replace the serving version by a new archive without errors",
        description="Register ARCHIVE's version beside the serving one, wait until its workers are READY, make it the "
                    "default, wait until each old version's queue stayed empty for --drain-seconds, then unregister "
                    "the old versions. If the new version does not become READY (or the switch fails) it is removed "
                    "again, the old version keeps serving, and the exit code is 1.")
    rollout.add_argument("archive", help="archive of the new version in the model store, e.g. classifier-2.0.mar")
    rollout.add_argument("--drain-seconds", type=float, default=2.0,
                         help="an old version is retired after its queue stayed empty this long (default 2)")
    rollout.add_argument("--smoke-test-seconds", type=float, default=0.0,
                         help="after READY, wait this long and check the workers are still READY (default 0)")
    rollout.add_argument("--keep-old", action="store_true", help="switch the default but keep the old versions")

    token = commands.add_parser("refresh-token", help="have TorchServe issue a new key (uses the key file's API key)")
    token.add_argument("--type", choices=("management", "inference"), default="management")

    for sub in (register, scale, rollout):
        sub.add_argument("--wait-timeout", type=float, default=600.0,
                         help="seconds to wait for workers to become READY (default 600)")
    return parser


COMMANDS = {"list": cmd_list, "describe": cmd_describe, "register": cmd_register, "scale": cmd_scale,
            "set-default": cmd_set_default, "unregister": cmd_unregister, "rollout": cmd_rollout,
            "refresh-token": cmd_refresh_token}


def make_client(args):
    token, source = args.token, "--token/$TS_MANAGEMENT_TOKEN"
    # No key file is fine for a dev server without token authorization; a server that wants one says so (400/401).
    if not token and args.key_file.is_file():
        token = read_key_file(args.key_file).get("management", {}).get("key")
        source = f"key file {args.key_file}"
    return ManagementClient(args.management_url, token, source, args.key_file, args.timeout)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not hasattr(args, "wait_timeout"):
        args.wait_timeout = 0.0
    log = (lambda *_: None) if args.json else (lambda message: print(message, flush=True))
    try:
        if args.command == "refresh-token":
            client = ManagementClient(args.management_url, key_file=args.key_file, timeout=args.timeout)
        else:
            client = make_client(args)
        result = COMMANDS[args.command](client, args, log)
    except CtlError as error:
        print(f"error: {error}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(error), "exit_code": error.exit_code}))
        return error.exit_code
    if args.json:
        print(json.dumps(result, indent=2))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
