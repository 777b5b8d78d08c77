"""Capacity search on a fake server, the tuner's and comparison's pure parts, and the Locust command lines."""

import json
import zipfile

import pytest
import requests
import yaml

from loadtests import capacity, compare, compare_report, run, tune, tune_report, variants
from scripts.ops.management import ManagementClient


def fake_server(capacity_rate, base_ms=10.0, failures_above=None):
    """measure(rate): p99 grows slowly below capacity and jumps past the SLO above it; records every rate asked."""
    asked = []

    def measure(rate):
        asked.append(rate)
        overloaded = rate > capacity_rate
        p99 = base_ms * (1 + rate / capacity_rate) if not overloaded else 1000.0
        failures = 5 if failures_above is not None and rate > failures_above else 0
        return capacity.Step(
            rate=rate,
            p50_ms=base_ms,
            p99_ms=p99,
            failures=failures,
            requests=int(rate * 10),
            achieved_rate=rate,
            throughput=min(rate, capacity_rate),
        )

    return measure, asked


def quiet(*_):
    pass


def distinct(asked):
    """The rates in the order tried, each rate's confirmation runs folded into it."""
    return [rate for index, rate in enumerate(asked) if index == 0 or asked[index - 1] != rate]


def test_search_grows_then_bisects_to_within_the_tolerance():
    measure, asked = fake_server(capacity_rate=100.0)
    found = capacity.search(measure, slo_ms=50, start_rate=8, max_rate=10_000, tolerance=0.05, max_steps=20, log=quiet)
    good, bad = found["bracket"]
    assert good <= 100.0 < bad and (bad - good) / good <= 0.05
    assert found["capacity_rate"] == pytest.approx(good, abs=1e-3)
    assert distinct(asked)[:5] == [8, 16, 32, 64, 128]  # geometric growth until the first miss
    assert asked.count(128) == 2  # a failure is confirmed; the second failure decides (best of 3)
    assert all(64 < rate < 128 for rate in distinct(asked)[5:])  # bisection stays inside the first bracket
    assert found["stopped_because"].startswith("bracket within")
    assert [step.passed for step in found["steps"]] == [rate <= 100.0 for rate in asked]


def test_search_shrinks_when_the_start_rate_already_fails():
    measure, asked = fake_server(capacity_rate=3.0)
    found = capacity.search(measure, slo_ms=50, start_rate=8, max_rate=100, tolerance=0.1, max_steps=20, log=quiet)
    assert distinct(asked)[:3] == [8, 4, 2]
    assert 2.7 <= found["capacity_rate"] <= 3.0


def test_search_reports_when_nothing_passes_and_when_the_cap_is_reached():
    measure, _ = fake_server(capacity_rate=0.1)
    found = capacity.search(measure, slo_ms=50, start_rate=2, max_rate=100, min_rate=0.5, log=quiet)
    assert found["capacity_rate"] is None and "missed the SLO" in found["stopped_because"]
    measure, asked = fake_server(capacity_rate=1e9)
    found = capacity.search(measure, slo_ms=50, start_rate=10, max_rate=50, log=quiet)
    assert asked == [10, 20, 40, 50] and found["capacity_rate"] == 50  # clear passes: no repeats
    assert "max-rate" in found["stopped_because"]


def test_search_respects_the_step_budget():
    measure, asked = fake_server(capacity_rate=1000.0)
    found = capacity.search(measure, slo_ms=50, start_rate=1, max_rate=1e6, max_steps=4, log=quiet)
    assert len(asked) == 4 and found["capacity_rate"] == 8 and "budget" in found["stopped_because"]


