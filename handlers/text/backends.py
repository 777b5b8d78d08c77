"""What runs a text model: one interface over eager torch, torch.compile, AOTInductor and OpenVINO.

Every backend is a callable ``(input_ids, attention_mask[, token_type_ids]) -> rows``: int64 tensors
``[rows, tokens]`` in, fp32 ``[rows, dim]`` out (embeddings, or a classifier's logits), so the handler, its accuracy
gate and its warm-up never ask which one runs.
:func:`load_backend` builds one from the fp32 encoder or from the artifacts the packaging step put under
``backends/`` in the archive, or raises :class:`BackendUnavailable` with the reason this worker cannot run it (a
missing artifact, a CPU without native bf16, openvino not importable, a package built for another device or CPU).
Which backend serves is decided by the handler's backend walk (handlers/core/base.py, ``backend: auto`` in
handlers/embeddings.py), which also checks every candidate against eager fp32 before it serves.

Archive layout (written by scripts/build_backends.py at package time)::

    backends/manifest.json            candidates ranked best first, what was refused at build time, the build CPU
    backends/aot-fp32.pt2, aot-bf16.pt2   AOTInductor packages (dynamic batch and length)
    backends/openvino/model.xml, .bin     OpenVINO IR of the fp32 encoder; bf16 is OpenVINO's inference precision hint
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from handlers.core import runtime
from handlers.core.aot import ISA_FLAGS
from handlers.core.aot import AotPackage as AotEncoder
from handlers.core.backend_manifest import BACKENDS_DIR, MANIFEST, read_manifest
from handlers.core.config import Option
from handlers.core.engine import Candidate
from handlers.core.openvino_ir import OPENVINO_IR, read_openvino_ir
from handlers.core.runtime import BackendUnavailable, machine_can_run

logger = logging.getLogger(__name__)

__all__ = [
    "BACKEND_OPTION",
    "OPENVINO_IR",
    "BackendUnavailable",
    "Encode",
    "auto_candidates",
    "check_prebuilt",
    "load_backend",
    "machine_can_run",
    "read_manifest",
]

Encode = Callable[..., torch.Tensor]  # (input_ids, attention_mask[, token_type_ids]) -> fp32 rows


def aot_package(precision: str) -> str:
    return f"{BACKENDS_DIR}/aot-{precision}.pt2"


def ranked_candidates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's candidates best first (by ``rank`` where given, else in file order)."""
    ordered = list(enumerate(manifest["candidates"]))
    ordered.sort(key=lambda pair: (pair[1].get("rank", pair[0] + 1), pair[0]))
    return [candidate for _, candidate in ordered]


# handler.backend of every model with prebuilt backends (text models and image models).
BACKEND_OPTION = Option(
    str,
    "auto",
    ("auto", "eager", "jit", "aot", "openvino"),
    help="what runs the model: auto = the best prebuilt candidate in backends/manifest.json that this "
    "machine runs and that passes the accuracy gate, else eager; eager = the torch module; jit = "
    "torch.compile at load; aot = the archive's AOTInductor package; openvino = its OpenVINO IR",
)


def auto_candidates(model_dir: str | Path, precision: str) -> list[Candidate]:
    """``backend: auto``'s walk: the archive's prebuilt candidates best first, then eager at the wanted precision,
    then eager fp32 (each checked by the engine's accuracy gate before it serves)."""
    manifest, problem = read_manifest(model_dir)
    candidates = []
    if manifest is None:
        logger.info("backend auto: %s, so eager serves", problem)
        last_resort = f"last resort: {problem}"
    else:
        ranked = ranked_candidates(manifest)
        for place, entry in enumerate(ranked, start=1):
            # ms_per_text for a text model, ms_per_image for an image model (scripts/build_backends.py)
            unit = next((key for key in entry if key.startswith("ms_per_") and key != "ms_per_bucket"), None)
            measured = f", {entry[unit]} {unit.replace('ms_per_', 'ms/')} at build" if unit else ""
            why = f"rank {place} of {len(ranked)} in {MANIFEST}{measured}"
            candidates.append(Candidate(entry["backend"], entry["precision"], why))
        for refused in manifest.get("refused") or []:
            logger.info("backend auto: refused when the archive was built: %s", refused)
        not_built = f" ({manifest['not_built']})" if manifest.get("not_built") else ""
        nothing_left = "every prebuilt candidate was refused" if ranked else f"{MANIFEST} lists none"
        nothing_left += not_built
        last_resort = f"last resort: {nothing_left}"
    candidates.append(Candidate("eager", precision, last_resort))
    if precision != "fp32":
        candidates.append(Candidate("eager", "fp32", f"{last_resort}; {precision} refused"))
    return candidates


