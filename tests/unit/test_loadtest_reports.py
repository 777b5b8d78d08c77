"""Pure parts of the load tests: Locust statistics -> summary, Prometheus text -> server figures, open-loop arrivals
and counters, payload mixes and response checks. No server; Locust itself only in a child process (for its own
statistics and CSV writer)."""

import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loadtests import openloop, payloads, prometheus, report, run
from scripts.ops.stats import bucket_upper_bound

REPO = Path(__file__).resolve().parents[2]

# Locust is driven in a child process: importing it here would gevent-monkey-patch the whole test session.
LOCUST_STATS_SCRIPT = textwrap.dedent("""
    import csv, json, sys
    from locust.env import Environment
    from locust.stats import PERCENTILES_TO_REPORT, StatsCSV
    from loadtests.report import PERCENTILES, stats_snapshot

    times, failures, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    environment = Environment()
    for number, time_ms in enumerate(times):
        environment.stats.log_request("POST", "minilm", time_ms, 100)
        if number >= len(times) - failures:
            environment.stats.log_error("POST", "minilm", "503 queue full")
    with open(out + "_stats.csv", "w", newline="") as handle:
        StatsCSV(environment, PERCENTILES_TO_REPORT).requests_csv(csv.writer(handle))
    expected = {key: environment.stats.total.get_response_time_percentile(q) for key, q in PERCENTILES.items()}
    json.dump({"locust": expected, "snapshot": stats_snapshot(environment.stats)}, open(out + ".json", "w"))
""")


def locust_stats(tmp_path, times_ms, failures=0):
    """Locust's own stats for these response times: (path of its _stats.csv, its percentiles, our snapshot)."""
    out = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-c", LOCUST_STATS_SCRIPT, json.dumps(times_ms), str(failures), str(out)],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    produced = json.loads((tmp_path / "run.json").read_text())
    return tmp_path / "run_stats.csv", produced["locust"], produced["snapshot"]


def test_summary_from_locust_stats_csv_matches_locusts_own_percentiles(tmp_path):
    times = list(range(1, 201))  # 1..200 ms: below 100 ms exact, then Locust rounds to 10 ms
    stats_csv, expected, snapshot = locust_stats(tmp_path, times, failures=3)

    summary = report.read_stats(stats_csv)

    assert summary["requests"] == 200 and summary["failures"] == 3
    for key in report.PERCENTILES:
        assert summary[key] == expected[key], key
        assert snapshot[key] == expected[key], key
    assert summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"] <= summary["p999_ms"] <= summary["max_ms"]
    assert summary["p50_ms"] == 100 and summary["p99_ms"] == 200  # 198 ms is stored as 200 (10 ms buckets)
    assert summary["endpoints"] == {"minilm": 200}
    assert snapshot["requests"] == 200 and snapshot["failures"] == 3
    assert snapshot["failure_reasons"] == [{"name": "minilm", "error": "503 queue full", "occurrences": 3}]


def test_empty_run_has_no_percentiles(tmp_path):
    stats_csv, _, snapshot = locust_stats(tmp_path, [])
    summary = report.read_stats(stats_csv)
    assert snapshot["requests"] == 0 and snapshot["p99_ms"] is None
    assert summary["requests"] == 0 and summary["p99_ms"] is None and summary["failure_rate"] is None


def test_stats_csv_without_aggregated_row_is_refused(tmp_path):
    (tmp_path / "bad_stats.csv").write_text("Type,Name,Request Count\nPOST,minilm,3\n")
    with pytest.raises(ValueError, match="Aggregated"):
        report.read_stats(tmp_path / "bad_stats.csv")


