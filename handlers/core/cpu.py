"""The CPU's feature flags as this process sees them, and the kind of CPU it can be run as (``TS_CPU_AS``).

Every choice that depends on the CPU reads its flags here, through :func:`cpu_flags`: precision ``auto``, which bf16
candidates a worker refuses, whether a prebuilt AOTInductor package fits (handlers/core/runtime.py,
handlers/text/backends.py), the backends and precisions built at package time and the ``per_cpu_kind`` values packed
(scripts/build_backends.py, scripts/ops/machine.py). So ``TS_CPU_AS=avx2`` makes an AVX-512 machine decide everything
as an AVX2-only one would, and the tests can check each kind's decisions on one machine.

Masking only removes features. A kind whose features this CPU lacks (``amx`` on a machine without AMX) is refused
with :class:`CpuKindUnavailable`, never pretended: its kernels could not run here.

The libraries pick their instruction set themselves; :func:`library_environment` gives the variables that cap them to
the kind: ATen's vectorised kernels and the code Inductor generates (``ATEN_CPU_CAPABILITY``), oneDNN inside torch
and inside OpenVINO's CPU plugin (``ONEDNN_MAX_CPU_ISA``; seen: a convolution compiled by OpenVINO 2026.4 ran
``brgconv_avx512_f32`` on this AVX-512 machine and ``brgconv_avx2_f32`` with the cap). OpenVINO still lists BF16
among its capabilities under the cap; what decides its answers is the ``INFERENCE_PRECISION_HINT`` the backend passes,
which follows the precision chosen from these flags (f32 once bf16 is masked). ATen fixes its choice at the process's
first tensor operation, so the variables must be set before that: runtime.py sets them when it is imported and the
server sets them in the environment TorchServe passes to its workers.

Standard library only: scripts/ops/machine.py reads the flags here without importing torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

CPU_KIND_ENV = "TS_CPU_AS"
LIBRARY_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")  # what library_environment() sets


class CpuKindUnavailable(Exception):
    """``TS_CPU_AS`` names no kind, or a kind this machine cannot be run as; the message says which and why."""


@dataclass(frozen=True)
class CpuKind:
    name: str
    needs: frozenset[str]  # flags this machine must have to be run as the kind
    masked: tuple[str, ...]  # prefixes of the flags the kind does not have (removed from what the process sees)
    onednn_isa: str  # ONEDNN_MAX_CPU_ISA
    aten_capability: str  # ATEN_CPU_CAPABILITY
    picks: str  # what the project serves on it (docs, --help)


# The three kinds of development machine the docs tag figures with (README.md): AVX2 EPYC, AVX512-BF16 EPYC and
# AMX-BF16 Xeon. An AVX2 EPYC has no AVX-512 and no AVX-VNNI; an AVX512-BF16 EPYC has no AMX and no AVX512-FP16.
CPU_KINDS = {
    "avx2": CpuKind(
        "avx2",
        frozenset({"avx2", "fma"}),
        ("avx512", "avx10", "avx_", "amx"),
        "AVX2",
        "avx2",
        "no native bf16: precision auto serves fp32, bf16 candidates are refused",
    ),
    "avx512-bf16": CpuKind(
        "avx512-bf16",
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}),
        ("amx", "avx512_fp16", "avx10", "avx_"),
        "AVX512_CORE_BF16",
        "avx512",
        "native bf16 (avx512_bf16): precision auto serves bf16",
    ),
    "amx": CpuKind(
        "amx",
        frozenset({"avx512_bf16", "amx_tile", "amx_bf16"}),
        (),
        "AVX512_CORE_AMX",
        "avx512",
        "native bf16 (amx_bf16, avx512_bf16): precision auto serves bf16",
    ),
}


def machine_flags() -> set[str]:
    """The machine's own feature flags from /proc/cpuinfo, unmasked; empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            line = next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def requested_kind(environ: Mapping[str, str] | None = None) -> CpuKind | None:
    """The kind ``TS_CPU_AS`` asks for (None when unset: the machine as it is); an unknown name is refused."""
    name = (os.environ if environ is None else environ).get(CPU_KIND_ENV, "").strip()
    if not name:
        return None
    if name not in CPU_KINDS:
        raise CpuKindUnavailable(
            f"{CPU_KIND_ENV}={name!r} is not a CPU kind; kinds: {', '.join(CPU_KINDS)} (unset: this machine as it is)"
        )
    return CPU_KINDS[name]


def why_not(kind: CpuKind, flags: set[str] | None = None) -> str | None:
    """None when this machine can be run as ``kind``, else the reason it cannot."""
    missing = sorted(kind.needs - (machine_flags() if flags is None else flags))
    if missing:
        return (
            f"this CPU cannot run as {kind.name}: it lacks {' '.join(missing)} "
            f"({CPU_KIND_ENV} only masks features a CPU has)"
        )
    return None


def runnable_kinds(flags: set[str] | None = None) -> list[str]:
    """The kinds this machine can be run as (its own and the ones below it)."""
    flags = machine_flags() if flags is None else flags
    return [name for name, kind in CPU_KINDS.items() if why_not(kind, flags) is None]


def masked(flags: set[str], kind: CpuKind) -> set[str]:
    return {flag for flag in flags if not flag.startswith(kind.masked)} if kind.masked else set(flags)


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the project must treat them: the machine's, less what ``TS_CPU_AS`` masks.

    Raises CpuKindUnavailable when ``TS_CPU_AS`` asks for what this machine cannot be."""
    flags = machine_flags()
    kind = requested_kind()
    if kind is None:
        return flags
    reason = why_not(kind, flags)
    if reason:
        raise CpuKindUnavailable(reason)
    return masked(flags, kind)


def kind_of(flags: set[str]) -> str:
    """The highest kind among CPU_KINDS (listed lowest first) whose needed flags these have, else "other"."""
    fitting = [name for name, kind in CPU_KINDS.items() if kind.needs <= flags]
    return fitting[-1] if fitting else "other"


def library_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that cap ATen/Inductor and oneDNN (torch's and OpenVINO's) to the requested kind; {} unset."""
    kind = requested_kind(environ)
    if kind is None:
        return {}
    reason = why_not(kind)
    if reason:
        raise CpuKindUnavailable(reason)
    return dict(zip(LIBRARY_VARIABLES, (kind.aten_capability, kind.onednn_isa), strict=True))
