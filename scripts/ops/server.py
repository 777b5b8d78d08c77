"""The one server lifecycle: render a properties file, start TorchServe, wait until its models are READY, report its
status, stop it and wait until it is gone; private servers on free ports with a watchdog.

`make serve` (scripts/server.py), the tests (tests/conftest.py), the load tools (loadtests/) and the reliability
suite (scripts/reliability/) all start and stop servers through this module. A server runs in its own folder (TMPDIR
and working directory: TorchServe keeps one pid file per TMPDIR and writes key_file.json there) with its logs in
another, so private servers run beside a `make serve` server and each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import requests

from handlers.core import cpu
from scripts.ops.auth import KeySource, bearer
from scripts.ops.management import ManagementClient, ManagementError, ready_workers

REPO = Path(__file__).resolve().parents[2]
RUN_DIR = REPO / ".run"
LOG_DIR = REPO / "logs"
CONFIG_DIR = REPO / "config"
DEFAULT_CONFIG = REPO / "config.properties"
PATH_KEYS = ("model_store", "metrics_config")
# The JVM option naming the log4j2 configuration (config/log4j2.xml), inside `vmargs`: made absolute like PATH_KEYS,
# because TorchServe runs in .run/ (or a test's own folder), where a relative path would not resolve.
LOG_CONFIG_OPTION = "-Dlog4j.configurationFile="
START_LOG = "torchserve-start.log"
PID_FILE = ".model_server.pid"
# The main class on TorchServe's frontend command line (java ... org.pytorch.serve.ModelServer -f CONFIG -s STORE).
FRONTEND_CLASS = "org.pytorch.serve.ModelServer"

Log = Callable[[str], None]
Properties = dict[str, str]


# ----------------------------------------------------------------------------------------------- configuration
def read_properties(path: str | os.PathLike) -> Properties:
    props = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def profiles() -> list[str]:
    """The server profiles in config/ (config/<name>.properties), for `make serve PROFILE=<name>`."""
    return sorted(path.stem for path in CONFIG_DIR.glob("*.properties"))


class ProfileError(ValueError):
    """A properties file that does not exist; the message lists the profiles that do."""


def check_config(path: str | os.PathLike) -> Path:
    """`path` when it exists, else a ProfileError naming the profiles in config/ (a typo in PROFILE= must not end
    in a traceback)."""
    path = Path(path)
    if path.is_file():
        return path
    raise ProfileError(
        f"{path} does not exist; the profiles are: {', '.join(profiles()) or '(none)'} "
        f"(config/<name>.properties, `make serve PROFILE=<name>`), or no PROFILE for config.properties"
    )


def model_store_regex(model_store: str | os.PathLike) -> str:
    """`{model_store}` in a properties value (allowed_urls) -> the model store path as a literal Java regex.

    \\Q...\\E quotes the path; the backslashes are doubled because Java's Properties.load drops single ones."""
    return "\\\\Q" + str(model_store) + "\\\\E"


def absolute_log_config(vmargs: str) -> str:
    """`vmargs` with the log4j2 configuration path made absolute against the repo (other JVM options unchanged).

    TorchServe splits vmargs on whitespace, so a path cannot contain spaces either way."""
    words = []
    for word in vmargs.split():
        if word.startswith(LOG_CONFIG_OPTION):
            path = word[len(LOG_CONFIG_OPTION) :]
            if "://" not in path and not os.path.isabs(path):
                word = LOG_CONFIG_OPTION + str(REPO / path)
        words.append(word)
    return " ".join(words)


def log_config_path(props: Properties) -> Path | None:
    """The log4j2 configuration file a (rendered) properties dict starts TorchServe with, or None."""
    for word in props.get("vmargs", "").split():
        if word.startswith(LOG_CONFIG_OPTION):
            return Path(word[len(LOG_CONFIG_OPTION) :].removeprefix("file://"))
    return None


