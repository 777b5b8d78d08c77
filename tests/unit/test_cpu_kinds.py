"""Running as another kind of CPU (TS_CPU_AS, handlers/core/cpu.py): every decision the project makes from the CPU
follows the masked kind, torch's and OpenVINO's instruction sets are capped to it, and a kind this machine lacks is
refused, never pretended."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from handlers.core import cpu, runtime
from scripts import build_backends, cpu_kinds
from scripts.ops import machine
from scripts.ops import server as ops_server

pytestmark = pytest.mark.cpu_kind

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
NO_NATIVE_BF16 = "this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16)"
# What each kind must decide: precision auto, why a bf16 candidate is refused (None: it is not), the backends built at
# package time, the per_cpu_kind values packed (scripts/ops/machine.py).
DECISIONS = {
    "avx2": ("fp32", NO_NATIVE_BF16, ["openvino", "aot"], "avx2"),
    "avx512-bf16": ("bf16", None, ["openvino"], "native-bf16"),
    "amx": ("bf16", None, ["openvino"], "native-bf16"),
}


@pytest.mark.parametrize("kind", list(cpu.CPU_KINDS))
def test_each_kind_decides_as_that_kind_where_this_cpu_can_be_it(kind, monkeypatch):
    monkeypatch.setenv(cpu.CPU_KIND_ENV, kind)
    if reason := cpu.why_not(cpu.CPU_KINDS[kind]):
        pytest.skip(reason)  # the refusal itself: test_a_kind_this_cpu_lacks_is_refused_not_pretended
    auto, bf16_refusal, built, packed = DECISIONS[kind]

    flags = runtime.cpu_flags()
    assert flags <= cpu.machine_flags() and cpu.CPU_KINDS[kind].needs <= flags
    assert runtime.cpu_kind() == kind and machine.cpu_kind() == packed
    assert runtime.resolve_precision("auto", CPU) == auto
    assert runtime.machine_can_run("bf16", CPU) == bf16_refusal
    assert build_backends.default_backends("cpu") == built
    assert build_backends.machine_precisions("cpu") == (["fp32"] if auto == "fp32" else ["fp32", "bf16"])
    assert f"run as {kind} (TS_CPU_AS)" in machine.describe()


def test_avx2_masks_every_avx512_and_amx_flag_and_an_aot_package_built_with_them_is_refused(monkeypatch):
    monkeypatch.setenv(cpu.CPU_KIND_ENV, "avx2")
    flags = runtime.cpu_flags()
    assert "avx2" in flags and not [flag for flag in flags if flag.startswith(("avx512", "amx"))]
    # A package compiled on this machine unmasked records its AVX-512 flags: as an AVX2 CPU it must not be loaded.
    assert build_backends.isa_flags() == sorted(f for f in flags if f.startswith(build_backends.ISA_FLAG_PREFIXES))
    assert cpu.library_environment() == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_without_ts_cpu_as_the_machine_is_as_it_is(monkeypatch):
    monkeypatch.delenv(cpu.CPU_KIND_ENV, raising=False)
    assert runtime.cpu_flags() == cpu.machine_flags()
    assert runtime.cpu_kind() == cpu.kind_of(cpu.machine_flags()) and cpu.library_environment() == {}


def test_a_kind_this_cpu_lacks_is_refused_not_pretended(monkeypatch):
    # Masking can only remove features: a CPU without AVX-512 cannot be run as avx512-bf16, one without AMX as amx.
    avx2_only = {"avx", "avx2", "fma", "f16c", "sse4_2"}
    monkeypatch.setattr(cpu, "machine_flags", lambda: set(avx2_only))
    assert cpu.runnable_kinds() == ["avx2"]
    for kind, missing in (("avx512-bf16", "avx512_bf16 avx512bw avx512f avx512vl"), ("amx", "amx_bf16")):
        monkeypatch.setenv(cpu.CPU_KIND_ENV, kind)
        for decide in (runtime.cpu_flags, cpu.library_environment, lambda: runtime.resolve_precision("auto", CPU)):
            with pytest.raises(cpu.CpuKindUnavailable, match=f"cannot run as {kind}: it lacks {missing}"):
                decide()
    listed = {entry["kind"]: entry for entry in cpu_kinds.kinds()}
    assert not listed["amx"]["runnable"] and "it lacks amx_bf16" in listed["amx"]["why_not"]


def test_an_unknown_kind_is_refused_naming_the_kinds(monkeypatch):
    monkeypatch.setenv(cpu.CPU_KIND_ENV, "avx512")
    with pytest.raises(cpu.CpuKindUnavailable, match="TS_CPU_AS='avx512' is not a CPU kind; kinds: avx2, avx512-bf16"):
        runtime.cpu_flags()


def test_the_server_passes_the_kind_and_its_library_caps_to_torchserve_and_so_its_workers(tmp_path):
    server = ops_server.Server(REPO / "config.properties", tmp_path, tmp_path / "logs", extra_env={"TS_CPU_AS": "avx2"})
    env = server.env()
    assert (env["TS_CPU_AS"], env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"]) == ("avx2", "avx2", "AVX2")


def test_the_cli_lists_the_kinds_this_machine_can_be_run_as(capsys):
    assert cpu_kinds.main(["--runnable"]) == 0
    assert capsys.readouterr().out.split() == cpu.runnable_kinds()
    assert cpu_kinds.main(["--json"]) == 0
    assert [entry["kind"] for entry in json.loads(capsys.readouterr().out)] == list(cpu.CPU_KINDS)


# Run in a fresh process, as a worker starts: the kernels torch and OpenVINO pick, with oneDNN's report of its ISA.
PROBE = """
import torch
from handlers.core import runtime
x = torch.randn(1, 8, 16, 16).to_mkldnn()
torch.mkldnn_convolution(x, torch.randn(8, 8, 3, 3).to_mkldnn(), None, [0, 0], [1, 1], [1, 1], 1)
print("aten", torch.backends.cpu.get_cpu_capability(), "kind", runtime.MASKED_CPU_KIND)
try:
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops
except ImportError:
    raise SystemExit(0)
image = ops.parameter([1, 16, 32, 32], np.float32)
weights = ops.constant(np.ones((16, 16, 3, 3), np.float32))
model = ov.Model([ops.convolution(image, weights, [1, 1], [0, 0], [0, 0], [1, 1])], [image])
compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
for op in compiled.get_runtime_model().get_ops():
    info = op.get_rt_info()
    if info["layerType"].astype(str) == "Convolution":
        print("openvino", info["primitiveType"].astype(str))
"""


def test_a_process_run_as_avx2_gets_avx2_kernels_from_torch_onednn_and_openvino():
    env = {**os.environ, cpu.CPU_KIND_ENV: "avx2", "ONEDNN_VERBOSE": "1"}
    for name in cpu.LIBRARY_VARIABLES:  # set by the process itself (runtime.py at import), not inherited here
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=True
    )
    lines = result.stdout.splitlines()
    assert "aten AVX2 kind avx2" in lines, result.stdout
    # torch's oneDNN reports its ISA, then OpenVINO's own copy (when installed) reports its own.
    isas = [line for line in lines if line.startswith("onednn_verbose") and ",isa:" in line]
    assert isas and all(line.endswith("isa:Intel AVX2") for line in isas), isas
    openvino = [line for line in lines if line.startswith("openvino ")]
    assert all(line.endswith("_avx2_f32") for line in openvino), openvino  # e.g. brgconv_avx2_f32
    if importlib.util.find_spec("openvino"):
        assert openvino, result.stdout