def check_prebuilt(precision: str, device: torch.device, requested_precision: str) -> None:
    """Under ``backend: auto``, a prebuilt candidate serves only where it is what was asked for and what this machine
    computes well; raises BackendUnavailable with the reason otherwise."""
    reason = machine_can_run(precision, device)
    if reason:
        raise BackendUnavailable(reason)
    if requested_precision != "auto" and precision != requested_precision:
        raise BackendUnavailable(f"handler.precision is {requested_precision}")


def load_backend(
    name: str,
    precision: str,
    model_dir: str | Path,
    fp32_model: torch.nn.Module,
    threads: int,
    device: torch.device,
    *,
    widest_threads: int | None = None,
    max_rows: int | None = None,
    max_tokens: int | None = None,
) -> Encode:
    """The callable that computes embeddings with backend ``name`` at ``precision``.

    ``max_rows`` / ``max_tokens``: the largest forward pass this worker makes, checked against a prebuilt package's
    dynamic bounds where the manifest states them. ``widest_threads``: the most threads a forward pass may get from
    the server's core lease (handlers/core/cores.py); eager and jit follow torch's thread count per call, OpenVINO
    compiles a second model for it, AOTInductor's count was fixed when it was compiled. Raises
    :class:`BackendUnavailable` (message = the reason) when this machine or archive cannot run it; the accuracy gate
    against eager fp32 is the caller's."""
    if name == "eager":
        return runtime.convert_model(fp32_model, precision)
    if name == "jit":
        return runtime.compile_model(runtime.convert_model(fp32_model, precision))
    if name == "aot":
        return load_aot(precision, Path(model_dir), device, max_rows, max_tokens)
    if name == "openvino":
        return load_openvino(precision, Path(model_dir), threads, device, widest_threads)
    raise BackendUnavailable(f"unknown backend {name!r}")


def manifest_entry(model_dir: Path, name: str, precision: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the manifest, its candidate entry for name/precision); empty dicts where the archive has none."""
    manifest, _ = read_manifest(model_dir)
    if manifest is None:
        return {}, {}
    entry: dict[str, Any] = next(
        (c for c in manifest["candidates"] if (c["backend"], c["precision"]) == (name, precision)), {}
    )
    return manifest, entry


def load_aot(
    precision: str, model_dir: Path, device: torch.device, max_rows: int | None, max_tokens: int | None
) -> Encode:
    """The prebuilt AOTInductor package for ``precision``, after checking it fits this worker and this CPU.

    Its kernels' thread count was fixed when it was compiled (inductor writes it into the code), not by this worker."""
    package = aot_package(precision)
    path = model_dir / package
    if not path.is_file():
        raise BackendUnavailable(f"no {package} in the archive (scripts/build_backends.py builds it)")
    manifest, entry = manifest_entry(model_dir, "aot", precision)
    problems = []
    built_device = entry.get("device", "cpu")
    if built_device != device.type:
        problems.append(f"it was built for {built_device}, this worker runs on {device.type}")
    built_flags = set((manifest.get("built_on") or {}).get("flags") or ()) & ISA_FLAGS
    missing = sorted(built_flags - runtime.cpu_flags()) if device.type == "cpu" else []
    if missing:
        problems.append(f"it was compiled on a CPU with {' '.join(missing)}, which this CPU lacks")
    if max_tokens is not None and entry.get("max_tokens", max_tokens) < max_tokens:
        problems.append(f"it takes at most {entry['max_tokens']} tokens, the last bucket is {max_tokens}")
    if max_rows is not None and entry.get("max_batch", max_rows) < max_rows:
        problems.append(f"it takes at most {entry['max_batch']} rows, a forward pass may hold {max_rows}")
    if problems:
        raise BackendUnavailable(f"{package} does not fit: " + "; ".join(problems))
    return AotEncoder(path)