def test_failures_and_a_lagging_generator_fail_a_step_even_within_the_slo():
    measure, _ = fake_server(capacity_rate=1000.0, failures_above=20)
    found = capacity.search(measure, slo_ms=50, start_rate=10, max_rate=1000, tolerance=0.1, log=quiet)
    assert 18 <= found["capacity_rate"] <= 20
    step = capacity.judge(
        capacity.Step(rate=100, p50_ms=5, p99_ms=9, failures=0, requests=900, late_share=0.2), slo_ms=50
    )
    assert not step.passed and "generator" in step.reason
    step = capacity.judge(capacity.Step(rate=100, p50_ms=5, p99_ms=9, failures=0, requests=900, not_started=1), 50)
    assert not step.passed and "generator" in step.reason
    # A Poisson schedule that happened to offer 8 % less than its target is not a generator failure.
    assert capacity.judge(
        capacity.Step(rate=100, p50_ms=5, p99_ms=9, failures=0, requests=900, achieved_rate=92, late_share=0.01), 50
    ).passed
    step = capacity.judge(capacity.Step(rate=10, p50_ms=5, p99_ms=9, failures=0, requests=90, unfinished=2), 50)
    assert not step.passed and "open at the end" in step.reason
    assert not capacity.judge(capacity.Step(rate=10, p50_ms=None, p99_ms=None, failures=0), 50).passed
    assert capacity.judge(capacity.Step(rate=10, p50_ms=5, p99_ms=50, failures=0, requests=90), 50).passed


def noisy_server(capacity_rate, noisy_runs, base_ms=10.0):
    """fake_server, except that the runs numbered in noisy_runs (1-based, over the whole search) hit a noisy window:
    p99 well over any SLO whatever the rate."""
    measure, asked = fake_server(capacity_rate, base_ms)

    def noisy(rate):
        step = measure(rate)
        if len(asked) in noisy_runs:
            step.p99_ms = 270.0
        return step

    return noisy, asked


def test_a_single_noisy_failure_no_longer_ends_the_search_low():
    # The first run: the step at 16/s hit a noisy window. Unconfirmed, the search ends below 16/s.
    measure, asked = noisy_server(capacity_rate=50.0, noisy_runs={2})
    found = capacity.search(measure, slo_ms=250, start_rate=8, max_rate=1000, confirm=1, log=quiet)
    assert found["capacity_rate"] < 16
    measure, asked = noisy_server(capacity_rate=50.0, noisy_runs={2})
    found = capacity.search(measure, slo_ms=250, start_rate=8, max_rate=1000, tolerance=0.1, log=quiet)
    assert asked[:4] == [8, 16, 16, 16]  # failed, then confirmed by two passes: best of 3
    assert 45 <= found["capacity_rate"] <= 50
    at_16 = next(summary for summary in found["rates"] if summary["rate"] == 16)
    assert at_16["passed"] and (at_16["passes"], at_16["runs"]) == (2, 3)
    assert at_16["p99_ms"] == {"min": pytest.approx(13.2), "median": pytest.approx(13.2), "max": 270.0}
    assert [step.run for step in found["steps"][1:4]] == [1, 2, 3]


def test_a_consistent_failure_still_ends_the_search():
    measure, asked = fake_server(capacity_rate=12.0)
    found = capacity.search(measure, slo_ms=250, start_rate=8, max_rate=1000, tolerance=0.1, log=quiet)
    assert asked[:3] == [8, 16, 16]  # two failures of three runs: decided without the third
    assert 10.8 <= found["capacity_rate"] <= 12
    at_16 = next(summary for summary in found["rates"] if summary["rate"] == 16)
    assert not at_16["passed"] and at_16["runs"] == 2 and at_16["reasons"][0].startswith("p99 1000 ms")


def test_a_thin_pass_is_confirmed_before_the_search_moves_up():
    # p99 = 10 * (1 + rate / 100): 18 ms at 80/s, above 0.85 x 20 ms, so 80/s is run again before 160/s.
    measure, asked = fake_server(capacity_rate=100.0)
    found = capacity.search(measure, slo_ms=20, start_rate=10, max_rate=1000, tolerance=0.1, log=quiet)
    assert asked[:5] == [10, 20, 40, 80, 80]
    assert found["capacity_rate"] >= 80
    # A thin pass that fails its confirmation gets a third, deciding run.
    measure, asked = noisy_server(capacity_rate=100.0, noisy_runs={5})
    found = capacity.search(measure, slo_ms=20, start_rate=10, max_rate=1000, tolerance=0.1, log=quiet)
    assert asked[:6] == [10, 20, 40, 80, 80, 80]
    assert next(summary for summary in found["rates"] if summary["rate"] == 80)["passes"] == 2


