"""scripts/ready_probe.py (through scripts/ops/management.py) against a stub management API: ready only when every
model has its workers READY.
(Worker states as TorchServe 0.12 reports them: a loading worker is "UNLOADING" until it is "READY".)"""

import pytest

from scripts import ready_probe
from scripts.ops.server import free_ports
from tests.stub_http import stub_http_server


def describe(name, statuses, min_workers=1):
    return [
        {
            "modelName": name,
            "modelVersion": "1.0",
            "minWorkers": min_workers,
            "workers": [{"id": str(9000 + n), "status": s} for n, s in enumerate(statuses)],
        }
    ]


@pytest.fixture
def stub_api():
    """Answers GET /models and /models/{name} from `state` (name -> worker statuses)."""
    state = {}

    def answer(method, path, headers):
        if path == "/models":
            return 200, {"models": [{"modelName": n, "modelUrl": f"{n}.mar"} for n in state]}
        name = path.rsplit("/", 1)[-1]
        return 200, describe(name, *state[name])

    with stub_http_server(answer) as url:
        yield url, state


def test_ready_when_every_model_has_its_workers(stub_api, capsys):
    url, state = stub_api
    state.update(classifier=(["READY"],), minilm=(["READY", "READY"], 2))
    assert ready_probe.main(["--management-url", url]) == 0
    assert capsys.readouterr().out.strip() == "ready"


def test_not_ready_while_a_worker_loads(stub_api, capsys):
    url, state = stub_api
    state.update(classifier=(["READY"],), minilm=(["UNLOADING"],))
    assert ready_probe.main(["--management-url", url]) == 1
    assert "minilm 1.0: 0/1 workers READY" in capsys.readouterr().out


def test_not_ready_below_min_workers(stub_api, capsys):
    url, state = stub_api
    state.update(classifier=(["READY", "UNLOADING"], 2))
    assert ready_probe.main(["--management-url", url]) == 1
    assert "1/2" in capsys.readouterr().out


def test_not_ready_without_models_or_server(stub_api, capsys):
    url, _ = stub_api
    assert ready_probe.main(["--management-url", url]) == 1
    assert "no models" in capsys.readouterr().out
    (port,) = free_ports(1)
    assert ready_probe.main(["--management-url", f"http://127.0.0.1:{port}"]) == 1
    assert "unusable" in capsys.readouterr().out
