"""What computes a network: eager torch, torch.compile, AOTInductor or OpenVINO, at fp32 or a reduced precision,
behind one callable the engine (handlers/network/engine.py) calls as it calls the exported program.

Candidates (built at package time by scripts/build_backends.py from the archive's exported program, gated against
eager and ranked by speed; the manifest is ``backends/manifest.json``)::

    backends/aot-<precision>.pt2    AOTInductor package, the program's own dynamic dims (fp32: the ExportedProgram
                                    itself; bf16/fp16: the program at that precision, exported again with the same
                                    dims); compiled for the build CPU's vector ISA and for the worker's threads
    backends/openvino/model.xml     OpenVINO IR converted from the ExportedProgram (dynamic dims kept, fp32 weights);
                                    bf16 is OpenVINO's inference precision hint at load, so one IR serves both
    jit                             torch.compile of the program at worker load (no artifact), warmed up over the
                                    served shapes before the worker takes requests

Precision: fp32 always; bf16 only where the CPU has native bf16 (handlers/core/runtime.machine_can_run, which
``TS_CPU_AS`` masks); fp16 only on CUDA. At a reduced precision float inputs are cast in and float outputs cast back
to fp32; integer and bool tensors are never cast.

The gate (:func:`gate`) compares a candidate with the reference on the signature file's example and on generated
inputs (:func:`gate_batches`), output by output:

- float outputs: the smallest cosine similarity (per row; over the whole output where a row holds one value) and the
  largest relative error, ``max |candidate - reference| / max |reference|``. An fp32 candidate must reach
  cosine >= :data:`FP32_MIN_COSINE` and relative error <= :data:`FP32_MAX_RELATIVE` (it must compute what eager
  computes, to float rounding); a bf16/fp16 candidate cosine >= :data:`REDUCED_MIN_COSINE` (the text family's bound);
- integer and bool outputs: exactly equal, at every precision (an id or a class that changes is a wrong answer);
- the reference is eager fp32, computed twice and once on one thread: where the runs differ (a program whose fp32
  answers are not reproducible: a deep CNN's convolutions sum in another order on another thread count), eager fp64
  is the reference instead, what eager fp32 itself scores against it is recorded, and an fp32 candidate must be
  within 1e-5 of fp64 or within :data:`FP32_FLOOR_FACTOR` times eager fp32's own error, whichever is wider.

A candidate below the gate is refused with its measured values and never served. At load (:func:`load_served`) the
recorded winner is loaded and gated again on this machine; where it cannot load (another CPU kind, a missing
library) or fails the gate here, the next ranked candidate is tried, and eager fp32 serves last, with the reasons
kept for describe.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from handlers.core import runtime
from handlers.core.aot import ISA_FLAGS, AotPackage
from handlers.core.backend_manifest import BACKENDS_DIR, MANIFEST, read_manifest
from handlers.core.openvino_ir import OPENVINO_IR as OPENVINO_IR  # the archive's IR, for the build and tests
from handlers.core.openvino_ir import read_openvino_ir
from handlers.core.runtime import BackendUnavailable
from handlers.network.inputs import check_request, native_tensor
from handlers.network.program import PROGRAM_FILE as PROGRAM_FILE  # the staged folder's files, for the build
from handlers.network.program import SIGNATURE_FILES as SIGNATURE_FILES
from handlers.network.signature import Signature, TensorSpec

logger = logging.getLogger(__name__)

BACKENDS = ("aot", "openvino", "jit")
CHOICES = ("auto", "eager", *BACKENDS)  # the handler's backend option
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # the handler's precision option
FP32_MIN_COSINE = 0.9999
FP32_MAX_RELATIVE = 1e-5
# Against an fp64 reference, an fp32 candidate may be this many times as far from it as eager fp32 itself is.
FP32_FLOOR_FACTOR = 2.0
REDUCED_MIN_COSINE = 0.999
GATE_SEED = 0
GATE_MAX_ROWS = 64  # the largest generated batch (also capped by the program's own rows range)
GATE_MAX_SIZE = 32  # the largest size a generated batch gives another dynamic dimension
UNRANGED_IDS = (0, 9)  # ids for an integer input whose range neither the program nor the signature file gives

Program = Callable[..., Any]  # called as the exported program is: its inputs positionally / by keyword, in order
Batch = tuple[torch.Tensor, ...]  # one tensor per input, in the signature's order


def aot_package(precision: str) -> str:
    return f"{BACKENDS_DIR}/aot-{precision}.pt2"


# --------------------------------------------------------------------------------------------- precision
class AtPrecision(torch.nn.Module):
    """The fp32 program computed at another float precision: its float parameters and float inputs in ``dtype``, its
    bf16/fp16 outputs back in fp32 (fp64, the gate's reference, keeps fp64); integer and bool tensors as they are."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = copy.deepcopy(module).to(dtype)
        self.dtype = dtype

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> Any:
        args, kwargs = pytree.tree_map(self.narrow, (args, kwargs))
        return pytree.tree_map(widen, self.inner(*args, **kwargs))

    def narrow(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.dtype) if tensor.is_floating_point() else tensor


def widen(tensor: torch.Tensor) -> torch.Tensor:
    """A reduced-precision output back in fp32 (an fp64 reference's outputs stay fp64)."""
    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


def at_precision(module: torch.nn.Module, precision: str) -> torch.nn.Module:
    if precision == "fp32":
        return module
    dtype = torch.float64 if precision == "fp64" else runtime.FLOAT_DTYPES[precision]
    return AtPrecision(module, dtype)


# --------------------------------------------------------------------------------------------- loading one backend
def load_backend(
    name: str,
    precision: str,
    model_dir: str | Path,
    program: torch.export.ExportedProgram,
    signature: Signature,
    threads: int,
    device: torch.device,
) -> Program:
    """The callable that computes the network with backend ``name`` at ``precision``; raises BackendUnavailable with
    the reason where this machine or archive cannot run it (the gate is the caller's)."""
    reason = runtime.machine_can_run(precision, device)
    if reason:
        raise BackendUnavailable(reason)
    if name == "eager":
        return at_precision(program.module(), precision).to(device)
    if name == "jit":
        return runtime.compile_model(at_precision(program.module(), precision).to(device))
    if name == "aot":
        return load_aot(precision, Path(model_dir), device)
    if name == "openvino":
        return load_openvino(precision, Path(model_dir), signature, threads, device)
    raise BackendUnavailable(f"unknown backend {name!r}")


def load_aot(precision: str, model_dir: Path, device: torch.device) -> Program:
    package = aot_package(precision)
    path = model_dir / package
    if not path.is_file():
        raise BackendUnavailable(f"no {package} in the archive (scripts/build_backends.py builds it)")
    manifest, _ = read_manifest(model_dir)
    entry = candidate_entry(manifest, "aot", precision)
    built_device = entry.get("device", "cpu")
    if built_device != device.type:
        raise BackendUnavailable(f"{package} was built for {built_device}; this worker runs on {device.type}")
    built_flags = set(((manifest or {}).get("built_on") or {}).get("flags") or ()) & ISA_FLAGS
    missing = sorted(built_flags - runtime.cpu_flags()) if device.type == "cpu" else []
    if missing:
        raise BackendUnavailable(f"{package} was compiled on a CPU with {' '.join(missing)}, which this CPU lacks")
    return AotPackage(path)


class OpenVinoProgram:
    """An OpenVINO compiled model called as the exported program is: the IR's inputs are the program's user inputs
    in order (positional, then keyword), its outputs the program's outputs in order, each returned in the dtype the
    signature gives it (OpenVINO may narrow an int64 output)."""

    def __init__(self, compiled: Any, signature: Signature) -> None:
        self.request = compiled.create_infer_request()  # a worker computes one forward pass at a time
        self.output_dtypes = [spec.dtype for spec in signature.outputs]

    def __call__(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tensors = [*args, *kwargs.values()]
        self.request.infer({index: tensor.cpu().numpy() for index, tensor in enumerate(tensors)})
        # The request owns its output buffers and overwrites them on the next call: copy them out.
        return tuple(
            torch.from_numpy(self.request.get_output_tensor(index).data.copy()).to(dtype)
            for index, dtype in enumerate(self.output_dtypes)
        )


def load_openvino(precision: str, model_dir: Path, signature: Signature, threads: int, device: torch.device) -> Program:
    return OpenVinoProgram(read_openvino_ir(precision, model_dir, device).compile(threads), signature)


# --------------------------------------------------------------------------------------------- gate inputs
def gate_batches(signature: Signature, max_rows: int = GATE_MAX_ROWS, seed: int = GATE_SEED) -> list[Batch]:
    """The gate's inputs: the signature file's example (as sent, and repeated to a few rows) and generated batches
    at the ends of the dynamic ranges: the fewest rows with the largest other sizes, a few rows with the smallest,
    the most rows with sizes between. Ids are drawn within each input's range, floats from N(0, 1)."""
    batches = []
    if signature.example is not None:
        wires = {name: native_tensor(name, data) for name, data in signature.example.items()}
        example = tuple(check_request(wires, signature, 2**31).tensors)
        batches.append(example)
        batches.append(tuple(t[[i % t.shape[0] for i in range(5)]] for t in example))
    rows = signature.rows
    most = min(max_rows, rows.high or max_rows)
    fewest = max(1, rows.low)
    generator = torch.Generator().manual_seed(seed)
    for count, size in ((fewest, "high"), (min(max(fewest, 3), most), "low"), (most, "mid")):
        batches.append(generated_batch(signature, count, size, generator))
    return batches


def generated_batch(signature: Signature, rows: int, which: str, generator: torch.Generator) -> Batch:
    sizes: dict[str, int] = {}
    for spec in signature.inputs:
        for dim in spec.dims[1:]:
            if dim.size is None and dim.symbol not in sizes:
                low, high = max(dim.low, 1), min(dim.high or GATE_MAX_SIZE, GATE_MAX_SIZE)
                high = max(high, low)
                sizes[str(dim.symbol)] = {"low": low, "high": high, "mid": (low + high) // 2}[which]
    return tuple(
        generated_tensor(
            spec, [rows, *(d.size if d.size is not None else sizes[str(d.symbol)] for d in spec.dims[1:])], generator
        )
        for spec in signature.inputs
    )


def generated_tensor(spec: TensorSpec, shape: list[int], generator: torch.Generator) -> torch.Tensor:
    if spec.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if spec.dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(spec.dtype)
    low, high = (spec.value_range.low, spec.value_range.high) if spec.value_range else UNRANGED_IDS
    return torch.randint(low, high + 1, shape, generator=generator).to(spec.dtype)


# --------------------------------------------------------------------------------------------- the gate
@dataclass
class Reference:
    """What candidates are compared with: the outputs on each gate batch, and what computed them."""

    batches: list[Batch]
    outputs: list[dict[str, torch.Tensor]]
    name: str  # "eager fp32", or "eager fp64" where eager fp32 differs between runs
    record: dict[str, Any] = field(default_factory=dict)
    fp32_relative_floor: float = 0.0  # eager fp32's own largest relative error against the fp64 reference


def reference_for(module: torch.nn.Module, signature: Signature, batches: list[Batch]) -> Reference:
    """Eager fp32 on each batch, run twice, and once more on one thread. Where the runs are not identical, eager fp32
    is not reproducible (a parallel reduction sums in another order on another thread count, as a worker with other
    threads or another machine would), so it cannot be what a candidate must equal to 1e-5: eager fp64 is the
    reference instead, and eager fp32's own distance to it is recorded. An fp32 candidate must then be as close to
    the exact answer as 1e-5, or as eager fp32 itself is (within a factor of 2: two fp32 evaluations' rounding
    errors add), whichever is wider (:func:`gate`)."""
    threads = torch.get_num_threads()
    with torch.inference_mode():
        first = [signature.call(module, batch) for batch in batches]
        second = [signature.call(module, batch) for batch in batches]
        torch.set_num_threads(1)
        try:
            alone = [signature.call(module, batch) for batch in batches] if threads > 1 else second
        finally:
            torch.set_num_threads(threads)
    unstable = sorted(
        {
            name
            for a, b, c in zip(first, second, alone, strict=True)
            for name in a
            if not (identical(a[name], b[name]) and identical(a[name], c[name]))
        }
    )
    if not unstable:
        return Reference(batches, first, "eager fp32")
    wide = at_precision(module, "fp64")
    with torch.inference_mode():
        outputs = [signature.call(wide, batch) for batch in batches]
    eager_fp32 = compare_all(outputs, first, signature)
    floor = max((m["max_relative"] for m in eager_fp32.values() if "max_relative" in m), default=0.0)
    record = {"eager_fp32_unstable_outputs": unstable, "eager_fp32_against_fp64": eager_fp32}
    return Reference(batches, outputs, "eager fp64", record, fp32_relative_floor=floor)


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and bool(torch.equal(a, b) or torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    )


def measure_output(spec: TensorSpec, expected: torch.Tensor, got: torch.Tensor) -> dict[str, Any]:
    """One output on one batch: {"exact": bool} for integers and bools, {"min_cosine", "max_relative"} for floats."""
    if tuple(got.shape) != tuple(expected.shape):
        return {"error": f"shape {list(got.shape)}, expected {list(expected.shape)}"}
    if not spec.dtype.is_floating_point:
        return {"exact": bool(torch.equal(got.to(expected.dtype), expected))}
    reference, candidate = expected.double(), got.double()
    if reference.numel() == 0:
        return {"min_cosine": 1.0, "max_relative": 0.0}
    scale = reference.abs().max().item()
    relative = (candidate - reference).abs().max().item() / scale if scale > 0 else float(candidate.abs().max() > 0)
    rows = reference.reshape(reference.shape[0], -1)
    if rows.shape[1] < 2:  # one value per row: the cosine of a single number is only its sign
        rows, candidate_rows = reference.reshape(1, -1), candidate.reshape(1, -1)
    else:
        candidate_rows = candidate.reshape(candidate.shape[0], -1)
    cosine = runtime.min_cosine_similarity(rows, candidate_rows)
    return {"min_cosine": cosine, "max_relative": relative}


def compare_all(
    expected: Sequence[Mapping[str, torch.Tensor]], got: Sequence[Mapping[str, torch.Tensor]], signature: Signature
) -> dict[str, dict[str, Any]]:
    """Per output, the worst over every batch (smallest cosine, largest relative error, exact only if always)."""
    worst: dict[str, dict[str, Any]] = {}
    for want, have in zip(expected, got, strict=True):
        for spec in signature.outputs:
            measured = measure_output(spec, want[spec.name], have[spec.name])
            known = worst.setdefault(spec.name, {})
            for key, value in measured.items():
                if key == "min_cosine":
                    known[key] = min(known.get(key, 1.0), value)
                elif key == "max_relative":
                    known[key] = max(known.get(key, 0.0), value)
                elif key == "exact":
                    known[key] = known.get(key, True) and value
                else:
                    known.setdefault(key, value)
    return {name: {k: round(v, 9) if isinstance(v, float) else v for k, v in m.items()} for name, m in worst.items()}


@dataclass(frozen=True)
class Verdict:
    refused: str | None  # None: it passes
    min_cosine: float  # over the float outputs (1.0 where there are none)
    max_relative: float
    outputs: dict[str, dict[str, Any]]

    def record(self) -> dict[str, Any]:
        return {"gate_min_cosine": self.min_cosine, "gate_max_relative": self.max_relative, "gate": self.outputs}


def bounds(precision: str, min_cosine: float | None = None) -> tuple[float, float | None]:
    """(smallest cosine, largest relative error or None) a candidate at ``precision`` must reach."""
    if precision == "fp32":
        return FP32_MIN_COSINE, FP32_MAX_RELATIVE
    return min_cosine or REDUCED_MIN_COSINE, None


def gate(
    candidate: Program, precision: str, signature: Signature, reference: Reference, min_cosine: float | None = None
) -> Verdict:
    """The candidate's outputs on the reference's batches measured against the reference's, and its verdict."""
    with torch.inference_mode():
        got = [signature.call(candidate, batch) for batch in reference.batches]
    outputs = compare_all(reference.outputs, got, signature)
    cosine = min((m["min_cosine"] for m in outputs.values() if "min_cosine" in m), default=1.0)
    relative = max((m["max_relative"] for m in outputs.values() if "max_relative" in m), default=0.0)
    least_cosine, most_relative = bounds(precision, min_cosine)
    if most_relative is not None:
        most_relative = max(most_relative, FP32_FLOOR_FACTOR * reference.fp32_relative_floor)
    problems = [f"output {name!r}: {m['error']}" for name, m in outputs.items() if "error" in m]
    problems += [
        f"integer output {name!r} differs from {reference.name}"
        for name, m in outputs.items()
        if m.get("exact") is False
    ]
    if cosine < least_cosine:
        problems.append(f"min cosine to {reference.name} {cosine:.6f} < {least_cosine}")
    if most_relative is not None and relative > most_relative:
        problems.append(f"max relative error to {reference.name} {relative:.3g} > {most_relative:g}")
    refused = "gate: " + "; ".join(problems) if problems else None
    return Verdict(refused, round(cosine, 9), float(f"{relative:.3g}"), outputs)


# --------------------------------------------------------------------------------------------- the manifest
def candidate_entry(manifest: dict[str, Any] | None, backend: str, precision: str) -> dict[str, Any]:
    candidates = (manifest or {}).get("candidates") or []
    return next((c for c in candidates if (c.get("backend"), c.get("precision")) == (backend, precision)), {})


def ranked(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    ordered = list(enumerate(manifest["candidates"]))
    ordered.sort(key=lambda pair: (pair[1].get("rank", pair[0] + 1), pair[0]))
    return [candidate for _, candidate in ordered]


# --------------------------------------------------------------------------------------------- serving the winner
@dataclass
class Served:
    """What a worker computes with, and why (:func:`load_served`)."""

    program: Program
    backend: str
    precision: str
    why: str
    passed_over: list[str] = field(default_factory=list)  # each better-ranked candidate not served, and why
    manifest: dict[str, Any] | None = None
    gate: dict[str, Any] = field(default_factory=dict)  # this load's gate of what serves
    load_seconds: float = 0.0

    def describe(self) -> dict[str, Any]:
        """For the model's describe: the backend and precision serving, why, and what every candidate measured."""
        manifest = self.manifest or {}
        rank = manifest.get("ranking_benchmark") or {}
        return {
            "backend": self.backend,
            "precision": self.precision,
            "why": self.why,
            "passed_over": self.passed_over,
            "gate_at_load": self.gate,
            "load_seconds": round(self.load_seconds, 2),
            "candidates": [summary(entry) for entry in manifest.get("candidates") or []],
            "refused_at_build": [summary(entry) for entry in manifest.get("refused") or []],
            "eager_ms_per_row": rank.get("eager_ms_per_row"),
            "built_on": manifest.get("built_on"),
        }


def summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("backend", "precision", "rank", "ms_per_row", "gate_min_cosine", "gate_max_relative", "reason")
    return {key: entry[key] for key in keys if key in entry}


def warm_up(program: Program, signature: Signature, max_rows: int) -> None:
    """The served shapes once each (one row, two rows, a full pass): torch.compile compiles its graphs here, the
    others allocate, before the first request waits on it."""
    generator = torch.Generator().manual_seed(GATE_SEED + 1)
    with torch.inference_mode():
        for rows in sorted({max(1, signature.rows.low), max(2, signature.rows.low), max_rows}):
            signature.call(program, generated_batch(signature, rows, "mid", generator))


def load_served(
    model_dir: str | Path,
    program: torch.export.ExportedProgram,
    signature: Signature,
    threads: int = 1,
    device: torch.device | None = None,
    max_rows: int = GATE_MAX_ROWS,
    min_cosine: float | None = None,
    backend: str = "auto",
    precision: str = "auto",
) -> Served:
    """The callable a worker serves: the best candidate asked for (:func:`requested`: ``backend``/``precision``
    ``auto`` = the manifest's ranking) that loads here and passes the gate again on this machine (against eager
    fp32, on the gate's generated inputs), else eager fp32; each candidate passed over is kept with its reason.
    ``max_rows``: the largest forward pass the engine makes (warm-up and gate sizes)."""
    device = device or torch.device("cpu")
    started = time.perf_counter()
    module = program.module().to(device)
    manifest, problem = read_manifest(model_dir)
    if backend == "eager" and precision in ("auto", "fp32"):
        return Served(module, "eager", "fp32", "configured: backend eager", manifest=manifest)
    entries, why_none = requested(manifest, problem, backend, precision)
    if not entries:
        return Served(module, "eager", "fp32", f"eager: {why_none}", [], manifest, {}, time.perf_counter() - started)
    passed_over: list[str] = []
    reference = reference_for(module, signature, gate_batches(signature, min(max_rows, GATE_MAX_ROWS)))
    for place, entry in enumerate(entries, start=1):
        name, at = str(entry.get("backend")), str(entry.get("precision"))
        loaded, verdict, reason = try_candidate(
            name, at, model_dir, program, signature, threads, device, max_rows, reference, min_cosine
        )
        if loaded is None or verdict is None:
            passed_over.append(f"{name}/{at}: {reason}")
            continue
        why = f"rank {place} of {len(entries)} in {MANIFEST}" if "rank" in entry else "configured"
        if "ms_per_row" in entry:
            why += f", {entry['ms_per_row']} ms/row at build"
        return Served(loaded, name, at, why, passed_over, manifest, verdict.record(), time.perf_counter() - started)
    for reason in passed_over:
        logger.warning("network backend passed over: %s", reason)
    why = "eager: every candidate asked for was passed over"
    return Served(module, "eager", "fp32", why, passed_over, manifest, load_seconds=time.perf_counter() - started)


def requested(
    manifest: dict[str, Any] | None, problem: str, backend: str, precision: str
) -> tuple[list[dict[str, Any]], str]:
    """(the candidates to try, best first; why there are none). ``auto`` takes the manifest's ranking, restricted to
    an explicit backend or precision where one is named; an explicit backend the manifest does not list is tried
    as named (jit needs no artifact; aot and openvino then say which file is missing), at fp32 unless a precision is
    named."""
    listed = ranked(manifest) if manifest is not None else []
    chosen = [
        entry
        for entry in listed
        if backend in ("auto", entry.get("backend")) and precision in ("auto", entry.get("precision"))
    ]
    if chosen:
        return chosen, ""
    if backend != "auto":
        return [{"backend": backend, "precision": "fp32" if precision == "auto" else precision}], ""
    if manifest is None:
        return [], problem
    if precision != "auto":
        return [], f"{MANIFEST} lists no candidate at {precision}"
    return [], f"{MANIFEST} lists none" + (f" ({manifest['not_built']})" if manifest.get("not_built") else "")


def try_candidate(
    name: str,
    precision: str,
    model_dir: str | Path,
    program: torch.export.ExportedProgram,
    signature: Signature,
    threads: int,
    device: torch.device,
    max_rows: int,
    reference: Reference,
    min_cosine: float | None,
) -> tuple[Program | None, Verdict | None, str]:
    """(the loaded candidate, its gate here, "") or (None, None, why it cannot serve here)."""
    try:
        loaded = load_backend(name, precision, model_dir, program, signature, threads, device)
        warm_up(loaded, signature, max_rows)
        verdict = gate(loaded, precision, signature, reference, min_cosine)
    except BackendUnavailable as error:
        return None, None, str(error)
    except Exception as error:  # an artifact that fails on this machine falls back, it does not stop the worker
        return None, None, f"failed to load or run here: {type(error).__name__}: {first_line(error)}"
    if verdict.refused:
        return None, None, verdict.refused
    return loaded, verdict, ""


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""
