"""scripts/ops/progress.py: when a model counts as stuck, from TorchServe's own metrics text and describe fields
(times given explicitly, no server)."""

from scripts.ops.progress import ProgressMonitor, Signals, parse_metrics

# As TorchServe 0.12 writes them (trailing comma inside the braces), with one of the handlers' counters.
METRICS = """# HELP ts_inference_requests_total Torchserve prometheus counter metric with unit: Count
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{model_name="stall",model_version="default",hostname="vm",} 2.0
ts_inference_requests_total{model_name="stall",model_version="1.0",hostname="vm",} 1.0
ts_inference_latency_microseconds{model_name="stall",model_version="default",hostname="vm",} 10145.508
Batches{ModelName="minilm",Level="Model",Hostname="vm",} 7.0
Requests2XX{Level="Host",Hostname="vm",} 7.0
"""


def signals(pending=0, received=0.0, answered=0.0, batches=0.0, workers=("9000@t0",), version="1.0"):
    return Signals(version, pending, received, answered, batches, workers)


def test_metrics_text_sums_a_models_versions():
    totals = parse_metrics(METRICS)
    assert totals["stall"] == {
        "ts_inference_requests_total": 3.0,
        "ts_inference_latency_microseconds": 10145.508,
        "Batches": 0.0,
    }
    assert totals["minilm"]["Batches"] == 7.0 and "Requests2XX" not in totals


def test_waiting_without_progress_is_stuck_only_after_the_bound():
    monitor = ProgressMonitor(10)
    assert not monitor.observe("m", signals(pending=2, received=5), 100).stuck
    verdict = monitor.observe("m", signals(pending=2, received=6), 109)
    assert not verdict.stuck and verdict.stalled_for == 9
    verdict = monitor.observe("m", signals(pending=2, received=6), 110)
    assert verdict.stuck and verdict.pending == 2 and verdict.unanswered == 1
    assert verdict.describe() == "m 1.0: 2 requests waiting, 1 received since its last answer, no progress for 10.0 s"


def test_an_answer_or_a_finished_batch_is_progress():
    monitor = ProgressMonitor(10)
    monitor.observe("m", signals(pending=1, received=5, answered=1.0), 100)
    assert not monitor.observe("m", signals(pending=1, received=6, answered=2.0), 115).stuck
    assert not monitor.observe("m", signals(pending=1, received=6, answered=2.0, batches=1), 124).stuck
    assert monitor.observe("m", signals(pending=1, received=6, answered=2.0, batches=1), 134).stuck


def test_the_stall_counts_from_when_work_was_first_seen_not_from_the_last_answer():
    """An hour idle, then a request: it has the whole bound to be answered."""
    monitor = ProgressMonitor(10)
    monitor.observe("m", signals(received=5, answered=1.0), 0)
    assert monitor.observe("m", signals(received=5, answered=1.0), 3600).stalled_for == 0
    assert not monitor.observe("m", signals(received=6, answered=1.0), 3601).stuck
    assert monitor.observe("m", signals(received=6, answered=1.0), 3611).stuck


def test_replaced_workers_a_new_version_or_restarted_counters_start_afresh():
    for changed in (
        signals(pending=1, received=6, workers=("9001@t1",)),
        signals(pending=1, received=6, version="2.0"),
        signals(pending=1, received=1),
    ):
        monitor = ProgressMonitor(10)
        monitor.observe("m", signals(pending=1, received=6), 0)
        assert monitor.observe("m", changed, 20).stalled_for == 0, changed


def test_the_state_a_probe_keeps_between_runs_round_trips():
    monitor = ProgressMonitor(10)
    monitor.observe("m", signals(pending=1, received=6), 0)
    again = ProgressMonitor.from_state(monitor.state(), 10)
    assert again.observe("m", signals(pending=1, received=6), 10).stuck
    assert ProgressMonitor.from_state({"tracks": {"m": {"nonsense": 1}}}, 10).tracks == {}
