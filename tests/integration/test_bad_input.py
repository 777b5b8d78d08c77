"""Every request of the bad-input corpus (tests/data/bad_requests/) gets its 4xx and a message naming the problem (in
the error shape of the route it was sent to), good requests interleaved with them succeed, and no worker restarts
(PIDs unchanged). A user-model corpus (t-*.yaml) runs in tests/integration/test_your_models.py."""

import pytest
import requests

from scripts.reliability import corpus

GOOD = {
    "classifier": {"inputs": [0.25] * 128},
    "minilm": {"text": "a perfectly ordinary sentence"},
    "generator": {"prompt": "Once upon a time", "max_new_tokens": 4},
}


@pytest.mark.parametrize("model", corpus.models_with_corpus())
def test_bad_input_corpus(ts_server, model):
    if model not in ts_server.props.get("load_models", ""):
        pytest.skip(f"{model} is not served by this session's server (TS_TEST_MODELS)")
    cases = corpus.load(model)
    assert len(cases) >= 40, "the corpus must keep at least 40 bad requests per model"
    url = f"{ts_server.inference_url}/predictions/{model}"
    pids_before = ts_server.management().worker_pids(model)
    session = requests.Session()
    failures = []
    for case in cases:
        response = session.post(
            case.url(ts_server.inference_url, model),
            data=case.body,
            headers={"Content-Type": case.content_type},
            timeout=60,
        )
        try:
            message = corpus.error_message(response.json())
        except ValueError:
            message = None
        if response.status_code != case.status:
            failures.append(f"{case.name}: status {response.status_code} (wanted {case.status}): {response.text[:200]}")
        elif case.message not in str(message or ""):
            failures.append(f"{case.name}: message {message!r} lacks {case.message!r}")
        good = session.post(url, json=GOOD[model], timeout=60)
        if good.status_code != 200:
            failures.append(f"good request after {case.name!r} failed: {good.status_code} {good.text[:200]}")
    assert not failures, "\n".join(failures)
    assert ts_server.management().worker_pids(model) == pids_before, "a worker restarted during the bad-input corpus"
