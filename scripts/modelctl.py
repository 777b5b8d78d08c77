"""Register, scale, describe, switch and roll out models on a running TorchServe through its management API.

    python -m scripts.modelctl list
    python -m scripts.modelctl describe classifier [--version 2.0 | --all] [--customized]
    python -m scripts.modelctl register classifier-2.0.mar [--batch-size 16] [--max-batch-delay 5]
                                        [--initial-workers 1] [--response-timeout 30] [--async [--wait]]
    python -m scripts.modelctl scale classifier --min 2 --max 2 [--version 2.0]
    python -m scripts.modelctl set-default classifier 2.0
    python -m scripts.modelctl unregister classifier [1.0 | --all-versions] [--drain-seconds 2 | --no-drain]
    python -m scripts.modelctl rollout classifier-2.0.mar     # register, wait READY, make default, drain, retire old
    python -m scripts.modelctl rotate-keys [--type inference|management|all]   # new keys now (cron: every N minutes)
    python -m scripts.modelctl keep-keys-fresh [--every SECONDS]   # beside the server: rotate at half the keys' life
    python -m scripts.modelctl paraphrase "Can I return it within 30 days?" "Can I return it after 30 days?" \
        --archive model_store/support-bot.mar          # or: --embedder minilm [--verifier my-reranker]

ARCHIVE is a file name in the server's model store (what `python -m scripts.package` builds into model_store/).
Note that an archive's own model-config.yaml wins over --initial-workers for min/max workers and over
--response-timeout (TorchServe's precedence); --batch-size/--max-batch-delay override it.

Token authorization: the management token is, in this order, --token, $TS_MANAGEMENT_TOKEN, or the "management" key
of TorchServe's key file (key_file.json in the server's working directory; --key-file, default .run/key_file.json as
written by `make serve`). A dev server without token authorization needs none. A key from the key file is re-read
when the file changes and after a refusal, so a command runs through a key rotation. TorchServe refuses a key from
its expiration time (token_expiration_min) on and the moment it is rotated: `keep-keys-fresh` (or `rotate-keys` run
by a scheduler more often than the keys expire) keeps the file's keys valid; clients re-read it (docs/operations.md).

`paraphrase` shows whether a generator's similarity cache would answer the first text with the second one's stored
answer, and why (cosine similarity against the threshold, numbers and negations, each reason of the lexical check,
the verifier's score): with the models an archive packs, loaded here as a worker loads them (--archive, no server
needed), or with an embedding model and a text-classifier / reranker a running TorchServe serves (--embedder,
--verifier; through the inference URL, --inference-url, with the key file's inference token when it has one).
Every command prints a human-readable result, or one JSON document with --json (before or after the command).
Errors are one line on stderr. `unregister` drains first (waits until the version's queue stayed empty), since
TorchServe never answers requests still queued at a version it unregisters; --no-drain skips that.
The management API itself is spoken by scripts/ops/management.py; rollout logic is scripts/ops/rollout.py and the
text views scripts/ops/model_views.py: this file is the command line.
Exit codes: 0 ok; 1 the operation failed (server error, timeout, rollout rolled back); 2 bad arguments;
3 TorchServe unreachable; 4 model, version or archive unknown; 5 the version is already registered (409);
6 token missing or refused.
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from scripts.ops import key_rotation, model_views
from scripts.ops.auth import DEFAULT_KEY_FILE, TOKEN_ENV, KeyFileError, KeySource
from scripts.ops.management import (
    DEFAULT_MANAGEMENT_URL,
    EXIT_AUTH,
    EXIT_OK,
    EXIT_USAGE,
    ManagementClient,
    ManagementError,
    ready_workers,
)
from scripts.ops.rollout import archive_identity, find_registered, rollout

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------------- commands
def cmd_list(client, args, log):
    rows = []
    for entry in client.list_models():
        name = entry["modelName"]
        rows.append(
            {
                "model": name,
                "default_version": client.default_version(name),
                "versions": [model_views.version_row(v) for v in client.versions(name)],
            }
        )
    for line in model_views.list_lines(rows):
        log(line)
    return {"models": rows}


def cmd_describe(client, args, log):
    if args.all:
        descriptions = client.versions(args.model)
        if args.customized:  # /all does not ask the handlers; ask each version
            descriptions = [client.describe(args.model, d["modelVersion"], customized=True)[0] for d in descriptions]
    else:
        descriptions = client.describe(args.model, args.version, customized=args.customized)
    default = client.default_version(args.model)
    views = [model_views.version_view(d, default, client.url, args.customized) for d in descriptions]
    for view in views:
        for line in model_views.describe_lines(view):
            log(line)
    return {"model": args.model, "default_version": default, "versions": views}


def request_timeout(args):
    # A synchronous call returns when the workers are up: allow for a slow start.
    return max(args.timeout, args.wait_timeout)


def cmd_register(client, args, log):
    started = time.monotonic()
    identity = archive_identity(args.archive, args.model_store)
    response = client.register(
        args.archive,
        synchronous=not args.async_,
        timeout=request_timeout(args),
        model_name=args.model_name,
        batch_size=args.batch_size,
        max_batch_delay=args.max_batch_delay,
        initial_workers=args.initial_workers,
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
            description = client.wait_ready(name, version, args.wait_timeout, log=log)
        else:
            description = client.description(name, version)
        result["ready_workers"] = len(ready_workers(description))
        log(f"{name} {version}: {result['ready_workers']} worker(s) READY ({time.monotonic() - started:.1f}s)")
    elif args.wait:
        raise ManagementError(
            f"registered {args.archive}, but cannot tell its model name and version to wait for "
            f"(pass --model-store where the archive is, or --model-name)"
        )
    return result


def cmd_scale(client, args, log):
    if args.max_workers < args.min_workers:
        raise ManagementError(f"--max ({args.max_workers}) must be at least --min ({args.min_workers})", EXIT_USAGE)
    response = client.scale(args.model, args.version, args.min_workers, args.max_workers, request_timeout(args))
    description = client.description(args.model, args.version)
    ready = len(ready_workers(description))
    log(f"{response.get('status', response)}; {ready} READY")
    return {
        "model": args.model,
        "version": description["modelVersion"],
        "min_workers": args.min_workers,
        "max_workers": args.max_workers,
        "ready_workers": ready,
    }


def cmd_set_default(client, args, log):
    response = client.set_default(args.model, args.version)
    log(response.get("status", response))
    return {"model": args.model, "default_version": args.version}


def cmd_unregister(client, args, log):
    versions = [v["modelVersion"] for v in client.versions(args.model)]
    if args.version and args.all_versions:
        raise ManagementError("give either a VERSION or --all-versions, not both", EXIT_USAGE)
    if args.version:
        targets = [args.version]
    elif args.all_versions or len(versions) == 1:
        default = client.default_version(args.model)
        targets = [v for v in versions if v != default] + [default]  # TorchServe refuses to drop the default first
    else:
        raise ManagementError(f"{args.model} has versions {versions}: name one, or pass --all-versions", EXIT_USAGE)
    for version in targets:
        client.unregister(
            args.model,
            version,
            drain=not args.no_drain,
            quiet_seconds=args.drain_seconds,
            drain_timeout=args.drain_timeout,
        )
        log(f"unregistered {args.model} {version}" + ("" if args.no_drain else " (drained first)"))
    return {"model": args.model, "unregistered": targets, "drained": not args.no_drain}


def cmd_rollout(client, args, log):
    """Register the new version beside the old, wait for its workers, switch the default, drain and retire the old."""
    return rollout(
        client,
        args.archive,
        args.model_store,
        wait_timeout=args.wait_timeout,
        register_timeout=args.timeout,
        drain_seconds=args.drain_seconds,
        smoke_test_seconds=args.smoke_test_seconds,
        keep_old=args.keep_old,
        log=log,
    ).as_dict()


def rotation_kinds(args):
    return key_rotation.KINDS if args.type == "all" else (args.type,)


def cmd_rotate_keys(client, args, log):
    """Have TorchServe issue new keys (it rewrites key_file.json); authenticated with the file's API key."""
    result = key_rotation.rotate(client, args.key_file, rotation_kinds(args))
    for kind, expires in result["expires"].items():
        log(f"new {kind} key written to {args.key_file}; valid until {expires or '?'}")
    return {"key_file": str(args.key_file), **result}


