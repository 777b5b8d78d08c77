"""`make serve` with a port another program holds: the port and the program are named before anything starts
(scripts/server.py), TorchServe's own start-up failure is explained from its start-up log (scripts/ops/server.py), and
cache servers started for a server that never came up are stopped again."""

import os
import socket

import pytest

from scripts import server as serve
from scripts.ops import server as ops


@pytest.fixture
def held_port():
    """A port this test process listens on (another program, to the server being started)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_the_program_holding_a_port_is_named(held_port):
    holder = ops.port_holder(held_port)
    assert holder is not None and holder.startswith(f"pid {os.getpid()} (") and "python" in holder
    assert ops.port_holder(ops.free_ports(1)[0]) is None


@pytest.mark.parametrize(
    "address, expected",
    [
        ("http://127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("https://0.0.0.0:8443/", ("0.0.0.0", 8443)),
        ("/0.0.0.0:7070", ("0.0.0.0", 7070)),
        ("http://localhost", None),
    ],
)
def test_addresses_are_read_for_their_port(address, expected):
    assert ops.address_port(address) == expected


def dev_server_on(tmp_path, inference_port):
    ports = ops.free_ports(4)
    overrides = {
        "inference_address": f"http://127.0.0.1:{inference_port}",
        "management_address": f"http://127.0.0.1:{ports[0]}",
        "metrics_address": f"http://127.0.0.1:{ports[1]}",
        "grpc_inference_port": str(ports[2]),
        "grpc_management_port": str(ports[3]),
        "load_models": "",
    }
    rendered = tmp_path / "config.properties"
    ops.render_config(ops.DEFAULT_CONFIG, rendered, overrides)
    return ops.Server(rendered, tmp_path / "run", tmp_path / "logs")


def test_serve_refuses_to_start_naming_the_port_and_its_holder_and_starts_no_cache(
    tmp_path, held_port, monkeypatch, capsys
):
    server = dev_server_on(tmp_path, held_port)
    started = []
    monkeypatch.setattr(serve.cache_server, "start_for_models", lambda *args, **kwargs: started.append("cache"))
    monkeypatch.setattr(server, "start", lambda: started.append("torchserve"))
    assert serve.start(server, wait=5) == serve.EXIT_FAILED
    error = capsys.readouterr().err
    assert f"port {held_port} is already in use by pid {os.getpid()}" in error and "inference_address" in error
    assert started == []


def test_torchserves_own_bind_failure_is_explained_from_its_start_up_log(tmp_path, held_port):
    server = dev_server_on(tmp_path, held_port)
    server.log_dir.mkdir(parents=True)
    (server.log_dir / ops.START_LOG).write_text(
        "2026-12-02T01:19:51,385 [INFO ] main org.pytorch.serve.ModelServer - Torchserve stopped.\n"
        f"java.io.IOException: Failed to bind to address: http://127.0.0.1:{held_port}\n"
        "Caused by: io.netty.channel.unix.Errors$NativeIoException: bind(..) failed: Address already in use\n"
    )
    reason = server.bind_failure()
    assert f"port {held_port} is already in use by pid {os.getpid()}" in reason and "Address already in use" in reason


def test_cache_servers_started_for_a_server_that_never_came_up_are_stopped(tmp_path, monkeypatch, capsys):
    server = dev_server_on(tmp_path, ops.free_ports(1)[0])

    class Cache:
        def __init__(self, port, running):
            self.port, self.is_running, self.stopped = port, running, False

        def running(self):
            return self.is_running

        def stop(self):
            self.stopped = True
            return True

    old, new = Cache(6390, True), Cache(6391, False)
    caches = [old]
    monkeypatch.setattr(serve.cache_server, "started_servers", lambda: caches)
    monkeypatch.setattr(serve.cache_server, "start_for_models", lambda *args, **kwargs: caches.append(new) or {})

    def fails():
        raise RuntimeError("torchserve --start failed (exit 1)")

    monkeypatch.setattr(server, "start", fails)
    assert serve.start(server, wait=5) == serve.EXIT_FAILED
    assert new.stopped and not old.stopped  # only the one this start launched
    assert "shared cache on port 6391 stopped" in capsys.readouterr().err