def test_history_gives_per_second_throughput_and_skips_empty_windows(tmp_path):
    header = (
        "Timestamp,User Count,Type,Name,Requests/s,Failures/s,50%,66%,75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%,"
        "Total Request Count,Total Failure Count,Total Median Response Time,Total Average Response Time,"
        "Total Min Response Time,Total Max Response Time,Total Average Content Size"
    )
    rows = [
        "1000,0,,Aggregated,0,0,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,0,0,0,0,0,0,0",
        "1001,2,POST,minilm,5,0,12,13,14,15,16,17,18,19,20,20,20,10,0,12,12,5,20,100",  # per-endpoint row: skipped
        "1001,2,,Aggregated,0,0,0,0,0,0,0,0,0,0,0,0,0,10,0,12,12,5,20,100",
        "1002,2,,Aggregated,9.5,0,12,13,14,15,16,17,18,19,20,20,20,40,1,12,12,5,20,100",
        "1004,4,,Aggregated,20,1,15,16,17,18,19,20,21,30,40,40,40,100,5,12,12,5,40,100",
    ]
    (tmp_path / "h.csv").write_text("\n".join([header, *rows]) + "\n")
    series = report.read_history(tmp_path / "h.csv")
    assert [p["t"] for p in series] == [0, 1, 2, 4]
    assert [p["rps_1s"] for p in series] == [0.0, 10.0, 30.0, 30.0]
    assert [p["fails_1s"] for p in series] == [0.0, 0.0, 1.0, 2.0]
    assert series[1]["p99_ms"] is None  # a 0 ms window means no samples yet
    assert series[3]["p99_ms"] == 30.0 and series[3]["users"] == 4
    assert report.plot_history(series, tmp_path / "t.png", "title") and (tmp_path / "t.png").stat().st_size > 0


SCRAPE_BEFORE = """\
# HELP InferenceSeconds Torchserve prometheus histogram metric with unit: s
# TYPE InferenceSeconds histogram
InferenceSeconds_bucket{ModelName="minilm",Level="Model",Hostname="vm",le="0.005",} 1.0
InferenceSeconds_bucket{ModelName="minilm",Level="Model",Hostname="vm",le="0.01",} 2.0
InferenceSeconds_bucket{ModelName="minilm",Level="Model",Hostname="vm",le="+Inf",} 2.0
InferenceSeconds_count{ModelName="minilm",Level="Model",Hostname="vm",} 2.0
InferenceSeconds_sum{ModelName="minilm",Level="Model",Hostname="vm",} 1.2E-2
InferenceSeconds_count{ModelName="classifier",Level="Model",Hostname="vm",} 50.0
InferenceSeconds_sum{ModelName="classifier",Level="Model",Hostname="vm",} 0.5
ts_inference_requests_total{model_name="minilm",model_version="default",hostname="vm",} 10.0
ts_queue_latency_microseconds{model_name="minilm",model_version="default",hostname="vm",} 10000.0
"""
SCRAPE_AFTER = """\
InferenceSeconds_bucket{ModelName="minilm",Level="Model",Hostname="vm",le="0.005",} 1.0
InferenceSeconds_bucket{ModelName="minilm",Level="Model",Hostname="vm",le="0.01",} 42.0
InferenceSeconds_bucket{ModelName="minilm",Level="Model",Hostname="vm",le="0.025",} 101.0
InferenceSeconds_bucket{ModelName="minilm",Level="Model",Hostname="vm",le="+Inf",} 102.0
InferenceSeconds_count{ModelName="minilm",Level="Model",Hostname="vm",} 102.0
InferenceSeconds_sum{ModelName="minilm",Level="Model",Hostname="vm",} 1.012
InferenceSeconds_count{ModelName="classifier",Level="Model",Hostname="vm",} 90.0
InferenceSeconds_sum{ModelName="classifier",Level="Model",Hostname="vm",} 0.9
Batches{ModelName="minilm",Level="Model",Hostname="vm",} 100.0
BatchRequests{ModelName="minilm",Level="Model",Hostname="vm",} 400.0
CacheHits{ModelName="minilm",Level="Model",Hostname="vm",} 100.0
CacheMisses{ModelName="minilm",Level="Model",Hostname="vm",} 300.0
PaddedTokens{ModelName="minilm",Level="Model",Hostname="vm",} 96000.0
ForwardPasses{ModelName="minilm",Level="Model",Hostname="vm",} 120.0
ts_inference_requests_total{model_name="minilm",model_version="default",hostname="vm",} 410.0
ts_queue_latency_microseconds{model_name="minilm",model_version="default",hostname="vm",} 2010000.0
ts_inference_requests_total{model_name="minilm",model_version="2.0",hostname="vm",} 0.0
"""


