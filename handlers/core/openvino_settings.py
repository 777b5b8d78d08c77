"""How every family (text, image, network) compiles an OpenVINO IR for a worker: the precisions it serves and the
CPU plugin's settings (handlers/core/openvino_ir.py reads and compiles the archive's IR with them)."""

from __future__ import annotations

OPENVINO_PRECISIONS = {"fp32": "f32", "bf16": "bf16"}


def openvino_config(precision: str, threads: int) -> dict[str, str]:
    """CPU plugin settings: one latency stream on this worker's share of the cores, at the requested precision.

    Pinning is off: with several single-thread workers per machine, OpenVINO would pin each one's thread to a core
    of its own choosing (the same one for all of them); the OS spreads them instead."""
    return {
        "INFERENCE_PRECISION_HINT": OPENVINO_PRECISIONS[precision],
        "INFERENCE_NUM_THREADS": str(threads),
        "NUM_STREAMS": "1",
        "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_CPU_PINNING": "NO",
    }