def stop_on_signal(_signum, _frame):
    raise KeyboardInterrupt


def cmd_keep_keys_fresh(client, args, log):
    """Rotate now and then every --every seconds (default: half the keys' lifetime) until stopped."""
    if args.every is not None and args.every <= 0:
        raise ManagementError("--every must be positive", EXIT_USAGE)
    say = lambda line: print(line, flush=True)  # noqa: E731 -- a long-running loop logs even with --json
    signal.signal(signal.SIGTERM, stop_on_signal)  # a supervisor's stop ends the loop like Ctrl-C: exit 0
    try:
        key_rotation.keep_fresh(client, args.key_file, rotation_kinds(args), args.every, args.retry_seconds, log=say)
    except KeyboardInterrupt:
        say("stopped")
    return {"stopped": True}


def cmd_paraphrase(client, args, log):
    """Would the similarity cache answer NEW with STORED's answer, and why (scripts/ops/paraphrase.py)."""
    # Imported here: it loads torch, which the other commands (keep-keys-fresh runs for days) have no use for.
    from handlers.core.config import ConfigError
    from scripts.ops.paraphrase import CheckError, run_check
    from scripts.ops.paraphrase import lines as check_lines

    if bool(args.archive) == bool(args.embedder):
        raise ManagementError("name the models: --archive a generator .mar, or --embedder a served model", EXIT_USAGE)
    token = None
    if args.embedder:
        try:
            token = KeySource.for_inference(
                os.environ.get(TOKEN_ENV), args.key_file if args.key_file.is_file() else None
            )
        except KeyFileError as error:
            raise ManagementError(str(error), EXIT_AUTH) from None
    archive = args.archive
    if archive is not None and not archive.is_file() and (args.model_store / archive).is_file():
        archive = args.model_store / archive
    overrides = {
        "threshold": args.threshold,
        "lexical_check": None if args.lexical_check is None else args.lexical_check == "on",
        "verifier_threshold": args.verifier_threshold,
    }
    try:
        result = run_check(
            args.new,
            args.stored,
            archive=archive,
            inference_url=args.inference_url,
            embedder=args.embedder,
            verifier=args.verifier,
            token=token,
            overrides=overrides,
        )
    except CheckError as error:
        raise ManagementError(str(error)) from None
    except ConfigError as error:
        raise ManagementError(str(error), EXIT_USAGE) from None
    for line in check_lines(result):
        log(line)
    return result


