"""The core lease shared by one server's workers (handlers/core/cores.py), between real processes: a worker gets its
own share while another holds cores (without waiting), only the free ones on top; cores come back when the holder
lets go, exits, or is killed mid-forward (flock locks die with their holder); without TS_CORE_LEASE_DIR there is no
lease."""

import multiprocessing
import os
import signal

import pytest

from handlers.core.cores import LEASE_DIR_ENV, CoreLease, lease_from_environment

CORES = 3  # a lease over more lock files than this machine has cores: the files are what is leased


def hold_until_told(directory: str, own: int, widen: bool, held, go) -> None:
    """A second worker: holds cores from the lease, says how many, keeps them until ``go`` (or until killed)."""
    lease = CoreLease(directory, CORES)
    with lease.hold(own, widen) as count:
        held.value = count
        go.wait()


@pytest.fixture
def holder(tmp_path):
    context = multiprocessing.get_context("fork")
    started = []

    def start(own: int, widen: bool):
        held, go = context.Value("i", 0), context.Event()
        process = context.Process(target=hold_until_told, args=(str(tmp_path), own, widen, held, go), daemon=True)
        process.start()
        started.append(process)
        for _ in range(500):
            if held.value:
                break
            process.join(0.01)
        assert held.value == own if not widen else held.value >= own
        return process, held, go

    yield start
    for process in started:
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
        process.join(5)


def test_a_lone_worker_takes_every_core_and_only_its_share_when_not_widening(tmp_path):
    lease = CoreLease(tmp_path, CORES)
    with lease.hold(1) as count:
        assert count == CORES
    with lease.hold(1, widen=False) as count:
        assert count == 1
    with lease.hold(1) as count:  # everything was given back after each forward
        assert count == CORES


def test_a_second_worker_gets_fewer_cores_while_the_first_holds_some_and_all_once_it_lets_go(tmp_path, holder):
    process, _, go = holder(2, False)
    lease = CoreLease(tmp_path, CORES)
    with lease.hold(1) as count:
        assert count == 1  # its own share: the other two are taken
    go.set()
    process.join(5)
    assert process.exitcode == 0
    with lease.hold(1) as count:
        assert count == CORES


def test_a_worker_killed_while_holding_cores_leaves_none_taken(tmp_path, holder):
    process, held, _ = holder(1, True)
    assert held.value == CORES  # it borrowed every core
    lease = CoreLease(tmp_path, CORES)
    os.kill(process.pid, signal.SIGKILL)  # dies mid-forward, never reaching its release
    process.join(5)
    with lease.hold(1) as count:
        assert count == CORES


def test_a_worker_whose_share_a_borrower_holds_computes_on_its_share_without_waiting(tmp_path, holder):
    """A borrower holds every core: the next worker does not wait for the borrower's forward pass to end (a short
    request behind a long one), it computes on its own share; the cores come back when the borrower lets go."""
    process, _, go = holder(1, True)
    lease = CoreLease(tmp_path, CORES)
    with lease.hold(1) as count:
        assert count == 1
    go.set()
    process.join(5)
    with lease.hold(1) as count:
        assert count == CORES


def test_no_lease_without_the_servers_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(LEASE_DIR_ENV, raising=False)
    assert lease_from_environment() is None
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "lease"))
    lease = lease_from_environment()
    assert lease is not None and lease.cores == len(os.sched_getaffinity(0))
    assert sorted(path.name for path in (tmp_path / "lease").iterdir()) == [
        f"core-{index}.lock" for index in range(lease.cores)
    ]
