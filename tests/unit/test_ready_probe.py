"""scripts/ready_probe.py (through scripts/ops/management.py and scripts/ops/progress.py) against a stub of
TorchServe's management and metrics APIs: ready only when every model has its workers READY and none is stuck.
(Worker states as TorchServe 0.12 reports them: a loading worker is "UNLOADING" until it is "READY"; a wedged one is
still "READY".)"""

import time

import pytest

from scripts import ready_probe
from scripts.ops.server import free_ports
from tests.stub_http import stub_http_server


def describe(name, statuses, min_workers=1, pending=0):
    return [
        {
            "modelName": name,
            "modelVersion": "1.0",
            "minWorkers": min_workers,
            "workers": [{"id": str(9000 + n), "status": s, "startTime": "t0"} for n, s in enumerate(statuses)],
            "jobQueueStatus": {"remainingCapacity": 100, "pendingRequests": pending},
        }
    ]


def metrics_text(counters):
    """TorchServe's Prometheus text (its trailing comma in the labels too) for {model: (received, answered)}."""
    lines = []
    for name, (received, answered) in counters.items():
        labels = f'model_name="{name}",model_version="default",hostname="h",'
        lines += [f"ts_inference_requests_total{{{labels}}} {received}"]
        lines += [f"ts_inference_latency_microseconds{{{labels}}} {answered}"]
    return ("# HELP ...\n" + "\n".join(lines) + "\n").encode()


@pytest.fixture
def stub_api():
    """Answers GET /models, /models/{name} from `state` (name -> describe arguments) and /metrics from `counters`."""
    state, counters = {}, {}

    def answer(method, path, headers):
        if path == "/models":
            return 200, {"models": [{"modelName": n, "modelUrl": f"{n}.mar"} for n in state]}
        if path == "/metrics":
            return 200, metrics_text(counters)
        name = path.rsplit("/", 1)[-1]
        return 200, describe(name, *state[name])

    with stub_http_server(answer) as url:
        yield url, state, counters


def run_probe(url, tmp_path, *extra):
    state_file = tmp_path / "state.json"
    return ready_probe.main(["--management-url", url, "--metrics-url", url, "--state-file", str(state_file), *extra])


def test_ready_when_every_model_has_its_workers(stub_api, tmp_path, capsys):
    url, state, _ = stub_api
    state.update(classifier=(["READY"],), minilm=(["READY", "READY"], 2))
    assert run_probe(url, tmp_path) == 0
    assert capsys.readouterr().out.strip() == "ready"


def test_not_ready_while_a_worker_loads(stub_api, tmp_path, capsys):
    url, state, _ = stub_api
    state.update(classifier=(["READY"],), minilm=(["UNLOADING"],))
    assert run_probe(url, tmp_path) == 1
    assert "minilm 1.0: 0/1 workers READY" in capsys.readouterr().out


def test_not_ready_below_min_workers(stub_api, tmp_path, capsys):
    url, state, _ = stub_api
    state.update(classifier=(["READY", "UNLOADING"], 2))
    assert run_probe(url, tmp_path) == 1
    assert "1/2" in capsys.readouterr().out


def test_not_ready_without_models_or_server(stub_api, tmp_path, capsys):
    url, _, _ = stub_api
    assert run_probe(url, tmp_path) == 1
    assert "no models" in capsys.readouterr().out
    (port,) = free_ports(1)
    assert ready_probe.main(["--management-url", f"http://127.0.0.1:{port}"]) == 1
    assert "unusable" in capsys.readouterr().out


def test_a_model_with_waiting_requests_and_no_answers_is_stuck_after_the_bound(stub_api, tmp_path, capsys):
    """READY workers, one request waiting, nothing answered: ready at first sight, stuck once the bound has passed
    between two runs; answers again (the answer counter moves) -> ready."""
    url, state, counters = stub_api
    state.update(generator=(["READY"], 1, 1))
    counters.update(generator=(5, 1234.5))
    assert run_probe(url, tmp_path, "--stuck-after", "0.3") == 0
    time.sleep(0.4)
    assert run_probe(url, tmp_path, "--stuck-after", "0.3") == 1
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("not ready: stuck: generator 1.0: 1 request waiting") and "--stuck-after 0.3" in line
    counters.update(generator=(5, 2000.0))
    assert run_probe(url, tmp_path, "--stuck-after", "0.3") == 0


def test_requests_received_after_the_last_answer_count_as_work(stub_api, tmp_path, capsys):
    """Nothing queued, but a request arrived after the last answer and is not answered (in a wedged worker)."""
    url, state, counters = stub_api
    state.update(classifier=(["READY"],))
    counters.update(classifier=(3, 10.0))
    assert run_probe(url, tmp_path, "--stuck-after", "0.3") == 0
    counters.update(classifier=(4, 10.0))
    assert run_probe(url, tmp_path, "--stuck-after", "0.3") == 0
    time.sleep(0.4)
    assert run_probe(url, tmp_path, "--stuck-after", "0.3") == 1
    assert "classifier 1.0: 0 requests waiting, 1 received since its last answer" in capsys.readouterr().out


def test_an_idle_model_is_never_stuck(stub_api, tmp_path, capsys):
    url, state, counters = stub_api
    state.update(classifier=(["READY"],))
    counters.update(classifier=(3, 10.0))
    for _ in range(3):
        assert run_probe(url, tmp_path, "--stuck-after", "0.1") == 0
        time.sleep(0.15)


def test_not_ready_when_progress_cannot_be_seen(stub_api, tmp_path, capsys):
    url, state, _ = stub_api
    state.update(classifier=(["READY"],))
    (port,) = free_ports(1)
    code = ready_probe.main(["--management-url", url, "--metrics-url", f"http://127.0.0.1:{port}"])
    assert code == 1
    assert "metrics API at" in capsys.readouterr().out


def test_bad_bound_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        ready_probe.main(["--stuck-after", "0"])
    assert exit_.value.code == 2 and "--stuck-after must be positive" in capsys.readouterr().err