def test_prometheus_text_is_parsed_with_torchserves_trailing_commas_and_exponents():
    samples = prometheus.parse(SCRAPE_BEFORE)
    key = ("InferenceSeconds_sum", (("Hostname", "vm"), ("Level", "Model"), ("ModelName", "minilm")))
    assert samples[key] == pytest.approx(0.012)
    assert prometheus.total(samples, "InferenceSeconds_count", "classifier") == 50.0
    assert prometheus.buckets(samples, "InferenceSeconds", "minilm") == [(0.005, 1.0), (0.01, 2.0), (math.inf, 2.0)]


def test_server_figures_are_the_difference_between_two_scrapes():
    figures = prometheus.server_figures(prometheus.parse(SCRAPE_BEFORE), prometheus.parse(SCRAPE_AFTER), "minilm")
    assert figures["available"] and figures["requests"] == 400
    assert figures["mean_queue_ms"] == pytest.approx(5.0)  # 2,000,000 us over 400 requests
    assert figures["inference_batches"] == 100
    assert figures["inference_mean_ms"] == pytest.approx(10.0)  # 1.0 s over 100 batches
    assert figures["inference_p99_ms_at_most"] == pytest.approx(25.0)  # 99th of 100 falls in the 10-25 ms bucket
    assert figures["mean_batch_requests"] == 4.0
    assert figures["cache_hit_rate"] == 0.25
    assert figures["mean_padded_tokens_per_pass"] == 800.0  # 96,000 padded tokens over 120 forward passes
    assert figures["preprocess_mean_ms"] is None  # never recorded: no invented numbers


def test_unreachable_metrics_are_reported_not_invented():
    assert prometheus.server_figures(None, None, "minilm") == {
        "available": False,
        "reason": "metrics endpoint did not answer",
    }
    assert prometheus.scrape("http://127.0.0.1:9", timeout=0.5) is None


# A server serving both the ranking network and minilm: each traffic's table must read its own model's series.
TWO_MODELS_AFTER = """\
ts_inference_requests_total{model_name="ranking",model_version="default",hostname="vm",} 30.0
InferenceSeconds_count{ModelName="ranking",Level="Model",Hostname="vm",} 12.0
InferenceSeconds_sum{ModelName="ranking",Level="Model",Hostname="vm",} 0.06
ts_inference_requests_total{model_name="minilm",model_version="default",hostname="vm",} 7.0
"""


@pytest.mark.parametrize(
    "traffic_name, model, requests",
    [("ranking-oip", "ranking", 30), ("ranking-native", "ranking", 30), ("minilm-repeats", "minilm", 7)],
)
def test_server_table_reads_the_model_the_traffic_is_sent_to_not_the_traffic_name(traffic_name, model, requests):
    settings = run.settings_for(traffic_name, "smoke")
    assert payloads.traffic(traffic_name).served_model == model
    figures = run.server_side(settings, None, prometheus.parse(TWO_MODELS_AFTER))
    assert figures["requests"] == requests
    if model == "ranking":
        assert figures["inference_batches"] == 12 and figures["inference_mean_ms"] == pytest.approx(5.0)


def test_a_traffic_to_another_systems_route_keeps_its_own_name():
    assert payloads.traffic("ranking-litserve").served_model == "ranking-litserve"  # LitServe's /predict
    assert payloads.traffic("minilm-openai").served_model == "minilm-openai"  # an OpenAI-style /embeddings
    assert payloads.traffic("minilm").served_model == "minilm"


def test_bucket_upper_bound_is_the_bucket_holding_the_quantile():
    cumulative = [(0.005, 50.0), (0.01, 98.0), (0.025, 100.0), (math.inf, 100.0)]
    assert bucket_upper_bound(0.5, cumulative) == 0.005
    assert bucket_upper_bound(0.99, cumulative) == 0.025
    assert bucket_upper_bound(0.99, []) is None
    assert bucket_upper_bound(0.99, [(math.inf, 0.0)]) is None


def test_uniform_arrivals_are_evenly_spaced_and_poisson_ones_seeded():
    uniform = openloop.arrival_offsets(4.0, "uniform")
    assert [next(uniform) for _ in range(4)] == [0.25, 0.5, 0.75, 1.0]
    first = openloop.arrival_offsets(50.0, "poisson", seed=7)
    second = openloop.arrival_offsets(50.0, "poisson", seed=7)
    times = [next(first) for _ in range(5000)]
    assert times == [next(second) for _ in range(5000)]
    assert all(b > a for a, b in itertools.pairwise(times))
    assert 5000 / times[-1] == pytest.approx(50.0, rel=0.05)
    with pytest.raises(ValueError):
        next(openloop.arrival_offsets(0, "uniform"))
    with pytest.raises(ValueError):
        next(openloop.arrival_offsets(1, "bursty"))