def test_the_report_has_each_rates_spread_and_the_capacitys():
    measure, _ = noisy_server(capacity_rate=50.0, noisy_runs={2})
    found = capacity.search(measure, slo_ms=250, start_rate=8, max_rate=1000, tolerance=0.1, log=quiet)
    assert found["capacity_spread"]["rate"] == found["bracket"][0]
    assert found["at_capacity"].rate == found["bracket"][0] and found["at_capacity"].passed
    result = {
        "model": "minilm",
        "slo_ms": 250,
        "capacity_rate": found["capacity_rate"],
        "stopped_because": found["stopped_because"],
        "host": "h",
        "step_seconds": 5,
        "arrivals": "poisson",
        "started_at": "now",
        "confirm": 3,
        "margin": 0.85,
        "steps": [capacity.asdict(step) for step in found["steps"]],
        "rates": found["rates"],
    }
    text = capacity.render_markdown(result)
    assert "| 16.00 | 2 of 3 | 13.2 / 13.2 / 270 | 16 / 16 / 16 | pass |" in text
    assert "FAIL: p99 270 ms > SLO 250 ms |" in text and "pass (run 3)" in text


def test_bad_search_arguments_are_refused():
    measure, _ = fake_server(capacity_rate=10)
    with pytest.raises(ValueError):
        capacity.search(measure, slo_ms=50, start_rate=0, max_rate=10, log=quiet)
    with pytest.raises(ValueError):
        capacity.search(measure, slo_ms=50, start_rate=5, max_rate=10, growth=1.0, log=quiet)
    with pytest.raises(ValueError, match="confirm"):
        capacity.search(measure, slo_ms=50, start_rate=5, max_rate=10, confirm=0, log=quiet)


def test_capacity_report_files_are_written(tmp_path):
    steps = [
        capacity.judge(
            capacity.Step(rate=r, p50_ms=5, p99_ms=p, failures=0, requests=100, achieved_rate=r, throughput=r), 50
        )
        for r, p in ((10, 20), (20, 80))
    ]
    assert capacity.plot_curve(steps, 50, tmp_path / "c.png", "t", capacity_rate=10)
    result = {
        "model": "minilm",
        "slo_ms": 50,
        "capacity_rate": 10,
        "stopped_because": "x",
        "host": "h",
        "step_seconds": 5,
        "arrivals": "poisson",
        "started_at": "now",
        "steps": [capacity.asdict(step) for step in steps],
    }
    text = capacity.render_markdown(result)
    assert "**10 requests/s**" in text and "FAIL: p99 80 ms > SLO 50 ms" in text


def test_variant_archive_changes_only_the_config(tmp_path):
    source = tmp_path / "m.mar"
    with zipfile.ZipFile(source, "w") as mar:
        mar.writestr(
            "MAR-INF/MANIFEST.json",
            json.dumps({"model": {"modelName": "m", "handler": "h.py", "configFile": "model-config.yaml"}}),
        )
        mar.writestr(
            "model-config.yaml",
            "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 16\nhandler:\n  threads: 0\n  precision: auto\n",
        )
        mar.writestr("weights.bin", b"\x00\x01")
    config = variants.variant_archive(
        source, tmp_path / "out" / "v.mar", {"minWorkers": 2, "maxWorkers": 2}, {"threads": 1}
    )
    with zipfile.ZipFile(tmp_path / "out" / "v.mar") as variant:
        written = yaml.safe_load(variant.read("model-config.yaml"))
        assert variant.read("weights.bin") == b"\x00\x01"
        assert sorted(variant.namelist()) == ["MAR-INF/MANIFEST.json", "model-config.yaml", "weights.bin"]
    assert (
        written
        == config
        == {"minWorkers": 2, "maxWorkers": 2, "batchSize": 16, "handler": {"threads": 1, "precision": "auto"}}
    )


def test_threads_never_oversubscribe_the_cores():
    assert variants.threads_for(1, available=2) == 2
    assert variants.threads_for(2, available=2) == 1
    assert variants.threads_for(4, available=2) == 1
    assert variants.threads_for(2, available=8) == 4


