"""Servers the load tools talk to: find the one that answers, start a private one, wait for a model to answer.

`make loadtest` uses the development server (config.properties, as `make serve` starts it), starting it only when
nothing answers and stopping it afterwards only when it started it. The tuner and the comparison start private
TorchServes on free loopback ports with their own run folder, so they never touch a server someone else runs.
"""

import contextlib
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from loadtests import auth  # noqa: E402
from scripts import server as ts  # noqa: E402


free_ports = ts.free_ports


def port_taken(port, host="127.0.0.1"):
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def answers(url, timeout=2.0):
    """True when an HTTP server answers at url (any status: a 404 still means something listens)."""
    try:
        requests.get(url, timeout=timeout)
        return True
    except requests.RequestException:
        return False


def archives_present(props, store):
    """The config's load_models restricted to archives that exist (a missing one would keep a server from READY)."""
    present, missing = [], []
    for item in props.get("load_models", "").split(","):
        item = item.strip()
        if not item:
            continue
        archive = item.split("=", 1)[-1]
        (present if (Path(store) / archive).exists() else missing).append(item)
    return present, missing


def java_home():
    from scripts.java_home import find_java_home

    return os.environ.get("JAVA_HOME") or str(find_java_home(verbose=False))


@contextlib.contextmanager
def development_server(config, log=print, wait=900):
    """Yield the config's server (URLs); start it when nothing answers and stop it afterwards only in that case."""
    props = ts.read_properties(config)
    inference = props.get("inference_address", "http://127.0.0.1:8080")
    if answers(f"{inference}/ping"):
        log(f"using the TorchServe already answering at {inference}")
        yield {"inference": inference, "management": props.get("management_address"),
               "metrics": props.get("metrics_address"), "started": False}
        return
    store = REPO / props.get("model_store", "model_store")
    present, missing = archives_present(props, store)
    if missing:
        log(f"note: {', '.join(missing)} not built (model_store/); starting without them")
    log(f"no server answers at {inference}: starting one (logs in {ts.LOG_DIR}) ...")
    overrides = {"load_models": ",".join(present)}
    # TorchServe always starts gRPC and shuts down when its port is taken (e.g. by another TorchServe on this
    # machine); the load tools never use gRPC, so move it out of the way instead of failing.
    for key, default in (("grpc_inference_port", 7070), ("grpc_management_port", 7071)):
        port = int(props.get(key, default))
        if port_taken(port):
            overrides[key] = str(free_ports(1)[0])
            log(f"note: gRPC port {port} is taken; this server uses {overrides[key]} ({key})")
    rendered = ts.RUN_DIR / "config.properties"
    ts.render_config(config, rendered, overrides)
    server = ts.Server(rendered, ts.RUN_DIR, ts.LOG_DIR, java_home=java_home())
    if server.running():
        raise RuntimeError(f"a TorchServe of this checkout runs (pid {server.pid()}) but does not answer at "
                           f"{inference}; `make stop` it first")
    server.start()
    try:
        server.wait_ready(ts.loaded_model_names(ts.read_properties(rendered)), timeout=wait)
        yield {"inference": server.inference_url, "management": server.management_url,
               "metrics": server.metrics_url, "started": True}
    finally:
        log("stopping the TorchServe this run started")
        server.stop()


@contextlib.contextmanager
def private_torchserve(name, model_store, models, config=REPO / "config.properties", overrides=None, wait=900,
                       keep_logs_in=None):
    """A TorchServe on free loopback ports (gRPC included) with its own run folder; always stopped afterwards."""
    run_dir = REPO / "build" / "loadtest-servers" / f"{name}-{os.getpid()}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    # Model API on and no tokens: the tuner re-registers models; the server is private to this run (loopback).
    props = {"disable_token_authorization": "true", "enable_model_api": "true", **(overrides or {})}
    server = ts.start_isolated(config, run_dir, model_store, java_home(), models, props, wait)
    try:
        wait_until_answers(f"{server.management_url}/models", server, timeout=120)
        yield server
    finally:
        server.stop()
        if keep_logs_in:
            Path(keep_logs_in).mkdir(parents=True, exist_ok=True)
            for log in (run_dir / "logs").glob("*.log"):
                shutil.copy2(log, Path(keep_logs_in) / log.name)
        shutil.rmtree(run_dir, ignore_errors=True)


def wait_until_answers(url, server, timeout=120):
    """Wait for the frontend to listen (with no model loaded, wait_ready has nothing to wait for)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if answers(url):
            return
        if not server.running():
            raise RuntimeError(f"TorchServe exited during start-up\n{server.log_tail()}")
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout}s\n{server.log_tail()}")


def wait_for_prediction(url, body, check, timeout=300, headers=None):
    """Poll until one request answers correctly (a freshly started baseline may still be loading); raise otherwise,
    at once when the server refuses the token (waiting would not change that)."""
    deadline = time.time() + timeout
    last = "no answer"
    while time.time() < deadline:
        try:
            response = requests.post(url, json=body, timeout=30, headers=headers)
            if auth.refused(response.status_code, response.text):
                raise RuntimeError(f"{url} refused the request ({response.status_code}: {response.text[:200]}); "
                                   f"{auth.REFUSED_HINT}")
            if response.status_code == 200:
                reason = check(response.json())
                if reason is None:
                    return
                last = f"wrong answer: {reason}"
            else:
                last = f"HTTP {response.status_code}: {response.text[:200]}"
        except (requests.RequestException, ValueError) as error:
            last = f"{type(error).__name__}: {error}"
        time.sleep(1)
    raise RuntimeError(f"{url} did not answer correctly within {timeout}s ({last})")