def test_open_loop_counters_sum_user_rates_and_merge_worker_reports():
    worker_a, worker_b, master = openloop.OpenLoopCounters(), openloop.OpenLoopCounters(), openloop.OpenLoopCounters()
    for number in range(10):  # user 1: 10 starts in 2 s = 5/s, one late
        worker_a.record(0.05 if number == 3 else 0.001, True, 0.01, user="1", elapsed=0.2 * (number + 1))
    for number in range(4):  # user 2 started later: 4 starts in 1 s = 4/s, one dropped at the cap
        worker_b.record(0.0, number != 2, 0.01, user="2", elapsed=0.25 * (number + 1))
    worker_a.completed, worker_b.completed = 10, 2
    master.merge(worker_a.take())
    master.merge(worker_b.take())
    assert worker_a.scheduled == 0 and worker_a.users  # take() resets the counts, keeps per-user totals
    summary = master.summary(target_rate=10.0)
    assert summary["scheduled"] == 14 and summary["started"] == 13
    assert summary["late_starts"] == 1 and summary["not_started"] == 1
    assert summary["unfinished_at_stop"] == 1
    assert summary["achieved_rate"] == pytest.approx(5.0 + 3.0)  # user 2 started 3 of its 4 arrivals in 1 s
    assert summary["max_start_lag_ms"] == pytest.approx(50.0)
    assert summary["open_loop_users"] == 2


def test_payload_streams_are_reproducible_and_distinct_per_user():
    first = [payloads.MinilmPayloads(seed=0, stream=1).next() for _ in range(1)]
    again = payloads.MinilmPayloads(seed=0, stream=1)
    other = payloads.MinilmPayloads(seed=0, stream=2)
    stream = [again.next() for _ in range(50)]
    assert stream[0] == first[0]
    assert stream != [other.next() for _ in range(50)]
    rows = payloads.ClassifierPayloads(seed=3, stream=0)
    row = rows.next()["inputs"]
    assert len(row) == payloads.CLASSIFIER_FEATURES and row == payloads.ClassifierPayloads(3, 0).next()["inputs"]


def test_minilm_mix_is_mostly_short_with_a_long_tail_and_repeats():
    stream = payloads.MinilmPayloads(seed=0, stream=0)
    texts = [stream.next()["text"] for _ in range(4000)]
    words = [len(text.split()) for text in texts]
    share = lambda predicate: sum(map(predicate, words)) / len(words)  # noqa: E731
    assert share(lambda w: w <= 16) > 0.5
    assert 0.02 < share(lambda w: w > 256) < 0.10  # longer than the model's 256-token window
    repeats = 1 - len(set(texts)) / len(texts)
    assert 0.1 < repeats < 0.3
    assert all(text.strip() for text in texts)


def test_response_checks_accept_good_answers_and_name_the_problem():
    assert payloads.check_minilm({"embedding": [0.1] * 384, "truncated": False}) is None
    assert "384" in payloads.check_minilm({"embedding": [0.1] * 383})
    assert payloads.check_minilm({"embedding": [float("nan")] * 384}) is not None
    assert "embedding" in payloads.check_minilm({"code": 400, "message": "bad"})
    good = {"label": 3, "probabilities": [0.1] * 10}
    assert payloads.check_classifier(good) is None
    assert "sum" in payloads.check_classifier({"label": 3, "probabilities": [0.2] * 10})
    assert "label" in payloads.check_classifier({"label": 10, "probabilities": [0.1] * 10})
    assert payloads.check_classifier([good]) is not None
    # Any other well-formed name is an embedding archive packaged from a user's folder; a malformed one is refused.
    assert payloads.traffic("my-model").path == "/predictions/my-model"
    assert payloads.traffic("my-model-openai").path == "/embeddings"
    for bad in ("", "a/b", "x y", "../m"):
        with pytest.raises(ValueError, match="not a model name"):
            payloads.traffic(bad)
