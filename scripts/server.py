"""Start, stop, restart and report on the development TorchServe of this checkout (`make serve/stop/restart/status`).

    python -m scripts.server start [--profile production | --config FILE] [--wait 900]
    python -m scripts.server stop
    python -m scripts.server restart [--profile production]
    python -m scripts.server status [--json]

`start` renders the chosen properties file into .run/ (paths made absolute), starts TorchServe with TMPDIR=.run and
logs in logs/, waits until every model the config loads has a READY worker, and prints the URLs and a curl example.
`stop` returns once the frontend and its workers have exited; it signals the pid in .run/.model_server.pid only when
that process is this checkout's TorchServe (its command line names .run/config.properties and the model store), and
removes a stale pid file without signalling the process it names. A port the config needs that another program holds
stops `start` before anything starts, naming the port and the program (TorchServe itself would exit at once, its reason
only in logs/torchserve-start.log); if TorchServe still exits during start-up, the cache servers `start` launched for it
are stopped again. The lifecycle itself is scripts/ops/server.py, shared with the tests, the load tools and the
reliability suite. The shared embedding cache server a model's config names on 127.0.0.1 (docs/cache.md,
scripts/ops/cache_server.py) is started before TorchServe and stopped by `stop`, not by `restart` (which keeps it warm).
A profile is config/<name>.properties (`make serve PROFILE=production`); without one, config.properties.
Exit codes: 0 ok (status: running), 1 the server failed to start, models did not become ready, or (status) it is not
running, 2 bad arguments (an unknown profile included).
"""

import argparse
import json
import os
import sys

from scripts.ops import cache_server
from scripts.ops.server import (
    DEFAULT_CONFIG,
    LOG_DIR,
    PID_FILE,
    REPO,
    ProfileError,
    check_config,
    dev_server,
    loaded_model_names,
    process_alive,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LOGS = LOG_DIR.relative_to(REPO) if LOG_DIR.is_relative_to(REPO) else LOG_DIR  # printed as logs/, as in README


def config_path(args):
    """The properties file: --config, else --profile's config/<name>.properties, else $TS_PROFILE_CONFIG, else
    config.properties. ProfileError when it does not exist."""
    if args.config:
        return check_config(args.config)
    if args.profile:
        return check_config(REPO / "config" / f"{args.profile}.properties")
    return check_config(os.environ.get("TS_PROFILE_CONFIG") or DEFAULT_CONFIG)


def start(server, wait):
    caches_before = set()
    if server.running():
        print(f"TorchServe is already running (pid {server.pid()}); `make restart` to restart it")
    else:
        in_use = server.ports_in_use()
        if in_use:  # TorchServe would exit at once; say why, and start nothing
            for problem in in_use:
                print(f"error: {problem}", file=sys.stderr)
            print("Stop that program, or serve on other ports (a --config or PROFILE of your own).", file=sys.stderr)
            return EXIT_FAILED
        caches_before = {cache.port for cache in cache_server.started_servers() if cache.running()}
        # The shared embedding cache first, so the workers find it at load (a password with token authorization).
        with_password = server.props.get("disable_token_authorization", "false").lower() != "true"
        try:
            server.extra_env.update(
                cache_server.start_for_models(loaded_model_names(server.props), with_password, log=print)
            )
        except (RuntimeError, OSError) as error:
            print(f"warning: shared cache not started ({error}); serving without it", file=sys.stderr)
        try:
            server.start()
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            stop_new_caches(caches_before)
            return EXIT_FAILED
    names = loaded_model_names(server.props)
    print(f"Waiting for {', '.join(names)} to be READY (logs: {LOGS}/ts_log.log, model_log.log) ...")
    try:
        server.wait_ready(names, timeout=wait)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        if not server.running():  # it never came up: the cache servers started for it go too
            stop_new_caches(caches_before)
        return EXIT_FAILED
    auth = ' -H "Authorization: Bearer $(jq -r .inference.key .run/key_file.json)"' if server.tokens() else ""
    print(f"""
TorchServe is up (pid {server.pid()}); models: {", ".join(names)}
  inference   {server.inference_url}/predictions/<model>
  management  {server.management_url}/models
  metrics     {server.metrics_url}/metrics
  logs        {LOGS}/

Try:
  curl{auth} -s {server.inference_url}/predictions/minilm -H 'Content-Type: application/json' \\
       -d '{{"text": "hello world"}}'
  curl{auth} -s {server.inference_url}/predictions/classifier -H 'Content-Type: application/json' \\
       -d "{{\\"inputs\\": $(python3 -c 'print([0.1]*128)')}}"
Stop it with: make stop""")
    return EXIT_OK


def stop_new_caches(running_before):
    """Stop the cache servers this start launched (not one that was running already)."""
    for cache in cache_server.started_servers():
        if cache.port not in running_before and cache.stop():
            print(f"shared cache on port {cache.port} stopped (TorchServe did not start)", file=sys.stderr)


def stop(server, keep_cache=False):
    pid = server.pid()
    stale = server.stale_pid()  # read before stop() removes the file
    if not server.stop():
        if stale is None:
            print("TorchServe is not running (nothing to stop)")
        else:
            what = "another program now" if process_alive(stale) else "gone"
            print(
                f"TorchServe is not running: the pid file {server.run_dir / PID_FILE} was stale (pid {stale} is "
                f"{what}, not this checkout's TorchServe: not signalled); removed it"
            )
    else:
        print(f"TorchServe stopped (pid {pid} and its workers have exited)")
    if not keep_cache:  # a restart keeps the shared cache warm: that is what it is for
        cache_server.stop_all(log=print)
    return EXIT_OK


def status(server, as_json):
    state = {**server.status(), "shared_caches": cache_server.status_all()}
    if as_json:
        print(json.dumps(state, indent=2))
    elif not state["running"]:
        print("TorchServe is not running (`make serve` starts it)")
    else:
        print(f"TorchServe is running, pid {state['pid']}")
        print(
            f"  inference   {state['inference']}\n  management  {state['management']}\n  metrics     {state['metrics']}"
        )
        for name, model in state["models"].items():
            print(
                f"  {name:12} {model['version']:8} {model['ready_workers']} READY worker(s) "
                f"(min {model['min_workers']})"
            )
        if state.get("management_error"):
            print(f"  models: {state['management_error']}")
    for cache in state["shared_caches"]:
        running = f"running, pid {cache['pid']}" if cache["running"] else "NOT running (`make restart` starts it)"
        print(f"  shared cache {cache['url']}: {running}")
    return EXIT_OK if state["running"] else EXIT_FAILED


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.server", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("start", "stop", "restart", "status"))
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--profile", help="config/<PROFILE>.properties (default: $TS_PROFILE_CONFIG, else config.properties)"
    )
    choice.add_argument("--config", help="a properties file")
    parser.add_argument("--wait", type=int, default=900, help="seconds to wait for READY workers")
    parser.add_argument("--json", action="store_true", help="status: one JSON document")
    args = parser.parse_args(argv)
    try:
        server = dev_server(config_path(args))
    except ProfileError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.action == "stop":
        return stop(server)
    if args.action == "status":
        return status(server, args.json)
    if args.action == "restart":
        stop(server, keep_cache=True)
    return start(server, args.wait)


if __name__ == "__main__":
    sys.exit(main())