# --------------------------------------------------------------------------------------------------- CLI
def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m scripts.modelctl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--management-url",
        default=os.environ.get("TS_MANAGEMENT_URL", DEFAULT_MANAGEMENT_URL),
        help=f"management API (default $TS_MANAGEMENT_URL or {DEFAULT_MANAGEMENT_URL})",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("TS_MANAGEMENT_TOKEN"),
        help="management token (default $TS_MANAGEMENT_TOKEN, else from --key-file)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=Path(os.environ.get("TS_KEY_FILE", DEFAULT_KEY_FILE)),
        help="TorchServe's key_file.json (default $TS_KEY_FILE or .run/key_file.json)",
    )
    parser.add_argument(
        "--model-store",
        type=Path,
        default=REPO / "model_store",
        help="where archives can be read to learn their name and version (default model_store/)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call (default 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    # --json after the command too: each subcommand accepts it without overwriting one given before the command.
    json_anywhere = argparse.ArgumentParser(add_help=False)
    json_anywhere.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document instead of text"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, **kwargs):
        return commands.add_parser(name, parents=[json_anywhere], **kwargs)

    command("list", help="models, versions, default, READY workers")

    describe = command("describe", help="status, workers (PID, memory), batching, queue of a model")
    describe.add_argument("model")
    describe.add_argument("--version", help="a version (default: the default version)")
    describe.add_argument("--all", action="store_true", help="every version")
    describe.add_argument(
        "--customized",
        action="store_true",
        help="also ask the handler what it chose at load (backend, precision, threads...)",
    )

    register = command("register", help="register an archive from the model store")
    register.add_argument("archive", help="archive file name in the server's model store, e.g. classifier-2.0.mar")
    register.add_argument("--model-name", help="register under this name instead of the archive's")
    register.add_argument("--batch-size", type=int)
    register.add_argument("--max-batch-delay", type=int, help="ms")
    register.add_argument("--initial-workers", type=int)
    register.add_argument("--response-timeout", type=int, help="s")
    register.add_argument(
        "--async",
        dest="async_",
        action="store_true",
        help="return when TorchServe accepted the archive, before workers are up",
    )
    register.add_argument("--wait", action="store_true", help="with --async: poll until the workers are READY")

    scale = command("scale", help="set min/max workers (waits until they are up)")
    scale.add_argument("model")
    scale.add_argument("--version", help="default: the default version")
    scale.add_argument("--min", dest="min_workers", type=int, required=True)
    scale.add_argument("--max", dest="max_workers", type=int, required=True)

    default = command("set-default", help="route /predictions/MODEL to this version")
    default.add_argument("model")
    default.add_argument("version")

    unregister = command("unregister", help="drain, then remove one version, or all")
    unregister.add_argument("model")
    unregister.add_argument("version", nargs="?")
    unregister.add_argument("--all-versions", action="store_true")
    unregister.add_argument(
        "--drain-seconds",
        type=float,
        default=2.0,
        help="first wait until the version's queue stayed empty this long: TorchServe never "
        "answers requests still queued at a version it unregisters (default 2)",
    )
    unregister.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="give up (exit 1) if the queue is not quiet within this many seconds (default 60)",
    )
    unregister.add_argument(
        "--no-drain", action="store_true", help="unregister at once (only for a version that takes no traffic)"
    )

    rollout_command = command(
        "rollout",
        help="replace the serving version by a new archive without errors",
        description="Register ARCHIVE's version beside the serving one, wait until its workers are READY, make it the "
        "default, wait until each old version's queue stayed empty for --drain-seconds, then unregister "
        "the old versions. If the new version does not become READY (or the switch fails) it is removed "
        "again, the old version keeps serving, and the exit code is 1.",
    )
    rollout_command.add_argument(
        "archive", help="archive of the new version in the model store, e.g. classifier-2.0.mar"
    )
    rollout_command.add_argument(
        "--drain-seconds",
        type=float,
        default=2.0,
        help="an old version is retired after its queue stayed empty this long (default 2)",
    )
    rollout_command.add_argument(
        "--smoke-test-seconds",
        type=float,
        default=0.0,
        help="after READY, wait this long and check the workers are still READY (default 0)",
    )
    rollout_command.add_argument("--keep-old", action="store_true", help="switch the default but keep the old versions")

    rotate = command(
        "rotate-keys",
        help="have TorchServe issue new inference and management keys now (uses the key file's API key)",
        description="TorchServe refuses the old key at once and rewrites the key file; clients that take their key "
        "from the key file re-read it after a refusal (docs/operations.md, Key rotation).",
    )
    keep = command(
        "keep-keys-fresh",
        help="rotate the keys now and then before they expire, until stopped (run it beside the server)",
        description="Rotates now, then every --every seconds, by default at half the keys' lifetime (the server's "
        "token_expiration_min, read from the new keys' expiration time), so a rotation that fails (the server "
        "restarting) is retried every --retry-seconds well before the keys expire. One line per rotation on "
        "stdout. Stop it with SIGINT or SIGTERM (exit 0).",
    )
    keep.add_argument(
        "--every", type=float, help="seconds between rotations (default: half the keys' lifetime); must be shorter"
    )
    keep.add_argument(
        "--retry-seconds",
        type=float,
        default=key_rotation.RETRY_SECONDS,
        help=f"after a failed rotation, try again this much later (default {key_rotation.RETRY_SECONDS:g})",
    )
    for sub in (rotate, keep):
        sub.add_argument("--type", choices=("all", *key_rotation.KINDS), default="all", help="which keys (default all)")
    token = command("refresh-token", help="the same as rotate-keys, one kind (default management)")
    token.add_argument("--type", choices=key_rotation.KINDS, default="management")

    paraphrase = command(
        "paraphrase",
        help="would the similarity cache answer NEW with STORED's answer, and why",
        description="Runs the generator's similarity-cache verdict on two texts (its own lookup and verification "
        "code) and shows what decided it: cosine similarity against the threshold, numbers and negations, each "
        "reason of the lexical check, the verifier's score. Models: those a generator archive packs (--archive, "
        "loaded here, no server needed), or an embedding model and a text-classifier / reranker a running "
        "TorchServe serves (--embedder, --verifier).",
    )
    paraphrase.add_argument("new", help="the text asked now")
    paraphrase.add_argument("stored", help="the text whose answer is stored")
    paraphrase.add_argument(
        "--archive", type=Path, help="a generator .mar that packs an embedder (a path, or a name in --model-store)"
    )
    paraphrase.add_argument("--embedder", help="a served embedding model's name (instead of --archive)")
    paraphrase.add_argument("--verifier", help="with --embedder: a served text-classifier / reranker's name")
    paraphrase.add_argument(
        "--inference-url",
        default=os.environ.get("TS_INFERENCE_URL", "http://127.0.0.1:8080"),
        help="with --embedder: the inference API (default $TS_INFERENCE_URL or http://127.0.0.1:8080)",
    )
    paraphrase.add_argument("--threshold", type=float, help="recall threshold (default: the archive's, or 0.89)")
    paraphrase.add_argument("--verifier-threshold", type=float, help="(default: the archive's, or 0.5)")
    paraphrase.add_argument("--lexical-check", choices=("on", "off"), help="(default: the archive's, or on)")

    for sub in (register, scale, rollout_command):
        sub.add_argument(
            "--wait-timeout",
            type=float,
            default=600.0,
            help="seconds to wait for workers to become READY (default 600)",
        )
    return parser