def test_tuner_recommends_highest_capacity_and_lowest_low_load_latency(tmp_path):
    points = [
        {
            "workers": 1,
            "threads": 2,
            "batch_size": 1,
            "max_batch_delay": 2,
            "capacity_rate": 40,
            "p99_at_capacity_ms": 90,
            "low_load_p50_ms": 8,
            "low_load_p99_ms": 12,
        },
        {
            "workers": 1,
            "threads": 2,
            "batch_size": 16,
            "max_batch_delay": 10,
            "capacity_rate": 120,
            "p99_at_capacity_ms": 95,
            "low_load_p50_ms": 15,
            "low_load_p99_ms": 25,
        },
        {
            "workers": 2,
            "threads": 1,
            "batch_size": 16,
            "max_batch_delay": 5,
            "capacity_rate": None,
            "error": "registration failed",
            "low_load_p99_ms": None,
        },
    ]
    best = tune.recommend(points)
    assert best["throughput"]["capacity_rate"] == 120 and best["latency"]["batch_size"] == 1
    result = {
        "model": "minilm",
        "slo_ms": 100,
        "cores": 2,
        "step_seconds": 10,
        "started_at": "now",
        "start_rate": 8,
        "points": points,
        "recommendation": best,
    }
    text = tune_report.render_markdown(result)
    assert "batchSize: 16" in text and "maxBatchDelay: 10" in text and "registration failed" in text
    assert tune_report.plot_heatmap(points, tmp_path / "h.png", "t") and (tmp_path / "h.png").stat().st_size > 0
    assert tune.parse_list("1, 8,16") == [1, 8, 16]


def test_default_tuner_grid_tries_no_wait_and_1_ms_and_measures_batch_size_1_once(capsys):
    delays = tune.parse_list(tune.DEFAULT_DELAYS)
    assert delays[:2] == [0, 1] and tune.parse_list("0") == [0]
    points = tune.batching_points(tune.parse_list(tune.DEFAULT_BATCH_SIZES), delays)
    # batchSize 1 never waits for a second request: one point for it, every delay for the others.
    assert [p for p in points if p[0] == 1] == [(1, 0)]
    assert {(8, 0), (8, 1), (32, 10)} <= set(points) and len(points) == 1 + 3 * len(delays)
    with pytest.raises(SystemExit):
        tune.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "0,1,2,5,10" in text and "32 capacity searches" in text and "2-4 h" in text


class FakeResponse:
    status_code = 200
    text = "{}"

    def json(self):
        return {"status": "ok"}


class RecordingClient(ManagementClient):
    """The real register() and HTTP layer, the URLs recorded instead of sent; the server reads back `described`."""

    def __init__(self, described):
        super().__init__("http://127.0.0.1:1")
        self.described, self.urls = described, []

        def request(method, url, params=None, headers=None, timeout=None):
            self.urls.append((method, requests.Request(method, url, params=params).prepare().url))
            return FakeResponse()

        self.session.request = request

    def registered(self, name):
        return False

    def scale(self, name, version, min_workers, max_workers, timeout=None):
        return {}

    def wait_ready(self, name, version=None, timeout=600.0, poll=1.0, log=None):
        return self.described

    def handler_choices(self, name, version=None):
        return {"threads": 1}


def test_a_zero_batch_delay_is_sent_to_the_register_api_and_checked_back():
    client = RecordingClient({"batchSize": 8, "maxBatchDelay": 0, "workers": [{}, {}]})
    tune.register_point(client, "minilm", "minilm-w2-t1.mar", 8, 0, 2, threads=1)
    (method, url), *_ = client.urls
    assert method == "POST" and "max_batch_delay=0" in url and "batch_size=8" in url and "initial_workers=2" in url
    # A server that put its default in place of the 0 (what an archive's maxBatchDelay 0 gives) is caught.
    client = RecordingClient({"batchSize": 8, "maxBatchDelay": 100, "workers": [{}, {}]})
    with pytest.raises(RuntimeError, match="delay 100 ms"):
        tune.register_point(client, "minilm", "minilm-w2-t1.mar", 8, 0, 2, threads=1)


def test_a_zero_delay_recommendation_is_not_written_as_an_archive_0():
    point = {"workers": 2, "threads": 1, "batch_size": 8, "max_batch_delay": 0, "capacity_rate": 50}
    result = {
        "model": "minilm",
        "slo_ms": 100,
        "cores": 2,
        "step_seconds": 10,
        "started_at": "now",
        "start_rate": 8,
        "points": [point],
        "recommendation": {"throughput": point, "latency": None},
    }
    markdown = tune_report.render_markdown(result)
    assert "maxBatchDelay 0 ms" in markdown  # what was measured
    assert "  maxBatchDelay: 1  # measured: 0 (no wait)" in markdown  # what an archive can hold
    assert tune_report.config_delay(5) == "5"


