"""loadtests/breakdown.py's parsing: its arguments and what it reads from TorchServe's logs and py-spy's stacks (the
lines below are copied from a real run's logs). The measurement itself needs a server and is run by hand."""

import argparse

import pytest

from loadtests import breakdown

ACCESS_LOG = """\
2026-12-01T19:25:53,252 - /127.0.0.1:55678 "POST /predictions/classifier HTTP/1.1" 200 22
2026-12-01T19:25:53,273 - /127.0.0.1:55678 "POST /predictions/minilm HTTP/1.1" 200 12
2026-12-01T19:25:53,290 - /127.0.0.1:55678 "POST /predictions/classifier/1.0 HTTP/1.1" 400 3
2026-12-01T19:25:53,301 - /127.0.0.1:55678 "GET /ping HTTP/1.1" 200 0
"""

TS_LOG = """\
2026-12-01T18:53:55,017 [INFO ] W-9000-classifier_1.0 org.pytorch.serve.wlm.WorkerThread - Backend response time: 2754
2026-12-01T18:53:57,572 [INFO ] W-9002-minilm_1.0 org.pytorch.serve.wlm.WorkerThread - Backend response time: 2868
2026-12-01T18:53:57,930 [INFO ] W-9000-classifier_1.0-stdout org.pytorch.serve.wlm.WorkerLifeCycle - \
result=[METRICS]PredictionTime.Milliseconds:2.19|#ModelName:classifier,Level:Model|#type:GAUGE|#hostname:vm,\
1796151237,60755ace-7458-4c4c-9e3f-0207bc02880d, pattern=[METRICS]
2026-12-01T18:53:57,943 [INFO ] W-9001-minilm_1.0-stdout org.pytorch.serve.wlm.WorkerLifeCycle - \
result=[METRICS]PredictionTime.Milliseconds:1.48|#ModelName:minilm,Level:Model|#type:GAUGE|#hostname:vm,\
1796151237,bacb514c-9d35-42ab-b2fc-c034b2b14779, pattern=[METRICS]
"""


def test_the_access_log_gives_each_models_own_request_milliseconds():
    assert breakdown.access_ms(ACCESS_LOG, "classifier") == [22.0, 3.0]  # a versioned URL is the same model
    assert breakdown.access_ms(ACCESS_LOG, "minilm") == [12.0]


def test_the_trace_log_gives_the_backend_round_trip_and_the_workers_timer_per_model():
    classifier = breakdown.trace_figures(TS_LOG, "classifier")
    assert classifier["backend_response_ms"] == [2754.0] and classifier["PredictionTime"] == [2.19]
    minilm = breakdown.trace_figures(TS_LOG, "minilm")
    assert minilm["backend_response_ms"] == [2868.0] and minilm["PredictionTime"] == [1.48]


def test_set_and_property_arguments_are_parsed_and_bad_ones_refused():
    assert breakdown.parse_set(["minilm:delay=0,workers=1"]) == {"minilm": {"max_batch_delay": 0, "workers": 1}}
    assert breakdown.property_setting("async_logging = true") == ("async_logging", "true")
    for bad in ("minilm:delay=-1", "minilm:speed=2", "minilm"):
        with pytest.raises(argparse.ArgumentTypeError):
            breakdown.parse_set([bad])
    for bad in ("async_logging", "=true", "load_models=x.mar", "inference_address=http://0.0.0.0:80"):
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
            breakdown.property_setting(bad)


def test_py_spy_stacks_blocked_in_the_socket_read_are_idle_and_the_rest_are_shared_out(tmp_path):
    wait = f"{breakdown.RECV_WAIT}:120)"
    raw = tmp_path / "raw.txt"
    raw.write_text(
        f"main (ts/model_service_worker.py:1);handle_connection (ts/model_service_worker.py:2);{wait} 70\n"
        "main (ts/model_service_worker.py:1);handle_connection (ts/model_service_worker.py:3) 20\n"
        "main (ts/model_service_worker.py:1);predict (handlers/x.py:9) 10\n"
        "garbage line\n"
    )
    summary = breakdown.py_spy_summary(raw)
    assert summary["samples"] == 30 and summary["recv_wait_samples"] == 70
    assert summary["inclusive_share"][breakdown.SENDALL] == pytest.approx(20 / 30, abs=1e-3)
