"""The decoder exported at package time, and what the package-time build measured (``decode/`` in the model folder).

``scripts/build_decode_steps.py`` traces the causal LM for the paged OpenVINO step once, when the archive is built,
and writes here:

    decode/manifest.json               what each decoding step measured: gate figures and step times, ranked
    decode/openvino/decoder.xml        the traced decoder as OpenVINO IR (stateful, before the paged transformation:
                                       OpenVINO cannot read a paged model back)
    decode/openvino/decoder.weights.json  where each of the IR's constants comes from (below)
    decode/openvino/decoder.extra.bin  the constants that are not the model's own tensors (shapes, scalars)

**No second copy of the weights.** An IR's ``.bin`` is its constants end to end. Every large one is one of the
model's parameters or buffers, byte for byte (or transposed), so the archive stores, per constant, which tensor it
is, and :func:`read` rebuilds the ``.bin`` at load from the model the worker has already loaded. The archive grows
by the XML and a few kB instead of the model's size again; a worker skips the trace (docs/results.md: the load).
A tensor that is missing or has another size at load (other weights, another transformers version's names) makes
:func:`read` refuse, and the worker traces the model itself as before.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

FOLDER = "decode"
MANIFEST = "manifest.json"
FORMAT = 1
IR = "openvino/decoder.xml"
WEIGHTS = "openvino/decoder.weights.json"
EXTRA = "openvino/decoder.extra.bin"


class ExportError(RuntimeError):
    """The exported decoder cannot be used with this model; the message says why."""


def model_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers by name (tied ones once per name)."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(dict(model.named_buffers(remove_duplicate=False)))
    return tensors


def tensor_bytes(tensor: torch.Tensor, transposed: bool) -> bytes:
    chosen = tensor.detach().t() if transposed else tensor.detach()
    return chosen.contiguous().numpy().tobytes()


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Source:
    name: str
    transposed: bool


def save(converted: Any, model: Any, folder: Path) -> list[str]:
    """Write ``converted`` (the stateful decoder of ``model``) as ``folder``/decode/openvino/…; returns the files
    written, relative to ``folder``."""
    import openvino as ov

    out = Path(folder) / FOLDER
    xml = out / IR
    xml.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(converted, str(xml), compress_to_fp16=False)  # fp32 as traced: the gate compares fp32 numbers
    blob = xml.with_suffix(".bin")
    data = np.fromfile(blob, dtype=np.uint8)
    blob.unlink()
    sources: dict[tuple[int, str], Source] = {}
    for name, tensor in model_tensors(model).items():
        if not tensor.is_floating_point() and tensor.dtype not in (torch.int64, torch.int32):
            continue
        for transposed in (False, True) if tensor.dim() == 2 else (False,):
            raw = tensor_bytes(tensor, transposed)
            sources.setdefault((len(raw), digest(raw)), Source(name, transposed))
    segments, extra = [], bytearray()
    for offset, size in constants(xml.read_text()):
        piece = data[offset : offset + size]
        source = sources.get((size, digest(piece.tobytes())))
        if source is not None:
            segments.append({"offset": offset, "size": size, "tensor": source.name, "transposed": source.transposed})
        else:
            segments.append({"offset": offset, "size": size, "extra": len(extra)})
            extra += piece.tobytes()
    (out / EXTRA).write_bytes(bytes(extra))
    recipe = {"format": FORMAT, "bin_size": int(data.size), "segments": segments}
    (out / WEIGHTS).write_text(json.dumps(recipe) + "\n")
    return [str(path.relative_to(folder)) for path in (xml, out / WEIGHTS, out / EXTRA)]


def constants(xml: str) -> list[tuple[int, int]]:
    """(offset, size) of every distinct region of the IR's .bin its XML reads, in order."""
    import re

    found = {(int(offset), int(size)) for offset, size in re.findall(r'offset="(\d+)"\s+size="(\d+)"', xml)}
    return sorted(found)


def exported(folder: Path) -> bool:
    return all((Path(folder) / FOLDER / name).is_file() for name in (IR, WEIGHTS, EXTRA))


