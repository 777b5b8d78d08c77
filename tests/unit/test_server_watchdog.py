"""The watchdog that stops a private server when its owner is SIGKILLed, and Server.stop (`make stop`), which signals
only this server's own frontend (stand-in processes, no TorchServe)."""

import signal
import subprocess
import sys
import time

import psutil
import pytest

from scripts import server, server_watchdog
from scripts.ops.cache_server import CacheServer
from scripts.ops.server import FRONTEND_CLASS, PID_FILE, Server, free_ports, process_alive

# A stand-in "server": a process with a child of its own, like TorchServe's frontend and its Python workers.
SERVER_WITH_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
)


def spawn(code, *arguments):
    return subprocess.Popen([sys.executable, "-c", code, *arguments])


def frontend_arguments(config, store="store"):
    """A stand-in's arguments as TorchServe's frontend has them (java ... ModelServer -f CONFIG -s STORE)."""
    return FRONTEND_CLASS, "-f", str(config), "-s", store


def wait_gone(pids, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline and any(process_alive(pid) for pid in pids):
        time.sleep(0.2)
    return [pid for pid in pids if process_alive(pid)]


def children_of(pid, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline:
        children = psutil.Process(pid).children(recursive=True)
        if children:
            return [child.pid for child in children]
        time.sleep(0.1)
    raise AssertionError("the stand-in server never started its child")


def test_owner_killed_stops_the_server_and_its_children():
    owner, server = spawn("import time; time.sleep(120)"), spawn(SERVER_WITH_CHILD)
    workers = children_of(server.pid)
    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scripts.server_watchdog",
            "--owner",
            str(owner.pid),
            "--server-pid",
            str(server.pid),
            "--interval",
            "0.2",
            "--grace",
            "2",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        assert process_alive(server.pid), "the watchdog stopped a server whose owner is alive"
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        server.wait(timeout=20)
        assert wait_gone(workers) == []
        assert watchdog.wait(timeout=20) == 0
        assert "owner gone" in watchdog.stdout.read()
    finally:
        for process in (owner, server, watchdog):
            process.kill()
        for pid in workers:
            if process_alive(pid):
                psutil.Process(pid).kill()


def test_watchdog_leaves_when_the_server_stops_normally():
    owner, server = spawn("import time; time.sleep(120)"), spawn("import time; time.sleep(120)")
    try:
        server.terminate()
        server.wait()
        assert server_watchdog.watch(owner.pid, server.pid, interval=0.1, grace=1) == "server stopped by its owner"
        assert process_alive(owner.pid)
    finally:
        owner.kill()
        server.kill()


def test_server_stop_returns_after_the_frontend_and_its_workers_exited(tmp_path):
    """Server.stop (`make stop`) must not say "stopped" while the frontend still lives (the JVM outlived the old
    `torchserve --stop` by seconds): it waits for the process tree it stopped."""
    server_process = spawn(SERVER_WITH_CHILD, *frontend_arguments(tmp_path / "config.properties"))
    workers = children_of(server_process.pid)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / PID_FILE).write_text(str(server_process.pid))
    (tmp_path / "config.properties").write_text("model_store=store\n")
    server = Server(tmp_path / "config.properties", run_dir, tmp_path / "logs")
    assert server.running()
    try:
        assert server.stop(timeout=3) is True
        server_process.wait(timeout=5)  # reap it: it is our child here (a real frontend is not)
        assert not any(process_alive(pid) for pid in workers), "stop returned while a worker still ran"
        assert not server.running() and not (run_dir / PID_FILE).exists()
        assert server.stop() is False  # nothing left to stop
    finally:
        for pid in [server_process.pid, *workers]:
            if process_alive(pid):
                psutil.Process(pid).kill()


@pytest.mark.parametrize(
    "command",
    [["sleep", "120"], [sys.executable, "-c", "import time; time.sleep(120)", *frontend_arguments("/elsewhere/c.p")]],
    ids=["a sleep", "another checkout's TorchServe"],
)
def test_stop_leaves_the_process_a_stale_pid_file_names_alive(tmp_path, monkeypatch, capsys, command):
    """The server died (or the machine rebooted) and its pid now names another process: `make stop` must not signal
    it, says the pid file was stale, and removes it (torchserve --start would refuse to start while it names a live
    process)."""
    bystander = subprocess.Popen(command)
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / PID_FILE).write_text(str(bystander.pid))
        (tmp_path / "config.properties").write_text("model_store=store\n")
        ours = Server(tmp_path / "config.properties", run_dir, tmp_path / "logs")
        monkeypatch.setattr(server.cache_server, "stop_all", lambda log: None)  # not this test's to stop
        assert not ours.running() and ours.status()["running"] is False
        assert server.stop(ours) == server.EXIT_OK
        out = capsys.readouterr().out
        assert f"pid file {run_dir / PID_FILE} was stale" in out and f"pid {bystander.pid}" in out
        assert "not signalled" in out
        assert bystander.poll() is None and process_alive(bystander.pid)
        assert not (run_dir / PID_FILE).exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_a_stale_cache_server_pid_file_does_not_get_its_process_signalled(tmp_path):
    """`make stop` stops the shared cache servers too, by their pid files: the same rule holds for them."""
    bystander = subprocess.Popen(["sleep", "120"])
    try:
        cache = CacheServer(free_ports(1)[0], tmp_path / "cache")
        cache.run_dir.mkdir()
        cache.pid_file.write_text(f"{bystander.pid}\n")
        assert not cache.running()
        assert cache.stop() is False
        cache.kill()
        assert bystander.poll() is None and process_alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()


def test_the_watchdogs_metrics_say_which_model_is_stuck():
    """ts_model_stuck and friends as the watchdog serves them (its view set by hand; the integration test
    tests/integration/test_model_stall.py serves them from a real stall)."""
    from scripts.ops.management import ManagementClient
    from scripts.ops.progress import Verdict

    watch = server_watchdog.ModelWatch(ManagementClient("http://127.0.0.1:9"), "http://127.0.0.1:9", 60)
    watch.verdicts = [
        Verdict("classifier", "1.0", True, 61.5, 2, 3),
        Verdict("minilm", "1.0", False, 0.0, 0, 0),
    ]
    watch.restarts, watch.last_check = {"classifier": 2}, 1700000000.0
    (port,) = free_ports(1)
    server_ = server_watchdog.serve_metrics(watch, port, "127.0.0.1")
    try:
        import requests

        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert requests.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 404
    finally:
        server_.shutdown()
    assert 'ts_model_stuck{model_name="classifier",model_version="1.0"} 1' in text
    assert 'ts_model_stuck{model_name="minilm",model_version="1.0"} 0' in text
    assert 'ts_model_stalled_seconds{model_name="classifier",model_version="1.0"} 61.500' in text
    assert 'ts_model_watchdog_restarts_total{model_name="classifier"} 2' in text
    assert "ts_model_watchdog_last_check_timestamp_seconds 1700000000.000" in text


@pytest.mark.parametrize(
    "arguments, message",
    [
        ([], "nothing to watch"),
        (["--owner", "1"], "go together"),
        (["--management-url", "x", "--stuck-after", "0"], ""),
    ],
)
def test_watchdog_usage_errors(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        server_watchdog.main(arguments)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
