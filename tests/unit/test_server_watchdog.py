"""The watchdog that stops a private server when its owner is SIGKILLed (stand-in processes, no TorchServe)."""

import signal
import subprocess
import sys
import time

import psutil

from scripts import server_watchdog

# A stand-in "server": a process with a child of its own, like TorchServe's frontend and its Python workers.
SERVER_WITH_CHILD = ("import subprocess, sys, time; "
                     "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)")


def spawn(code):
    return subprocess.Popen([sys.executable, "-c", code])


def wait_gone(pids, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline and any(server_watchdog.alive(pid) for pid in pids):
        time.sleep(0.2)
    return [pid for pid in pids if server_watchdog.alive(pid)]


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
    watchdog = subprocess.Popen([sys.executable, "-m", "scripts.server_watchdog", "--owner", str(owner.pid),
                                 "--server-pid", str(server.pid), "--interval", "0.2", "--grace", "2"],
                                stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        assert server_watchdog.alive(server.pid), "the watchdog stopped a server whose owner is alive"
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
            if server_watchdog.alive(pid):
                psutil.Process(pid).kill()


def test_watchdog_leaves_when_the_server_stops_normally():
    owner, server = spawn("import time; time.sleep(120)"), spawn("import time; time.sleep(120)")
    try:
        server.terminate()
        server.wait()
        assert server_watchdog.watch(owner.pid, server.pid, interval=0.1, grace=1) == "server stopped by its owner"
        assert server_watchdog.alive(owner.pid)
    finally:
        owner.kill()
        server.kill()
