"""Device, threads, precision and compilation: the choices every handler makes the same way at load."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from handlers.core import cpu
from handlers.core.cores import available_cores
from handlers.core.cpu import cpu_flags as cpu_flags  # the one reader of CPU flags, masked by TS_CPU_AS

logger = logging.getLogger(__name__)

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def choose_device(gpu_id: int | str | None) -> torch.device:
    """CUDA when TorchServe assigned this worker a GPU and CUDA works, else CPU."""
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{int(gpu_id)}")
    return torch.device("cpu")


class BackendUnavailable(Exception):
    """This machine or archive cannot run a backend at a precision; the message is the reason (logged, described)."""


def apply_cpu_kind() -> str | None:
    """Cap ATen/Inductor and oneDNN to the kind TS_CPU_AS asks for (handlers/core/cpu.py); returns its name or None.

    Runs when this module is imported, before the worker's first tensor operation: ATen fixes its kernels' instruction
    set at that first operation and would otherwise keep AVX-512 under an avx2 mask."""
    kind = cpu.requested_kind()
    if kind is None:
        return None
    os.environ.update(cpu.library_environment())
    chosen = torch.backends.cpu.get_cpu_capability()
    if kind.aten_capability == "avx2" and chosen.startswith("AVX512"):
        raise cpu.CpuKindUnavailable(
            f"{cpu.CPU_KIND_ENV}={kind.name}: torch already runs {chosen} kernels in this process "
            f"(set {cpu.CPU_KIND_ENV} before the process starts)"
        )
    return kind.name


# At import, before any tensor operation of the process (see apply_cpu_kind).
MASKED_CPU_KIND = apply_cpu_kind()


def cpu_kind() -> str:
    """The kind of CPU this process decides as: TS_CPU_AS's, else the machine's own (cpu.CPU_KINDS, or "other")."""
    return cpu.kind_of(cpu_flags())


def cpu_has_native_bf16() -> bool:
    """True when the CPU executes bf16 matrix work natively (AVX512-BF16 or AMX); emulated bf16 is slower than fp32."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def machine_can_run(precision: str, device: torch.device) -> str | None:
    """None when this device computes ``precision`` natively, else the reason it should not serve it.

    Emulated bf16 on a CPU without AVX512-BF16/AMX runs but is slower than fp32, so a prebuilt bf16 candidate is
    skipped there; fp16 is served on CUDA only; int8 (dynamic quantization) on CPU only."""
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        return "this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16)"
    if precision == "fp16" and device.type != "cuda":
        return f"fp16 is served on CUDA only; this worker runs on {device.type}"
    if precision == "int8" and device.type != "cpu":
        return f"int8 dynamic quantization runs on CPU only; this worker runs on {device.type}"
    return None


def resolve_precision(requested: str, device: torch.device) -> str:
    """Turn ``auto`` into a concrete precision for this device; explicit choices pass through."""
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "fp16"
    return "bf16" if cpu_has_native_bf16() else "fp32"


def set_threads(requested: int, workers: int) -> int:
    """Give each worker an equal share of the cores: N workers each using every core oversubscribe the CPU."""
    threads = requested or max(1, available_cores() // max(1, workers))
    torch.set_num_threads(threads)
    return threads


def convert_model(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """Return a copy of an fp32 eval model in the given precision (int8 = dynamic quantization of Linear layers)."""
    if precision == "fp32":
        return model
    if precision == "int8":
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    import copy

    return copy.deepcopy(model).to(FLOAT_DTYPES[precision])


def input_dtype(model: torch.nn.Module) -> torch.dtype:
    """The float dtype a model takes its inputs in: that of its first floating parameter, else fp32.

    Read from the model itself, so the fp32 reference and a reduced-precision candidate can be run one after the
    other (the accuracy gate) without any state to switch; int8 dynamic quantization keeps fp32 inputs."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32


def min_cosine_similarity(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """Smallest row-wise cosine similarity between two output batches (compared in fp32).

    Two all-zero rows are the same answer (1.0): a sparse row may activate nothing (SPLADE's log(1 + relu(x)) of a
    text whose every logit is negative), and cosine_similarity would call that pair 0. A zero row against a non-zero
    one stays 0."""
    reference = reference.float().flatten(1)
    candidate = candidate.float().flatten(1)
    similarity = torch.nn.functional.cosine_similarity(reference, candidate, dim=1)
    both_zero = (reference.abs().amax(dim=1) == 0) & (candidate.abs().amax(dim=1) == 0)
    return torch.where(both_zero, torch.ones_like(similarity), similarity).min().item()


def compile_model(model: torch.nn.Module) -> Any:
    """torch.compile with dynamic shapes, so that every batch size and length after warm-up reuses the same graphs.

    Returns a callable with the model's signature (and parameters)."""
    import torch._dynamo

    # Warm-up compiles each shape family once; raise the limit so none of them falls back to eager silently.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(model, dynamic=True)


def compile_count() -> int:
    """How many frames dynamo has compiled in this process (a recompilation raises it)."""
    from torch._dynamo.utils import counters

    return sum(counters["frames"].get(key, 0) for key in ("ok",))