def test_comparison_ratios_and_targets_are_reported_not_asserted():
    results = {
        "ours": {"capacity_rate": 100.0},
        "naive": {"capacity_rate": 10.0},
        "ray-fp32": {"capacity_rate": 60.0},
        "ray-same": {"same_as": "ray-fp32"},
        "inprocess": {"capacity_rate": 150.0},
        "flask": {"error": "did not start"},
    }
    compare.add_ratios(results)
    assert results["naive"]["ratio_to_ours"] == 0.1
    assert results["ours"]["ratio_to_ceiling"] == pytest.approx(0.667, abs=1e-3)
    verdicts = {v["target"].split(" >=")[0]: v for v in compare.evaluate_targets("minilm", results)}
    assert verdicts["ours / naive"]["met"] is True and verdicts["ours / naive"]["value"] == 10.0
    assert verdicts["ours / ray-same"]["met"] is False  # compared with ray-fp32, which it is the same system as
    assert verdicts["ours / ray-same"]["value"] == pytest.approx(1.667, abs=1e-3)
    assert verdicts["ours / inprocess"]["met"] is False
    missing = compare.evaluate_targets("minilm", {"ours": {"capacity_rate": 5.0}})
    assert all(v["met"] is None for v in missing)
    classifier = compare.evaluate_targets(
        "classifier", {"ours": {"low_p50_ms": 7, "max_batch_delay_ms": 5}, "inprocess": {"raw_forward_ms": 0.1}}
    )
    assert classifier[0]["met"] is True and classifier[0]["bound"] == pytest.approx(8.1)
    text = compare_report.render_markdown(
        {
            "model": "minilm",
            "slo_ms": 100,
            "cores": 2,
            "started_at": "now",
            "search": {"step_seconds": 20},
            "moderate_rate": 10,
            "systems": results,
            "targets": compare.evaluate_targets("minilm", results),
        }
    )
    assert "MISSED" in text and "did not start" in text and "= ray-fp32" in text


def test_profiles_build_the_locust_command_lines(tmp_path):
    steady = run.settings_for("minilm", "steady", users=3, duration=7)
    master, workers = run.locust_commands(
        steady, "http://127.0.0.1:1", tmp_path / "locust", tmp_path / "r.html", "", tmp_path / "final.json"
    )
    assert master[-1] == "MinilmUser" and workers == []
    assert master[master.index("-u") + 1] == "3" and master[master.index("-t") + 1] == "7s"
    assert "--csv-full-history" in master and master[master.index("--html") + 1] == str(tmp_path / "r.html")
    assert "--open-loop-report" not in master

    step = run.settings_for("classifier", "step", workers=2)
    master, workers = run.locust_commands(step, "http://h", tmp_path / "l", tmp_path / "r.html", "", tmp_path / "f")
    assert master[master.index("-f") + 1].endswith("locustfile.py," + str(run.SHAPES["step"]))
    assert "--master" in master and len(workers) == 2 and all("--worker" in w for w in workers)
    assert workers[0][workers[0].index("--master-port") + 1] == master[master.index("--master-bind-port") + 1]

    open_loop = run.settings_for("minilm", "open", rate=30, workers=3)
    master, workers = run.locust_commands(
        open_loop, "http://h", tmp_path / "l", tmp_path / "r.html", tmp_path / "o.json", tmp_path / "f"
    )
    assert master[-1] == "OpenLoopUser" and master[master.index("-u") + 1] == "3"  # one open-loop user per worker
    assert master[master.index("--rate") + 1] == "30" and master[master.index("--open-loop-users") + 1] == "3"
    with pytest.raises(ValueError, match="profile"):
        run.settings_for("minilm", "burst")
    with pytest.raises(ValueError, match="model name"):
        run.settings_for("llama/7b", "smoke")