class OpenVinoEncoder:
    """OpenVINO compiled models behind the backend interface: torch int64 tensors in, a torch fp32 tensor out.

    One infer request per compiled model, reused: a worker computes one forward pass at a time. A compiled model's
    thread count is fixed when it is compiled, so a worker that may widen a forward pass onto idle cores (the core
    lease) holds one compiled model per thread count, ``{threads: compiled}``, and each call runs the one for the
    threads the engine set for that batch (torch's intra-op count, the process's one setting of it)."""

    def __init__(self, compiled_by_threads: dict[int, Any]) -> None:
        self.requests = {threads: compiled.create_infer_request() for threads, compiled in compiled_by_threads.items()}
        self.narrowest = min(self.requests)
        # The IR's inputs are the module's forward arguments in order (scripts/build_backends.py converts it with
        # them as its example): input_ids, attention_mask, then the model's own (TextModelFolder.model_inputs).
        first = compiled_by_threads[self.narrowest]
        self.dtypes = [port.get_element_type().to_dtype() for port in first.inputs]

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        feeds = {
            index: tensor.cpu().numpy().astype(self.dtypes[index], copy=False) for index, tensor in enumerate(tensors)
        }
        request = self.requests.get(torch.get_num_threads()) or self.requests[self.narrowest]
        request.infer(feeds)
        # The request owns its output buffer and overwrites it on the next call: copy it out.
        return torch.from_numpy(request.get_output_tensor(0).data.copy()).to(torch.float32)


def load_openvino(
    precision: str, model_dir: Path, threads: int, device: torch.device, widest_threads: int | None = None
) -> Encode:
    """The archive's OpenVINO IR compiled for this CPU (bf16 as OpenVINO's inference precision hint), for ``threads``
    and, where given, also for ``widest_threads`` (the core lease's forward passes on every idle core)."""
    ir = read_openvino_ir(precision, model_dir, device)
    model, openvino = ir.model, ir.openvino
    if any(not port.get_partial_shape().is_dynamic for port in model.inputs):
        # Every batch size and bucket length goes through one compiled model.
        model.reshape(
            {port: openvino.PartialShape([-1] * port.get_partial_shape().rank.get_length()) for port in model.inputs}
        )
    counts = sorted({threads, widest_threads or threads})
    return OpenVinoEncoder({count: ir.compile(count) for count in counts})


class LengthRouted:
    """A compiled backend for most lengths and eager (same precision) for the padded lengths where eager is faster.

    The archive's ranking measures every backend per length bucket; where eager beats the compiled candidate by a
    margin (OpenVINO bf16 on the AMX Xeon: 5x eager on 16-token rows, 0.6x on 256-token rows) the manifest lists that
    bucket under the candidate's ``eager_buckets``, and the long rows that set p99 stop paying for the short rows'
    winner. Rows arrive padded to a bucket length, so the padded length decides. Both halves pass the accuracy gate
    together: the gate's reference batch is padded per bucket, so it runs through both."""

    def __init__(self, compiled: Encode, eager: Encode, eager_lengths: set[int]) -> None:
        self.compiled = compiled
        self.eager = eager
        self.eager_lengths = eager_lengths

    def __call__(self, input_ids: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        model = self.eager if input_ids.shape[1] in self.eager_lengths else self.compiled
        return model(input_ids, *rest)


def eager_lengths(entry: dict[str, Any], buckets: list[int]) -> set[int]:
    """The bucket lengths a manifest candidate routes to eager (only lengths this worker pads to count)."""
    listed = entry.get("eager_buckets") or []
    if not isinstance(listed, list):
        return set()
    return {length for length in listed if type(length) is int and length in buckets}
