"""Start, wait for, describe and stop a TorchServe of this project.

    python -m scripts.server start [--config config.properties] [--wait 600]
    python -m scripts.server stop
    python -m scripts.server status

`start` renders the chosen properties file into .run/ (paths made absolute), starts `torchserve --start --ncs` with
TMPDIR=.run (TorchServe keeps one pid file per TMPDIR) and logs in logs/, waits until every model the config loads
has a READY worker, and prints the URLs and a curl example. The integration tests use the same functions with free
ports and their own folders. Exit codes: 0 ok, 1 the server failed to start or models did not become ready.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
RUN_DIR = REPO / ".run"
LOG_DIR = REPO / "logs"
PATH_KEYS = ("model_store", "metrics_config")
# The JVM option naming the log4j2 configuration (config/log4j2.xml), inside `vmargs`: made absolute like PATH_KEYS,
# because TorchServe runs in .run/ (or a test's own folder), where a relative path would not resolve.
LOG_CONFIG_OPTION = "-Dlog4j.configurationFile="
START_LOG = "torchserve-start.log"


def read_properties(path):
    props = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def model_store_regex(model_store):
    """`{model_store}` in a properties value (allowed_urls) -> the model store path as a literal Java regex.

    \\Q...\\E quotes the path; the backslashes are doubled because Java's Properties.load drops single ones."""
    return "\\\\Q" + str(model_store) + "\\\\E"


def absolute_log_config(vmargs):
    """`vmargs` with the log4j2 configuration path made absolute against the repo (other JVM options unchanged).

    TorchServe splits vmargs on whitespace, so a path cannot contain spaces either way."""
    words = []
    for word in vmargs.split():
        if word.startswith(LOG_CONFIG_OPTION):
            path = word[len(LOG_CONFIG_OPTION):]
            if "://" not in path and not os.path.isabs(path):
                word = LOG_CONFIG_OPTION + str(REPO / path)
        words.append(word)
    return " ".join(words)


def log_config_path(props):
    """The log4j2 configuration file a (rendered) properties dict starts TorchServe with, or None."""
    for word in props.get("vmargs", "").split():
        if word.startswith(LOG_CONFIG_OPTION):
            return Path(word[len(LOG_CONFIG_OPTION):].removeprefix("file://"))
    return None


def render_config(source, destination, overrides=None):
    """Copy a properties file, making relative paths absolute (against the repo) and applying overrides."""
    props = read_properties(source)
    for key in PATH_KEYS:
        if key in props and not os.path.isabs(props[key]):
            props[key] = str(REPO / props[key])
    if "vmargs" in props:
        props["vmargs"] = absolute_log_config(props["vmargs"])
    props.update(overrides or {})
    if "model_store" in props:
        props = {key: value.replace("{model_store}", model_store_regex(props["model_store"]))
                 for key, value in props.items()}
    Path(destination).parent.mkdir(parents=True, exist_ok=True)
    Path(destination).write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return props


def loaded_model_names(props):
    names = []
    for item in props.get("load_models", "").split(","):
        item = item.strip()
        if item and item.lower() != "all":
            names.append(item.split("=", 1)[0] if "=" in item else Path(item).stem)
    return names