def test_a_step_lasts_long_enough_for_its_minimum_number_of_requests():
    assert capacity.step_duration(4.0, 12.0, min_requests=300) == 75.0  # p99 of 48 requests is just the slowest
    assert capacity.step_duration(50.0, 12.0, min_requests=300) == 12.0  # the floor wins at high rates
    assert capacity.step_duration(4.0, 12.0, min_requests=0) == 12.0
    assert capacity.step_duration(1.0, 12.0, min_requests=300, max_step_seconds=120) == 120  # capped at low rates
    assert capacity.step_duration(4.0, 12.0, min_requests=300, max_step_seconds=5) == 12.0  # never below the floor


def test_compare_rounds_reverse_the_order_and_aggregate_to_the_median_with_its_spread():
    assert compare.round_orders(["ours", "ours-eager", "ideal"], 3) == [
        ["ours", "ours-eager", "ideal"],
        ["ideal", "ours-eager", "ours"],
        ["ours", "ours-eager", "ideal"],
    ]
    # The issue's two runs: ours 14.7 then 52.3, ours-eager 32 then 30; a third round decides ours' median.
    per_round = [
        {"ours": {"capacity_rate": 14.7, "moderate_p50_ms": 9}, "ours-eager": {"capacity_rate": 32.0}},
        {"ours": {"capacity_rate": 52.3}, "ours-eager": {"capacity_rate": 30.0}},
        {"ours": {"capacity_rate": 50.0}, "ours-eager": {"error": "did not start"}},
    ]
    results = compare.aggregate_rounds(per_round)
    assert results["ours"]["capacity_rate"] == 50.0 and results["ours"]["moderate_p50_ms"] == 9
    assert results["ours"]["capacity_spread"] == {"min": 14.7, "median": 50.0, "max": 52.3}
    assert results["ours"]["capacity_rounds"] == [14.7, 52.3, 50.0]
    assert results["ours-eager"]["capacity_rate"] == 31.0 and results["ours-eager"]["round_errors"] == ["did not start"]
    assert compare.aggregate_rounds(per_round[:1]) is per_round[0]  # one round: its figures unchanged
    flips = compare.ranking_flips(per_round)
    assert flips == [
        {"systems": ["ours", "ours-eager"], "rounds": {"ours": [14.7, 52.3, 50.0], "ours-eager": [32.0, 30.0, None]}}
    ]
    assert compare.ranking_flips(per_round[1:]) == []  # ours ahead wherever both were measured
    compare.add_ratios(results)
    text = compare_report.render_markdown(
        {
            "model": "minilm",
            "slo_ms": 250,
            "cores": 2,
            "started_at": "now",
            "search": {"step_seconds": 20},
            "moderate_rate": 10,
            "systems": results,
            "rounds": 3,
            "orders": compare.round_orders(["ours", "ours-eager"], 3),
            "ranking_flips": flips,
            "targets": compare.evaluate_targets("minilm", results),
        }
    )
    assert "| 50.0 (14.7–52.3 over 3 rounds) |" in text
    assert "RANKING FLIPPED between rounds: ours vs ours-eager" in text
    assert "- round 2: ours-eager, ours" in text and "- ours: 14.7 / 52.3 / 50 requests/s" in text


def test_compare_runs_every_system_in_each_rounds_order_and_the_fixed_rate_runs_once(monkeypatch, tmp_path):
    calls = []

    def measure_system(name, systems, results, measure, *args):
        low_rate, precision, ours_info = args[5], args[9], args[10]
        calls.append((name, measure["out_dir"].name, measure["moderate_rate"], low_rate))
        results[name] = {"capacity_rate": {"ours": 40.0, "naive": 5.0}[name] + len(calls)}
        return precision, ours_info

    monkeypatch.setattr(compare, "measure_system", measure_system)
    result = compare.compare(
        "minilm", 100, ["ours", "naive"], {"step_seconds": 1}, tmp_path, "store", 10, 5, 2, 1, 1, [1], quiet, rounds=2
    )
    assert calls == [
        ("ours", "round-1", 10, 2),
        ("naive", "round-1", 10, 2),
        ("naive", "round-2", None, None),
        ("ours", "round-2", None, None),
    ]
    assert result["systems"]["ours"]["capacity_rounds"] == [41.0, 44.0]
    assert result["systems"]["ours"]["capacity_rate"] == 42.5 and result["ranking_flips"] == []
    assert result["systems"]["naive"]["ratio_to_ours"] == round(7.5 / 42.5, 3)  # naive: 7 and 8