def read(model: Any, folder: Path) -> Any:
    """The stateful decoder of ``folder``/decode/, its constants taken from ``model``'s own tensors; raises
    ExportError when they do not fit."""
    import openvino as ov

    out = Path(folder) / FOLDER
    try:
        recipe = json.loads((out / WEIGHTS).read_text())
        extra = (out / EXTRA).read_bytes()
        xml = (out / IR).read_text()
    except (OSError, ValueError) as error:
        raise ExportError(f"{FOLDER}/{WEIGHTS}: unreadable: {error}") from None
    if recipe.get("format") != FORMAT:
        raise ExportError(f"{FOLDER}/{WEIGHTS}: format {recipe.get('format')}, this worker reads {FORMAT}")
    tensors = model_tensors(model)
    blob = np.zeros(int(recipe["bin_size"]), dtype=np.uint8)
    for segment in recipe["segments"]:
        offset, size = segment["offset"], segment["size"]
        if "extra" in segment:
            blob[offset : offset + size] = np.frombuffer(extra, np.uint8, size, segment["extra"])
            continue
        tensor = tensors.get(segment["tensor"])
        raw = None if tensor is None else tensor_bytes(tensor, segment["transposed"])
        if raw is None or len(raw) != size:
            raise ExportError(f"the exported decoder reads tensor {segment['tensor']!r}, which this model "
                              f"{'lacks' if tensor is None else 'has in another size'}")  # fmt: skip
        blob[offset : offset + size] = np.frombuffer(raw, np.uint8)
    return ov.Core().read_model(xml, ov.Tensor(blob))


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """decode/manifest.json of ``folder`` (None: not built, e.g. a folder staged before this step existed)."""
    path = Path(folder) / FOLDER / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# Refusals of the package-time build that hold on any machine (the model's numbers and graph), and those that hold
# only on a CPU of the same kind (its speed; a step the CPU's kernels failed to run).
MODEL_REFUSALS = ("gate", "convert")
MACHINE_REFUSALS = ("slower", "run")


def planned(manifest: dict[str, Any], precisions: list[str], cpu_kind: str) -> tuple[list[str], list[dict[str, str]]]:
    """Of ``precisions`` (the paged step's, in the order the worker tries them), those the package-time build did
    not refuse for good, and the others as refusals: its gate and conversion refusals always carry over, a "slower
    than eager" one or a step that failed to run only to a CPU of the kind it was measured on; a precision it did
    not try is tried. On a CPU of the kind it was measured on, the kept ones are ordered by its ranking, fastest
    first."""
    same_kind = manifest.get("built_on", {}).get("cpu_kind") == cpu_kind
    holding = MODEL_REFUSALS + (MACHINE_REFUSALS if same_kind else ())
    kept, refused = [], []
    for precision in precisions:
        entry = refusal(manifest, "openvino", precision)
        if entry is None or entry.get("kind") not in holding:
            kept.append(precision)
        else:
            refused.append({"precision": precision, "kind": "package", "reason": f"at package time: {entry['reason']}"})
    if same_kind:  # measured on a CPU like this one: fastest first (a precision it did not rank keeps its place after)
        ranks = {p: ranked(manifest, "openvino", p) or len(precisions) + 1 for p in kept}
        kept.sort(key=lambda precision: ranks[precision])
    return kept, refused


def refusal(manifest: dict[str, Any] | None, step: str, precision: str) -> dict[str, Any] | None:
    """The package-time build's refusal of ``step`` at ``precision``, if it refused it."""
    for entry in (manifest or {}).get("refused", []):
        if entry.get("step") == step and entry.get("precision") == precision:
            return entry
    return None


def ranked(manifest: dict[str, Any] | None, step: str, precision: str) -> int | None:
    """The package-time rank of ``step`` at ``precision`` (1 = fastest), or None where it was not ranked."""
    for entry in (manifest or {}).get("candidates", []):
        if entry.get("step") == step and entry.get("precision") == precision:
            return int(entry["rank"])
    return None


def summary(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """What describe shows of the package-time build: the ranked steps' figures and the refusals, in short."""
    if manifest is None:
        return None
    return {
        "built_on": {key: manifest.get("built_on", {}).get(key) for key in ("cpu", "cpu_kind")},
        "ranked": [
            {key: entry.get(key) for key in ("rank", "step", "precision", "ms_per_token", "ms_per_step")}
            for entry in manifest.get("candidates", [])
        ],
        "refused": [
            {key: entry.get(key) for key in ("step", "precision", "kind", "reason")}
            for entry in manifest.get("refused", [])
        ],
        "decoder_exported": bool(manifest.get("decoder", {}).get("exported")),
    }