def render_config(
    source: str | os.PathLike, destination: str | os.PathLike, overrides: Properties | None = None
) -> Properties:
    """Copy a properties file, making relative paths absolute (against the repo) and applying overrides."""
    props = read_properties(source)
    for key in PATH_KEYS:
        if key in props and not os.path.isabs(props[key]):
            props[key] = str(REPO / props[key])
    if "vmargs" in props:
        props["vmargs"] = absolute_log_config(props["vmargs"])
    props.update(overrides or {})
    if "model_store" in props:
        props = {
            key: value.replace("{model_store}", model_store_regex(props["model_store"])) for key, value in props.items()
        }
    Path(destination).parent.mkdir(parents=True, exist_ok=True)
    Path(destination).write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return props


def loaded_model_names(props: Properties) -> list[str]:
    names = []
    for item in props.get("load_models", "").split(","):
        item = item.strip()
        if item and item.lower() != "all":
            names.append(item.split("=", 1)[0] if "=" in item else Path(item).stem)
    return names


def archives_present(props: Properties, store: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The config's load_models split into archives that exist and ones that do not (a missing one would keep a
    server from READY)."""
    present: list[str] = []
    missing: list[str] = []
    for item in props.get("load_models", "").split(","):
        item = item.strip()
        if not item:
            continue
        archive = item.split("=", 1)[-1]
        (present if (Path(store) / archive).exists() else missing).append(item)
    return present, missing


# ----------------------------------------------------------------------------------------------- processes
def free_ports(count: int) -> list[int]:
    """Ports the OS says are free right now (held open together so they are distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def port_holder(port: int) -> str | None:
    """The program listening on a local TCP port, as "pid 123 (its command line)", where /proc shows it (Linux; the
    process must be this user's to see its sockets); None when it cannot tell."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local address "0100007F:1F90", state 0A = LISTEN, inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (process / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    command = (process / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    return f"pid {process.name} ({shortened(command.strip(), 100)})"
    return None


def shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def address_port(address: str) -> tuple[str, int] | None:
    """(host, port) of "http://127.0.0.1:8080", "0.0.0.0:7070" or "/0.0.0.0:7070"; None without a port."""
    match = re.search(r"(?:^|//|/)([^/:]*):(\d+)/?$", address.strip())
    if match is None:
        return None
    return (match.group(1) or "0.0.0.0"), int(match.group(2))


def in_use_message(port: int) -> str:
    holder = port_holder(port)
    return f"port {port} is already in use by " + (holder or "another program (not one of this user's, or gone)")


def answers(url: str, timeout: float = 2.0) -> bool:
    """True when an HTTP server answers at url (any status: a 404 still means something listens)."""
    try:
        requests.get(url, timeout=timeout)
        return True
    except requests.RequestException:
        return False


def process_alive(pid: int | None) -> bool:
    """True while the process exists and is not a zombie."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def argument(argv: list[str], option: str) -> str | None:
    """The value after `option` on a command line, or None."""
    return argv[argv.index(option) + 1] if option in argv[:-1] else None


def stop_process_tree(pid: int, grace: float) -> None:
    """SIGTERM the process (TorchServe's frontend, whose shutdown hook stops the workers), wait up to `grace` seconds
    for it and its children to exit, then SIGKILL what remains; returns when all are gone."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    with contextlib.suppress(psutil.Error):
        root.terminate()
    _, remaining = psutil.wait_procs(tree, timeout=grace)
    for process in remaining:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(remaining, timeout=10)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so `finally` blocks stop the servers a long run started (`kill`, timeouts)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def java_home() -> str:
    """$JAVA_HOME, else a Java >= 17 found (or installed) by scripts/java_home.py."""
    from scripts.java_home import find_java_home

    return os.environ.get("JAVA_HOME") or str(find_java_home(verbose=False))


# ----------------------------------------------------------------------------------------------- the server
class Server:
    """One TorchServe instance: its config, its run folder (TMPDIR, working dir) and its logs."""

    def __init__(
        self,
        config_path: str | os.PathLike,
        run_dir: str | os.PathLike,
        log_dir: str | os.PathLike,
        java_home: str | os.PathLike | None = None,
        extra_env: dict[str, str] | None = None,
    ):
        self.config_path = Path(config_path)
        # Environment for the frontend and so its workers (e.g. the shared cache url a test session points it at).
        self.extra_env = dict(extra_env or {})
        self.run_dir = Path(run_dir)
        self.log_dir = Path(log_dir)
        self.props = read_properties(self.config_path)
        self.java_home = java_home
        self.inference_url = self.props.get("inference_address", "http://127.0.0.1:8080")
        self.management_url = self.props.get("management_address", "http://127.0.0.1:8081")
        self.metrics_url = self.props.get("metrics_address", "http://127.0.0.1:8082")

    @property
    def key_file(self) -> Path:
        return self.run_dir / "key_file.json"

    def tokens(self) -> dict[str, str | None]:
        """TorchServe's own key file (written in its working dir) when token authorization is on."""
        try:
            keys = json.loads(self.key_file.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:  # TorchServe is writing it during start-up: not there yet (wait_ready asks again)
            return {}
        return {name: keys.get(name, {}).get("key") for name in ("management", "inference")}

    def headers(self, api: str) -> dict[str, str]:
        return bearer(self.tokens().get(api))

    def management(self, timeout: float = 30.0, authorized: bool = True) -> ManagementClient:
        """A management-API client with this server's management token (when it has one; none if not `authorized`,
        to see the server refuse)."""
        token = self.tokens().get("management") if authorized else None
        if token is None:
            return ManagementClient(self.management_url, None, f"key file {self.key_file}", self.key_file, timeout)
        # Re-read after a rotation (modelctl keep-keys-fresh), starting from the key read above.
        keys = KeySource("management", self.key_file, token)
        return ManagementClient(self.management_url, timeout=timeout, keys=keys)

    def env(self) -> dict[str, str]:
        from handlers.core.answer_size import LIMIT_ENV, TORCHSERVE_DEFAULT  # handlers import torch: only when starting
        from handlers.core.cores import LEASE_DIR_ENV

        env = dict(os.environ)
        env.update(
            TMPDIR=str(self.run_dir),
            TEMP=str(self.run_dir),
            LOG_LOCATION=str(self.log_dir),
            METRICS_LOCATION=str(self.log_dir),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TORCHINDUCTOR_CACHE_DIR=str(self.run_dir / "inductor-cache"),
        )
        # TorchServe does not tell a worker its max_response_size, and a larger answer kills the worker: the workers
        # read it from here, under TorchServe's own environment name for the key (handlers/core/answer_size.py).
        env[LIMIT_ENV] = self.props.get("max_response_size", str(TORCHSERVE_DEFAULT)).strip()
        # One core lease for every worker of this server: a batch borrows the cores no other worker is computing on
        # (handlers/core/cores.py; a model's handler.borrow_idle_cores: false opts out).
        env[LEASE_DIR_ENV] = str(self.run_dir / "core-lease")
        env.update(self.extra_env)
        # TorchServe passes its environment to the workers: a TS_CPU_AS kind caps the libraries' instruction set there
        # from the worker's start (ATen fixes its choice at the first tensor operation; handlers/core/cpu.py).
        env.update(cpu.library_environment(env))
        if self.java_home:
            env["JAVA_HOME"] = str(self.java_home)
            env["PATH"] = f"{Path(self.java_home) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        return env

    def start(self) -> None:
        """`torchserve --start` (it returns once the frontend runs; models load after)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.forget_stale_pid()
        command = [
            str(Path(sys.executable).parent / "torchserve"),
            "--start",
            "--ncs",
            "--ts-config",
            str(self.config_path),
            "--model-store",
            self.props["model_store"],
        ]
        # The JVM's stdout/stderr: start-up output only (config/log4j2.xml), one start per file; the previous start's
        # is kept as .1, so restarts do not make it grow either.
        start_log = self.log_dir / START_LOG
        if start_log.exists() and start_log.stat().st_size:
            start_log.replace(start_log.with_name(START_LOG + ".1"))
        with open(start_log, "wb") as out:
            result = subprocess.run(command, cwd=self.run_dir, env=self.env(), stdout=out, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            raise RuntimeError(f"torchserve --start failed (exit {result.returncode}); see {self.log_dir}")

    def pid(self) -> int | None:
        try:
            return int((self.run_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def owns(self, pid: int | None) -> bool:
        """True when `pid` is this server's frontend: TorchServe's main class started with this server's config file
        and model store, as start() launches it. A pid file outlives a server that crashed or was killed (or a
        machine that rebooted), and its pid may since name any process: that one is never signalled."""
        if not pid:
            return False
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            argv = process.cmdline()
        except psutil.Error:
            return False
        return (
            FRONTEND_CLASS in argv
            and argument(argv, "-f") == str(self.config_path)
            and argument(argv, "-s") == self.props.get("model_store")
        )

    def running(self) -> bool:
        return self.owns(self.pid())

    def stale_pid(self) -> int | None:
        """The pid the pid file names when that is not this server (exited, or another program now): else None."""
        pid = self.pid()
        return pid if pid is not None and not self.owns(pid) else None

    def forget_stale_pid(self) -> None:
        """Remove a stale pid file (torchserve --start refuses to start while its pid names any live process)."""
        if self.stale_pid() is not None:
            with contextlib.suppress(OSError):
                (self.run_dir / PID_FILE).unlink()

    def stop(self, timeout: float = 60.0) -> bool:
        """Stop the server as `torchserve --stop` does (SIGTERM to the frontend), and return only once the frontend
        and its workers have exited (SIGKILL after `timeout` seconds). False when it was not running; a stale pid
        file is removed then, and the process it names (if any) is left alone."""
        pid = self.pid()
        if pid is None or not self.owns(pid):
            self.forget_stale_pid()
            return False
        stop_process_tree(pid, timeout)
        with contextlib.suppress(OSError):
            (self.run_dir / PID_FILE).unlink()
        return True

    def model_ready(self, client: ManagementClient, name: str) -> bool:
        """At least one READY worker for the model's default version."""
        try:
            return bool(ready_workers(client.description(name)))
        except (ManagementError, IndexError, KeyError):
            return False

    def wait_ready(self, names: list[str], timeout: float = 600.0) -> None:
        """Wait until each model has at least one READY worker; raise with the log tail if it does not happen."""
        deadline = time.time() + timeout
        pending = list(names)
        while time.time() < deadline:
            if not self.running():
                raise RuntimeError(f"TorchServe exited during start-up{self.bind_failure()}\n{self.log_tail()}")
            # A new client each round: with token authorization TorchServe writes key_file.json during start-up.
            client = self.management(timeout=10)
            pending = [name for name in pending if not self.model_ready(client, name)]
            if not pending:
                return
            time.sleep(1)
        raise RuntimeError(f"models not READY after {timeout}s: {pending}\n{self.log_tail()}")

    def wait_listening(self, timeout: float = 120.0) -> None:
        """Wait for the frontend to listen (with no model loaded, wait_ready has nothing to wait for)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                self.management(timeout=2).request("GET", "/models")
                return
            except ManagementError:
                pass
            if not self.running():
                raise RuntimeError(f"TorchServe exited during start-up\n{self.log_tail()}")
            time.sleep(0.5)
        raise RuntimeError(f"{self.management_url} did not answer within {timeout}s\n{self.log_tail()}")

    def status(self) -> dict[str, Any]:
        """Whether it runs (pid), its URLs, and each registered model's READY workers (when it answers)."""
        pid = self.pid()
        state: dict[str, Any] = {
            "running": self.owns(pid),
            "pid": pid,
            "inference": self.inference_url,
            "management": self.management_url,
            "metrics": self.metrics_url,
            "models": {},
        }
        if state["running"]:
            client = self.management(timeout=5)
            try:
                for entry in client.list_models():
                    description = client.description(entry["modelName"])
                    state["models"][entry["modelName"]] = {
                        "version": description.get("modelVersion"),
                        "ready_workers": len(ready_workers(description)),
                        "min_workers": description.get("minWorkers"),
                    }
            except ManagementError as error:
                state["management_error"] = str(error)
        return state

    def ports(self) -> dict[str, tuple[str, int]]:
        """The (host, port) each of this server's listeners binds, by its properties key."""
        ports = {}
        for key, address in (
            ("inference_address", self.inference_url),
            ("management_address", self.management_url),
            ("metrics_address", self.metrics_url),
        ):
            found = address_port(address)
            if found is not None:
                ports[key] = found
        for key, default in (("grpc_inference_port", 7070), ("grpc_management_port", 7071)):
            with contextlib.suppress(ValueError):
                ports[key] = ("0.0.0.0", int(self.props.get(key, default)))
        return ports

    def ports_in_use(self) -> list[str]:
        """Before a start: each port this server needs that another program holds, with that program where it can
        be seen (TorchServe would stop at once, with the reason only in its start-up log)."""
        return [
            f"{in_use_message(port)} (needed for {key})"
            for key, (host, port) in self.ports().items()
            if port_taken(port, "127.0.0.1" if host in ("localhost", "") else host)
        ]

    def bind_failure(self) -> str:
        """The port TorchServe could not bind, and who holds it, if that is why it stopped (its start-up log says
        "Failed to bind to address: http://127.0.0.1:8080 ... Address already in use"; gRPC ports are easy to
        forget)."""
        log = self.log_dir / START_LOG
        text = log.read_text(errors="replace") if log.exists() else ""
        match = re.search(r"Failed to bind to address:?\s*(\S+)", text)
        if match is None:
            in_use = "Address already in use" in text
            return f": a port is already in use (see {START_LOG} in {self.log_dir})" if in_use else ""
        found = address_port(match.group(1))
        shown = log.relative_to(REPO) if log.is_relative_to(REPO) else log
        where = f" ({shown} says: Failed to bind to address {match.group(1)}, Address already in use)"
        return f": {in_use_message(found[1])}{where}" if found else f": cannot bind {match.group(1)}{where}"

    def log_tail(self, lines: int = 40) -> str:
        """The end of the frontend's and the workers' logs (separate files: a worker's import error or traceback
        is only in model_log.log)."""
        tails = []
        for name in ("ts_log.log", "model_log.log"):
            log = self.log_dir / name
            text = "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(missing)"
            tails.append(f"--- {log}\n{text}")
        return "\n".join(tails)


# ----------------------------------------------------------------------------------------------- ways to start
def start_watchdog(server: Server) -> subprocess.Popen | None:
    """Stop this private server if our process dies without its `finally` (SIGKILL): see scripts/server_watchdog."""
    pid = server.pid()
    if pid is None:
        return None
    with open(server.log_dir / "watchdog.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "scripts.server_watchdog", "--owner", str(os.getpid()), "--server-pid", str(pid)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start_isolated(
    config: str | os.PathLike,
    run_dir: str | os.PathLike,
    model_store: str | os.PathLike,
    java_home: str | os.PathLike | None,
    models: list[str] | None = None,
    overrides: Properties | None = None,
    wait: float = 900,
    env: dict[str, str] | None = None,
) -> Server:
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
    server = Server(config_path, run_dir, run_dir / "logs", java_home=java_home, extra_env=env)
    server.start()
    start_watchdog(server)
    try:
        server.wait_ready(loaded_model_names(read_properties(config_path)), timeout=wait)
    except Exception:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def private_server(
    name: str,
    model_store: str | os.PathLike,
    models: list[str],
    config: str | os.PathLike = DEFAULT_CONFIG,
    overrides: Properties | None = None,
    wait: float = 900,
    keep_logs_in: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """A TorchServe on free loopback ports (gRPC included) with its own run folder under build/, model API on and no
    tokens (it is private to this process); always stopped afterwards, its logs copied to `keep_logs_in`."""
    run_dir = REPO / "build" / "private-servers" / f"{name}-{os.getpid()}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    props = {"disable_token_authorization": "true", "enable_model_api": "true", **(overrides or {})}
    from handlers.text.shared_cache import URL_ENV

    # Private also means no shared embedding cache (a `make serve` one would carry entries between runs) unless `env`
    # names one (loadtests/cache_report.py).
    env = {URL_ENV: "", **(env or {})}
    server = start_isolated(config, run_dir, model_store, java_home(), models, props, wait, env)
    try:
        server.wait_listening()
        yield server
    finally:
        server.stop()
        if keep_logs_in:
            Path(keep_logs_in).mkdir(parents=True, exist_ok=True)
            for log in (run_dir / "logs").glob("*.log"):
                shutil.copy2(log, Path(keep_logs_in) / log.name)
        shutil.rmtree(run_dir, ignore_errors=True)


def dev_server(config: str | os.PathLike = DEFAULT_CONFIG, overrides: Properties | None = None) -> Server:
    """The development server (`make serve`): `config` rendered into .run/, logs in logs/."""
    rendered = RUN_DIR / "config.properties"
    render_config(check_config(config), rendered, overrides)
    return Server(rendered, RUN_DIR, LOG_DIR, java_home=java_home())


@contextlib.contextmanager
def development_server(
    config: str | os.PathLike = DEFAULT_CONFIG, log: Log = print, wait: float = 900
) -> Iterator[dict[str, Any]]:
    """Yield the config's server (its URLs): the one answering at its address, else one started here (without the
    archives not built yet) and stopped afterwards, only in that case."""
    props = read_properties(check_config(config))
    inference = props.get("inference_address", "http://127.0.0.1:8080")
    if answers(f"{inference}/ping"):
        log(f"using the TorchServe already answering at {inference}")
        yield {
            "inference": inference,
            "management": props.get("management_address"),
            "metrics": props.get("metrics_address"),
            "started": False,
        }
        return
    present, missing = archives_present(props, REPO / props.get("model_store", "model_store"))
    if missing:
        log(f"note: {', '.join(missing)} not built (model_store/); starting without them")
    log(f"no server answers at {inference}: starting one (logs in {LOG_DIR}) ...")
    overrides = {"load_models": ",".join(present)}
    # TorchServe always starts gRPC and shuts down when its port is taken (e.g. by another TorchServe on this
    # machine); the load tools never use gRPC, so move it out of the way instead of failing.
    for key, default in (("grpc_inference_port", 7070), ("grpc_management_port", 7071)):
        port = int(props.get(key, default))
        if port_taken(port):
            overrides[key] = str(free_ports(1)[0])
            log(f"note: gRPC port {port} is taken; this server uses {overrides[key]} ({key})")
    server = dev_server(config, overrides)
    if server.running():
        raise RuntimeError(
            f"a TorchServe of this checkout runs (pid {server.pid()}) but does not answer at "
            f"{inference}; `make stop` it first"
        )
    server.start()
    try:
        server.wait_ready(loaded_model_names(server.props), timeout=wait)
        yield {
            "inference": server.inference_url,
            "management": server.management_url,
            "metrics": server.metrics_url,
            "started": True,
        }
    finally:
        log("stopping the TorchServe this run started")
        server.stop()