class Server:
    """One TorchServe instance: its config, its run folder (TMPDIR, working dir) and its logs."""

    def __init__(self, config_path, run_dir, log_dir, java_home=None, token_file=None):
        self.config_path = Path(config_path)
        self.run_dir = Path(run_dir)
        self.log_dir = Path(log_dir)
        self.props = read_properties(self.config_path)
        self.java_home = java_home
        self.inference_url = self.props.get("inference_address", "http://127.0.0.1:8080")
        self.management_url = self.props.get("management_address", "http://127.0.0.1:8081")
        self.metrics_url = self.props.get("metrics_address", "http://127.0.0.1:8082")

    @property
    def key_file(self):
        return self.run_dir / "key_file.json"

    def tokens(self):
        """TorchServe's own key file (written in its working dir) when token authorization is on."""
        if not self.key_file.exists():
            return {}
        keys = json.loads(self.key_file.read_text())
        return {name: keys.get(name, {}).get("key") for name in ("management", "inference")}

    def headers(self, api):
        token = self.tokens().get(api)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def env(self):
        env = dict(os.environ)
        env.update(TMPDIR=str(self.run_dir), TEMP=str(self.run_dir), LOG_LOCATION=str(self.log_dir),
                   METRICS_LOCATION=str(self.log_dir), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TORCHINDUCTOR_CACHE_DIR=str(self.run_dir / "inductor-cache"))
        if self.java_home:
            env["JAVA_HOME"] = str(self.java_home)
            env["PATH"] = f"{Path(self.java_home) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        return env

    def torchserve(self, *args):
        return [str(Path(sys.executable).parent / "torchserve"), *args]

    def start(self):
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        command = self.torchserve("--start", "--ncs", "--ts-config", str(self.config_path),
                                  "--model-store", self.props["model_store"])
        # The JVM's stdout/stderr: start-up output only (config/log4j2.xml), one start per file; the previous start's
        # is kept as .1, so restarts do not make it grow either.
        start_log = self.log_dir / START_LOG
        if start_log.exists() and start_log.stat().st_size:
            start_log.replace(start_log.with_name(START_LOG + ".1"))
        with open(start_log, "wb") as out:
            result = subprocess.run(command, cwd=self.run_dir, env=self.env(), stdout=out, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            raise RuntimeError(f"torchserve --start failed (exit {result.returncode}); see {self.log_dir}")

    def pid(self):
        pid_file = self.run_dir / ".model_server.pid"
        try:
            return int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def running(self):
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False

    def stop(self, timeout=60):
        pid = self.pid()
        subprocess.run(self.torchserve("--stop"), cwd=self.run_dir, env=self.env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
        deadline = time.time() + timeout
        while pid and self.running() and time.time() < deadline:
            time.sleep(0.5)
        if pid and self.running():
            os.kill(pid, signal.SIGKILL)

    def model_status(self, name):
        response = requests.get(f"{self.management_url}/models/{name}", headers=self.headers("management"), timeout=10)
        response.raise_for_status()
        return response.json()

    def wait_ready(self, names, timeout=600):
        """Wait until each model has at least one READY worker; raise with the log tail if it does not happen."""
        deadline = time.time() + timeout
        pending = list(names)
        while time.time() < deadline:
            if not self.running():
                raise RuntimeError(f"TorchServe exited during start-up{self.bind_failure()}\n{self.log_tail()}")
            still = []
            for name in pending:
                try:
                    versions = self.model_status(name)
                    ready = any(w.get("status") == "READY" for v in versions for w in v.get("workers", []))
                except (requests.RequestException, ValueError):
                    ready = False
                if not ready:
                    still.append(name)
            pending = still
            if not pending:
                return
            time.sleep(1)
        raise RuntimeError(f"models not READY after {timeout}s: {pending}\n{self.log_tail()}")

    def bind_failure(self):
        """The port TorchServe could not bind, if that is why it stopped (gRPC ports are easy to forget)."""
        log = self.log_dir / START_LOG
        text = log.read_text(errors="replace") if log.exists() else ""
        match = re.search(r"Failed to bind to address (\S+)", text)
        return f": port {match.group(1)} is already in use (another TorchServe?)" if match else ""

    def log_tail(self, lines=40):
        """The end of the frontend's and the workers' logs (separate files: a worker's import error or traceback
        is only in model_log.log)."""
        tails = []
        for name in ("ts_log.log", "model_log.log"):
            log = self.log_dir / name
            text = "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(missing)"
            tails.append(f"--- {log}\n{text}")
        return "\n".join(tails)


def exit_on_sigterm():
    """Turn SIGTERM into SystemExit, so `finally` blocks stop the servers a long run started (`kill`, timeouts)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def free_ports(count):
    """Ports the OS says are free right now (held open together so they are distinct)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def start_watchdog(server):
    """Stop this private server if our process dies without its `finally` (SIGKILL): see scripts/server_watchdog."""
    pid = server.pid()
    if pid is None:
        return None
    with open(server.log_dir / "watchdog.log", "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "scripts.server_watchdog", "--owner", str(os.getpid()),
                                 "--server-pid", str(pid)], cwd=REPO, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def start_isolated(config, run_dir, model_store, java_home, models=None, overrides=None, wait=900):
    """Start a READY TorchServe from `config` on free loopback ports with its own run folder (TMPDIR) and logs.

    Used by the tests, the load-test tools and the reliability suite, so they run beside a `make serve` server and
    each other. A watchdog process stops the server if this process is killed before it can (SIGKILL)."""
    inference, management, metrics, grpc_inference, grpc_management = free_ports(5)
    props = {
        "inference_address": f"http://127.0.0.1:{inference}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        # TorchServe always starts its gRPC servers too; a taken gRPC port shuts the whole server down.
        "grpc_inference_port": str(grpc_inference),
        "grpc_management_port": str(grpc_management),
        "model_store": str(model_store),
    }
    props.update(overrides or {})
    if models is not None:
        props["load_models"] = ",".join(f"{m}.mar" for m in models)
    run_dir = Path(run_dir)
    config_path = run_dir / "config.properties"
    render_config(config, config_path, props)
    server = Server(config_path, run_dir, run_dir / "logs", java_home=java_home)
    server.start()
    start_watchdog(server)
    try:
        server.wait_ready(loaded_model_names(read_properties(config_path)), timeout=wait)
    except Exception:
        server.stop()
        raise
    return server


def dev_server(config):
    from scripts.java_home import find_java_home

    rendered = RUN_DIR / "config.properties"
    render_config(config, rendered)
    return Server(rendered, RUN_DIR, LOG_DIR, java_home=os.environ.get("JAVA_HOME") or find_java_home())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m scripts.server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--config", default=os.environ.get("TS_PROFILE_CONFIG", str(REPO / "config.properties")),
                        help="properties file (default config.properties; env TS_PROFILE_CONFIG)")
    parser.add_argument("--wait", type=int, default=900, help="seconds to wait for READY workers")
    args = parser.parse_args(argv)

    server = dev_server(args.config)
    if args.action == "stop":
        if not server.running():
            print("TorchServe is not running (nothing to stop)")
            return 0
        server.stop()
        print("TorchServe stopped")
        return 0
    if args.action == "status":
        print(f"TorchServe is {'running, pid ' + str(server.pid()) if server.running() else 'not running'}")
        return 0 if server.running() else 1
    if server.running():
        print(f"TorchServe is already running (pid {server.pid()}); `make stop` first to restart it")
    else:
        server.start()
    names = loaded_model_names(server.props)
    print(f"Waiting for {', '.join(names)} to be READY (logs: {LOG_DIR}/ts_log.log, model_log.log) ...")
    try:
        server.wait_ready(names, timeout=args.wait)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    auth = " -H \"Authorization: Bearer $(jq -r .inference.key .run/key_file.json)\"" if server.tokens() else ""
    print(f"""
TorchServe is up (pid {server.pid()}); models: {', '.join(names)}
  inference   {server.inference_url}/predictions/<model>
  management  {server.management_url}/models
  metrics     {server.metrics_url}/metrics
  logs        {LOG_DIR}/

Try:
  curl{auth} -s {server.inference_url}/predictions/minilm -H 'Content-Type: application/json' -d '{{"text": "hello world"}}'
  curl{auth} -s {server.inference_url}/predictions/classifier -H 'Content-Type: application/json' \\
       -d "{{\\"inputs\\": $(python3 -c 'print([0.1]*128)')}}"
Stop it with: make stop""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
