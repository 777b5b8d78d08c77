"""An archive's OpenVINO IR read for a worker, by every family that serves one (text, image, network): whether this
worker can serve it at all, and its compilation with the CPU plugin's settings (handlers/core/openvino_settings.py).

Kept apart from openvino_settings.py, which the load-test tools import without the worker's runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handlers.core.backend_manifest import BACKENDS_DIR
from handlers.core.openvino_settings import OPENVINO_PRECISIONS, openvino_config
from handlers.core.runtime import BackendUnavailable, machine_can_run

OPENVINO_IR = f"{BACKENDS_DIR}/openvino/model.xml"  # fp32 weights; bf16 is the precision hint at compilation


@dataclass(frozen=True)
class OpenVinoIR:
    """The IR as read (``model``, which a caller may still reshape) and the ``openvino`` module that read it."""

    openvino: Any
    core: Any
    model: Any
    precision: str

    def compile(self, threads: int) -> Any:
        """The model compiled for this CPU at the precision, on ``threads`` threads (fixed once compiled)."""
        return self.core.compile_model(self.model, "CPU", openvino_config(self.precision, threads))


def read_openvino_ir(precision: str, model_dir: Path, device: torch.device) -> OpenVinoIR:
    """The archive's IR in ``model_dir`` read for a worker on ``device`` serving ``precision``; raises
    BackendUnavailable with the reason where it cannot (not a CPU, a precision OpenVINO does not serve or this CPU
    does not compute natively, no IR in the archive, openvino not importable)."""
    if device.type != "cpu":
        raise BackendUnavailable(f"openvino is served on CPU only; this worker runs on {device.type}")
    if precision not in OPENVINO_PRECISIONS:
        raise BackendUnavailable(f"openvino serves {' or '.join(OPENVINO_PRECISIONS)}, not {precision}")
    reason = machine_can_run(precision, device)
    if reason:
        raise BackendUnavailable(reason)
    path = model_dir / OPENVINO_IR
    if not path.is_file():
        raise BackendUnavailable(f"no {OPENVINO_IR} in the archive (scripts/build_backends.py builds it)")
    try:
        import openvino
    except ImportError as error:
        raise BackendUnavailable(f"openvino is not importable ({error})") from None
    core = openvino.Core()
    return OpenVinoIR(openvino, core, core.read_model(str(path)), precision)
