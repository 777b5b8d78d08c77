"""The machine a measurement ran on: usable cores and the CPU flags that change the figures (bf16, AMX, AVX-512,
AVX2). These machines differ (some have AVX512-BF16, some AVX2 only), so every report names its CPU.

(The worker has its own cores() in handlers/core/runtime.py: the handler package cannot import scripts/. The flags
are read in one place, handlers/core/cpu.py, so TS_CPU_AS masks them for the tools as for the workers.)
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from handlers.core import cpu

# The flags that decide precision and kernel choices, in the order a report lists them.
NOTABLE_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


# Kinds of CPU that want different serving configs (model-config.yaml `per_cpu_kind:`, applied at package time):
# native bf16 (AVX512-BF16 or AMX) serves bf16 kernels, AVX2-only machines serve fp32.
CPU_KINDS = ("native-bf16", "avx2", "other")


def cpu_kind(flags: set[str] | None = None) -> str:
    """This machine's kind among CPU_KINDS (from its flags)."""
    flags = cpu_flags() if flags is None else flags
    if flags & {"avx512_bf16", "amx_bf16"}:
        return "native-bf16"
    return "avx2" if "avx2" in flags else "other"


def cores() -> int:
    """Cores this process may run on (its affinity; a container's limit), not the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the handlers see them (handlers/core/cpu.py: the machine's, less what TS_CPU_AS
    masks); empty where /proc/cpuinfo is not readable."""
    return cpu.cpu_flags()


def cpu_model(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """One line for a report: "<CPU model>, N cores, flags avx512_bf16 avx2" (the notable flags it has; with
    TS_CPU_AS, the masked ones and the kind it runs as)."""
    flags = cpu_flags()
    notable = [flag for flag in NOTABLE_FLAGS if flag in flags]
    kind = cpu.requested_kind()
    masked = f", run as {kind.name} ({cpu.CPU_KIND_ENV})" if kind else ""
    return (
        f"{cpu_model(cpuinfo)}, {cores()} cores, flags {' '.join(notable) or 'none of ' + '/'.join(NOTABLE_FLAGS)}"
        f"{masked}"
    )