COMMANDS = {
    "list": cmd_list,
    "describe": cmd_describe,
    "register": cmd_register,
    "scale": cmd_scale,
    "set-default": cmd_set_default,
    "unregister": cmd_unregister,
    "rollout": cmd_rollout,
    "rotate-keys": cmd_rotate_keys,
    "keep-keys-fresh": cmd_keep_keys_fresh,
    "refresh-token": cmd_rotate_keys,
    "paraphrase": cmd_paraphrase,
}


def make_client(args):
    if args.command == "paraphrase":  # the inference URL or no server at all: no management client
        return None
    if args.command in ("rotate-keys", "keep-keys-fresh", "refresh-token"):  # the key file's API key, not a token
        return key_rotation.rotation_client(args.management_url, args.key_file, args.timeout)
    return ManagementClient.with_key_file(args.management_url, args.token, args.key_file, args.timeout)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not hasattr(args, "wait_timeout"):
        args.wait_timeout = 0.0
    log = (lambda *_: None) if args.json else (lambda message: print(message, flush=True))
    try:
        result = COMMANDS[args.command](make_client(args), args, log)
    except KeyFileError as error:
        return report_error(ManagementError(str(error), EXIT_AUTH), args.json)
    except ManagementError as error:
        return report_error(error, args.json)
    if args.json:
        print(json.dumps(result, indent=2))
    return EXIT_OK


def report_error(error, as_json):
    print(f"error: {error}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": str(error), "exit_code": error.exit_code}))
    return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
