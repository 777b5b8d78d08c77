"""python -m scripts.bench_worker_start: fresh-process worker starts, their phases, the saved record.

On the tiny MiniLM stand-in (tests/unit/tiny_minilm.py) laid out as an unpacked archive: one start is one Python
process loading the handler (a few seconds). No timing is asserted, only what the record holds and that it adds up.
"""

import json
import shutil

import pytest

from scripts import bench_worker_start


@pytest.fixture
def unpacked_archive(tiny_minilm_dir, tmp_path):
    """The tiny model as an unpacked minilm archive (its MAR-INF manifest names the model), without backends."""
    target = tmp_path / "minilm"
    shutil.copytree(tiny_minilm_dir, target)
    shutil.rmtree(target / "backends", ignore_errors=True)
    (target / "MAR-INF").mkdir()
    (target / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"model": {"modelName": "minilm"}}))
    return target


def test_each_start_is_recorded_with_its_phases_adding_up_to_its_load_time(unpacked_archive, tmp_path, capsys):
    out = tmp_path / "out"
    code = bench_worker_start.main(
        ["--archive", str(unpacked_archive), "--starts", "eager:fp32", "--repeats", "2", "--out", str(out)]
    )

    assert code == 0
    [saved] = out.glob("worker-start-*.json")
    record = json.loads(saved.read_text())
    assert record["machine"] and record["cpu_kind"] in ("native-bf16", "avx2", "other")
    [row] = record["rows"]
    assert (row["start"], row["served"], row["repeats"]) == ("eager:fp32", "eager fp32", 2)
    assert len(row["load_seconds_all"]) == 2 and row["process_seconds_median"] > row["load_seconds_median"]
    assert list(row["load_phases_median"]) == [
        "model",
        "reference_inputs",
        "gate_reference",
        "backend_load",
        "gate",
        "warmup",
        "other",
    ]
    for run in row["runs"]:
        assert sum(run["load_phases"].values()) == pytest.approx(run["load_seconds"])
    assert "| eager:fp32 | eager fp32 |" in capsys.readouterr().out


def test_a_start_that_cannot_serve_what_it_forces_fails_with_the_reason(unpacked_archive, tmp_path, capsys):
    code = bench_worker_start.main(
        ["--archive", str(unpacked_archive), "--starts", "aot:fp32", "--repeats", "1", "--out", str(tmp_path)]
    )

    assert code == 1
    assert "aot:fp32 did not start" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["fast", "aot:fp64", "auto,openvino:int4"])
def test_an_unknown_start_is_refused_naming_the_choices(bad, capsys):
    with pytest.raises(SystemExit) as exited:
        bench_worker_start.main(["--starts", bad])
    assert exited.value.code == 2
    assert "expected auto or BACKEND:PRECISION" in capsys.readouterr().err
