"""Build a text model's compiled backends into its staged folder, gate each against eager fp32, rank the survivors.

Every text model (minilm, a user's embedding model, classifier, reranker, sparse or multi-vector encoder, of any
architecture) goes through this one build; the model is the worker's own module (handlers/text/model.py), and the
gate is the worker's measure for its kind (handlers/text/kinds: row cosine for embeddings, probabilities for
classifiers, token cosine for multi-vector models). A backend that cannot export or compile the architecture's graph
is refused with its reason in one line, and the archive serves eager.

For every backend x precision this machine can serve (fp32 always; bf16 where the CPU has native bf16, i.e.
AVX512-BF16 or AMX; fp16 where CUDA is present) it builds the artifact into MODEL_DIR/backends/:

    aot-<precision>.pt2         AOTInductor package of the model (handlers/text/model.py), dynamic batch and
                                length; compiled for this machine's CPU vector ISA (or its CUDA device for fp16)
    openvino/model.xml, .bin    OpenVINO IR of the fp32 encoder, dynamic dims; bf16 is OpenVINO's inference precision
                                hint at load, so one IR serves both precisions

Each candidate is loaded the way a worker loads it (handlers.text.backends.load_backend) and compared with eager
fp32 on the reference sentences at several shapes (rows x tokens: one row, many rows, the 256-token window). Below
--min-cosine it is not packed: its files are deleted, the reason is printed and recorded under "refused". The
survivors are then ranked by a bounded benchmark (--rank-seconds, default 30 s, warm-up included; at least 3 rounds)
at the served thread count (--threads, 1 per worker): single rows padded to the handler's length buckets, weighted
by how often the README payload mix (scripts/ops/payloads.py) lands in each bucket, round-robin with eager at each
precision as the yardstick. Per length bucket where eager at the candidate's precision is over 10 % faster, the
candidate's "eager_buckets" send that length to eager in the worker (a compiled graph can win on short rows and lose
on the 256-token ones, which set p99), and its ms/text counts that routing. A candidate slower than eager at its own
precision is refused too (--keep-slower packs it). backends/manifest.json lists the rest best first; `backend: auto`
serves the first one a worker's machine can run and that passes the gate again there (docs/performance.md,
"Compiled backends").

Default backends (--backends not given), from the measurements in docs/performance.md: on a CPU with native bf16,
openvino only (at 1 thread its bf16 ran 1.1-1.5x AOT bf16 and 1.5-3.0x eager bf16 on the AMX-BF16 Xeon; AOT would
add ~30-75 s of compilation per precision to a fresh clone's first `make serve` for a candidate `auto` never picks);
on a CPU without, where fp32 serves, openvino and aot (AOT fp32 beat OpenVINO f32 at batch 16); on CUDA, aot (fp16
and fp32). `--backends all` builds both everywhere.

A rebuild with the same inputs (weights, encoder and loader code, this script, torch/openvino versions, CPU flags,
options) keeps the existing backends and only says so.

    python -m scripts.build_backends --model-dir build/minilm
    python -m scripts.build_backends --model-dir build/minilm --backends all --precisions fp32
Exit codes: 0 built or up to date (refused candidates are reported, not errors), 1 the model folder is incomplete,
2 bad arguments.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.ops import machine

REPO = Path(__file__).resolve().parent.parent
BACKENDS_DIR = "backends"
MANIFEST = "manifest.json"
FORMAT = 1
ALL_BACKENDS = ("openvino", "aot")
# Gate shapes (rows, tokens): one row short and at the full window, a few rows, all reference sentences, many rows.
GATE_SHAPES = ((1, 16), (1, 256), (4, 32), (36, 128), (64, 64), (8, 256))
# The handler's default length buckets (models/minilm/model-config.yaml): the shapes a worker serves.
RANK_BUCKETS = (16, 32, 64, 128, 256)
EAGER_ROUTE_MARGIN = 0.1  # eager takes a length bucket from a candidate only when >10 % faster there (noise)
RANK_SAMPLE_TEXTS = 2000  # texts of the README mix tokenized to weigh the buckets
# Files whose change must rebuild and re-rank the backends (besides the weights and versions).
CODE_INPUTS = (
    "scripts/build_backends.py",
    "handlers/text",  # the module, its kinds, the gate's measures and the backends' loader
    "handlers/core/openvino_ir.py",  # the OpenVINO IR's loader, shared with the networks
    "scripts/ops/payloads.py",  # the ranking's payload mix
)
# An image model's besides (the loader of its backends is the text side's): its module, its kinds' gate measures,
# the preprocessing and the generated reference images.
IMAGE_CODE_INPUTS = (*CODE_INPUTS, "handlers/image")
# CPU flags that decide which vector code a compiled artifact may contain (recorded; the load side compares).
ISA_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4")

Encoder = Callable[[Any, Any], Any]


class BuildError(Exception):
    """The model folder cannot be built from (files missing); the message says what."""


def log(message: str) -> None:
    print(f"build_backends: {message}", flush=True)


def default_backends(device: str) -> list[str]:
    """What is worth building here, from the measurements in docs/performance.md ("Compiled backends").

    CPU with native bf16: openvino only (at 1 thread its bf16 was 1.1-1.5x AOT bf16 and 1.5-3.0x eager bf16 on the
    AMX-BF16 Xeon; fp32 candidates serve only if bf16 fails). CPU without: fp32 serves, and AOT fp32 beat OpenVINO
    f32 at batch 16, so both. CUDA: AOT (OpenVINO here targets CPUs)."""
    from handlers.core import runtime

    if device == "cuda":
        return ["aot"]
    return ["openvino"] if runtime.cpu_has_native_bf16() else ["openvino", "aot"]


def machine_precisions(device: str) -> list[str]:
    """Precisions this build machine can serve natively: fp32; bf16 with AVX512-BF16/AMX; fp16 on CUDA."""
    from handlers.core import runtime

    if device == "cuda":
        return ["fp32", "fp16"]
    return ["fp32", "bf16"] if runtime.cpu_has_native_bf16() else ["fp32"]


def isa_flags() -> list[str]:
    return sorted(flag for flag in machine.cpu_flags() if flag.startswith(ISA_FLAG_PREFIXES))


def versions() -> dict[str, str]:
    import torch

    found = {"torch": str(torch.__version__)}
    try:
        import openvino

        found["openvino"] = openvino.get_version()
    except ImportError:
        found["openvino"] = "not installed"
    return found


def build_key(
    model_dir: Path,
    backends: list[str],
    precisions: list[str],
    device: str,
    options: dict,
    code_inputs: tuple[str, ...] = CODE_INPUTS,
) -> str:
    """Hash of everything an artifact depends on: same key, same artifacts (the incremental rebuild skips)."""
    hasher = hashlib.sha256()
    staged = sorted(
        p for p in model_dir.rglob("*") if p.is_file() and BACKENDS_DIR not in p.relative_to(model_dir).parts
    )
    for path in staged:  # weights, configs, tokenizer, reference sentences
        hasher.update(str(path.relative_to(model_dir)).encode())
        hasher.update(hashlib.sha256(path.read_bytes()).digest())
    for relative in code_inputs:
        path = REPO / relative
        files = sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts) if path.is_dir() else [path]
        for file in files:
            hasher.update(str(file.relative_to(REPO)).encode())
            hasher.update(file.read_bytes() if file.exists() else b"<missing>")
    described = {
        "backends": backends,
        "precisions": precisions,
        "device": device,
        "flags": isa_flags(),
        "versions": versions(),
        "options": options,
    }
    hasher.update(json.dumps(described, sort_keys=True).encode())
    return hasher.hexdigest()


def padded_batch(files: Any, rows: list[Any], tokens: int) -> tuple[Any, ...]:
    """The model's inputs for rows (texts or pairs) cut to and padded to ``tokens``, as the handler pads."""
    from handlers.text.batch import Encoded, model_inputs
    from handlers.text.rows import DEFAULT_OPTIONS

    encodings = [
        Encoded(list(e.ids[:tokens]), list(e.type_ids[:tokens])) for e in files.tokenizer.encode_batch(list(rows))
    ]
    return model_inputs(files.info, encodings, [DEFAULT_OPTIONS] * len(rows), tokens)


def gate_shapes(max_tokens: int) -> list[tuple[int, int]]:
    """GATE_SHAPES with the token counts capped at the model's limit (a 64-token model is gated at 64)."""
    return sorted({(rows, min(tokens, max_tokens)) for rows, tokens in GATE_SHAPES})


def gate_inputs(files: Any, rows: list[Any], shapes: Any = None) -> list[tuple[Any, ...]]:
    """The reference rows, cycled to ``rows`` and cut or padded to ``tokens``, for each gate shape."""
    batches = []
    for count, tokens in shapes or gate_shapes(files.info.max_tokens):
        chosen = [rows[index % len(rows)] for index in range(count)]
        batches.append(padded_batch(files, chosen, tokens))
    return batches


def gate_min_cosine(candidate: Encoder, reference: Reference) -> float:
    """The worker's gate measure (the kind's, handlers/text/kinds) between the candidate and eager fp32 over every
    gate shape."""
    import torch

    worst = 1.0
    with torch.inference_mode():
        for expected, inputs in zip(reference.outputs, reference.inputs, strict=True):
            got = candidate(*(tensor.to(reference.device) for tensor in inputs))
            if tuple(got.shape) != tuple(expected.shape):
                raise ValueError(
                    f"output shape {tuple(got.shape)} for input {tuple(inputs[0].shape)}, expected "
                    f"{tuple(expected.shape)}"
                )
            worst = min(worst, reference.similarity(expected, got.cpu(), inputs))
    return worst


# --- building ------------------------------------------------------------------------------------------------------


def example_inputs(reference: Reference) -> tuple[Any, ...]:
    """Export example: text 4 rows x 16 tokens, images 4 of the served shape (every dynamic dim >= 2, or export would
    specialise a dimension of size 1)."""
    return tuple(tensor.to(reference.device) for tensor in reference.example)


def forward_shapes(model: Any, shapes: list[dict]) -> tuple:
    """``shapes`` (one per positional input) arranged as torch.export matches them to ``model.forward``'s parameters:
    those a *args parameter takes form one tuple in its place (none at all when it takes nothing: torch binds the
    arguments as inspect does, and an empty *args is left out)."""
    import inspect

    parameters = list(inspect.signature(model.forward).parameters.values())
    for position, parameter in enumerate(parameters):
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL and position < len(shapes):
            return (*shapes[:position], tuple(shapes[position:]))
    return tuple(shapes)


def build_aot(
    model_dir: Path,
    fp32_model: Any,
    example: tuple,
    precision: str,
    device: str,
    max_batch: int,
    max_tokens: int,
    input_dims: list[list[int | None]] | None = None,
) -> dict:
    """AOTInductor package of the model in ``precision``, dynamic batch (1..max_batch) and length (2..max_tokens,
    the model's own limit). ``input_dims``: per input its dims, None where dynamic (an image model: the batch, and
    height and width only where its processor serves several shapes); default the text model's."""
    import torch

    from handlers.core import runtime

    model = runtime.convert_model(fp32_model, precision)
    if model is fp32_model and device != "cpu":
        model = copy.deepcopy(model)  # the caller's fp32 encoder stays on the CPU (the gate's reference)
    model = model.to(device)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    with torch.inference_mode():
        # Every input is [rows, tokens] but a prompt-length column, [rows]. dynamic_shapes follows the forward's own
        # signature: a TextModule (handlers/text/model.py) takes its inputs after the first two as *extra (one nested
        # tuple); a plain encoder names each.
        if input_dims is None:
            tokens = torch.export.Dim("tokens", min=2, max=max_tokens)
            shapes = [{0: batch, 1: tokens} if tensor.dim() == 2 else {0: batch} for tensor in example]
        else:
            sides = {2: torch.export.Dim("height", min=2, max=8192), 3: torch.export.Dim("width", min=2, max=8192)}
            shapes = [
                {axis: batch if axis == 0 else sides[axis] for axis, size in enumerate(dims) if size is None}
                for dims in input_dims
            ]
        exported = torch.export.export(model, example, dynamic_shapes=forward_shapes(model, shapes))
    relative = f"{BACKENDS_DIR}/aot-{precision}.pt2"
    package = model_dir / relative
    package.unlink(missing_ok=True)
    # Inductor writes the thread count in force now into the package's kernels: the caller set the served one.
    torch._inductor.aoti_compile_and_package(exported, package_path=str(package))
    limits = {"max_batch": max_batch} if input_dims is not None else {"max_batch": max_batch, "max_tokens": max_tokens}
    return {"files": [relative], **limits}


def build_openvino(
    model_dir: Path,
    fp32_model: Any,
    example: tuple,
    precision: str,
    device: str,
    max_batch: int,
    max_tokens: int,
    input_dims: list[list[int | None]] | None = None,
) -> dict:
    """OpenVINO IR of the fp32 encoder with dynamic [batch, tokens] inputs (``input_dims``: per input its dims, None
    where dynamic; an image model's pixels are float32 [batch, 3, height, width]). Precision is chosen at load
    (INFERENCE_PRECISION_HINT). Weights are stored as fp16 (OpenVINO's default, half the archive's bytes) and widened
    at load: the gate measures what that costs (min cosine 0.999999 to eager fp32 on the AMX-BF16 Xeon)."""
    import openvino
    import torch

    if device != "cpu":
        raise ValueError("built for CPU only (this build targets CUDA)")
    folder = model_dir / BACKENDS_DIR / "openvino"
    relative = [f"{BACKENDS_DIR}/openvino/model.xml", f"{BACKENDS_DIR}/openvino/model.bin"]
    if all((model_dir / name).exists() for name in relative) and (folder / ".built").exists():
        return {"files": relative}  # one IR for every precision: built once per run
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    dims = input_dims or [[None] * tensor.dim() for tensor in example]
    dynamic = [
        (
            openvino.PartialShape([-1 if size is None else size for size in sizes]),
            openvino.Type.f32 if tensor.is_floating_point() else openvino.Type.i64,
        )
        for sizes, tensor in zip(dims, example, strict=True)
    ]
    # convert_model traces the module; transformers' mask code warns that two Python conditions become constants. Both
    # are constant for an encoder with a mask (no KV cache, never causal), and the gate checks every shape family.
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=".*trace_method.*", category=DeprecationWarning)
        converted = openvino.convert_model(fp32_model, example_input=example, input=dynamic)
    openvino.save_model(converted, str(folder / "model.xml"), compress_to_fp16=True)
    (folder / ".built").write_text("")
    return {"files": relative}


BUILDERS = {"aot": build_aot, "openvino": build_openvino}


def load_candidate(name: str, precision: str, model_dir: Path, fp32_model: Any, threads: int, device: str) -> Encoder:
    """Load a built candidate exactly as a worker does (the load side's handlers.text.backends.load_backend)."""
    import torch

    from handlers.text.backends import load_backend

    return load_backend(name, precision, model_dir, fp32_model, threads, torch.device(device))


# --- ranking -------------------------------------------------------------------------------------------------------


def rank_buckets(max_tokens: int) -> tuple[int, ...]:
    """The length buckets a worker pads to by default (handler length_buckets: auto; minilm's 16..256 are these)."""
    from handlers.text.buckets import auto_buckets

    return tuple(auto_buckets(max_tokens))


def bucket_shares(tokenizer: Any, buckets: tuple[int, ...] = RANK_BUCKETS, count=RANK_SAMPLE_TEXTS) -> dict[int, float]:
    """Share of the README payload mix's texts that the handler pads to each length bucket."""
    from handlers.text.buckets import bucket_length
    from scripts.ops.payloads import ReadmeTextMix

    mix = ReadmeTextMix(seed=0)
    texts = [mix.next_text() for _ in range(count)]
    counts = dict.fromkeys(buckets, 0)
    for encoding in tokenizer.encode_batch(texts):
        counts[bucket_length(len(encoding.ids), buckets)] += 1
    return {bucket: counts[bucket] / len(texts) for bucket in buckets}


def rank(
    runners: dict[tuple[str, str], Encoder], bucket_inputs: dict[int, tuple[Any, ...]], seconds: float, device: str
) -> tuple[dict[tuple[str, str], dict[int, float]], dict]:
    """ms per item of each runner at each ranking bucket, one item per call (the served mean batch is ~1).

    Round-robin over the runners, one call per bucket each round, until ``seconds`` are spent (at least 3 rounds),
    so machine noise hits every runner alike; a runner's time per bucket is the median of its calls."""
    import torch

    inputs = {bucket: tuple(tensor.to(device) for tensor in tensors) for bucket, tensors in bucket_inputs.items()}
    samples: dict[tuple[tuple[str, str], int], list[float]] = {}
    started = time.perf_counter()  # the budget covers the warm-up too
    rounds = 0
    with torch.inference_mode():
        for runner in runners.values():  # warm-up: first calls allocate and pick kernels
            for tensors in inputs.values():
                runner(*tensors)
        while rounds < 3 or time.perf_counter() - started < seconds:
            for key, runner in runners.items():
                for bucket, tensors in inputs.items():
                    begun = time.perf_counter()
                    runner(*tensors)
                    samples.setdefault((key, bucket), []).append(time.perf_counter() - begun)
            rounds += 1
    ms_per_bucket = {
        key: {bucket: round(1000 * statistics.median(samples[(key, bucket)]), 3) for bucket in inputs}
        for key in runners
    }
    info = {"seconds": round(time.perf_counter() - started, 1), "rounds": rounds}
    return ms_per_bucket, info


def weighted_ms(ms_per_bucket: dict[int, float], shares: dict[str, float]) -> float:
    """ms per text of the README mix from per-bucket times and the mix's bucket shares."""
    return round(sum(shares[str(bucket)] * ms for bucket, ms in ms_per_bucket.items()), 3)


def route_to_eager(candidate_ms: dict[int, float], eager_ms: dict[int, float]) -> dict[int, float]:
    """Per bucket, the time when each length runs on whichever is faster: the candidate, or eager at its precision
    where eager beats it by more than EAGER_ROUTE_MARGIN (a compiled graph can lose on long rows: on the AMX Xeon
    OpenVINO bf16 was 5x eager bf16 at 16 tokens but 0.6x at 256). Returns {bucket: ms} with eager's time where
    eager serves; the buckets that go to eager are those whose time differs from the candidate's."""
    return {
        bucket: eager_ms[bucket] if eager_ms[bucket] < candidate_ms[bucket] * (1 - EAGER_ROUTE_MARGIN) else ms
        for bucket, ms in candidate_ms.items()
    }


# --- the whole build -----------------------------------------------------------------------------------------------


def read_manifest(model_dir: Path) -> dict | None:
    path = model_dir / BACKENDS_DIR / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def up_to_date(model_dir: Path, key: str) -> bool:
    manifest = read_manifest(model_dir)
    if not manifest or manifest.get("build_key") != key:
        return False
    files = [name for candidate in manifest["candidates"] for name in candidate["files"]]
    return all((model_dir / name).exists() for name in files)


@dataclass
class Reference:
    """What every candidate is judged against: eager fp32 on the gate inputs, and what the ranking times.

    A text model and an image model differ only in what fills it (:func:`load_text_reference`,
    :func:`load_image_reference`): the inputs (token ids, or pixels), the kind's gate measure, the export example
    and which of its dims are dynamic, the ranking's per-bucket inputs and their shares, and what one item is."""

    model_dir: Path
    fp32_model: Any
    inputs: list[tuple[Any, ...]]  # the gate's batches
    outputs: list[Any]  # eager fp32 on each
    similarity: Callable[[Any, Any, tuple[Any, ...]], float]  # the kind's measure (expected, got, the batch)
    gate_measure: str
    gate_shapes: list[list[int]]  # what the manifest records of the gate's batches
    example: tuple[Any, ...]  # the export example (every dynamic dim >= 2)
    rank_inputs: dict[int, tuple[Any, ...]]  # per ranking bucket, one item's forward pass
    bucket_shares: dict[int, float]  # how often the served mix lands in each bucket
    payload_mix: str  # what the ranking stands for, in the manifest
    device: str
    threads: int
    max_batch: int
    min_cosine: float
    unit: str = "text"  # what one item is: ranked as ms_per_<unit>
    max_tokens: int = 0  # a text model's token limit (AOT's length bound); 0 for images
    builder_options: dict[str, Any] = field(default_factory=dict)  # an image model's input_dims
    # A family whose candidates are built, loaded, gated and run as eager its own way (a network, load_network_
    # reference) sets these; None: the text and image models' way (BUILDERS, load_candidate, cosine_gate,
    # runtime.convert_model).
    builders: dict[str, Callable[..., dict]] | None = None
    load: Callable[[str, str], Encoder] | None = None
    gate: Callable[[Encoder, str], Verdict] | None = None
    eager: Callable[[str], Encoder] | None = None
    route_lengths: bool = True  # the text side's per-length routing to eager (eager_buckets)
    gate_record: dict[str, Any] = field(default_factory=dict)  # the manifest's gate section beyond the bound


@dataclass(frozen=True)
class Verdict:
    """A candidate's gate: what the log prints, the refusal (None: it passes) and what the manifest records."""

    value: float
    refused: str | None
    record: dict[str, Any]


def cosine_gate(runner: Encoder, precision: str, reference: Reference) -> Verdict:
    """The text and image models' gate: the kind's measure against eager fp32, at least --min-cosine."""
    worst = gate_min_cosine(runner, reference)
    refused = (
        f"gate: min cosine to eager fp32 {worst:.6f} < {reference.min_cosine}" if worst < reference.min_cosine else None
    )
    return Verdict(worst, refused, {"gate_min_cosine": round(worst, 6)})


def load_text_reference(model_dir: Path, device: str, threads: int, max_batch: int, min_cosine: float) -> Reference:
    import dataclasses

    import torch

    from handlers.text.kinds import kind_named
    from handlers.text.model import build_module, read_model_files

    files = read_model_files(model_dir)
    kind = kind_named(files.info.kind)
    files = dataclasses.replace(files, info=kind.resolve(files.info, files.tokenizer))
    fp32_model = build_module(model_dir, files.info)
    sentences = json.loads((model_dir / "reference_sentences.json").read_text())
    cases = kind.reference_cases(files.info, sentences)
    rows = [kind.served_row(files.info, files.tokenizer, case)[0] for case in cases]
    inputs = gate_inputs(files, rows)
    with torch.inference_mode():
        outputs = [fp32_model(*tensors) for tensors in inputs]
    buckets = rank_buckets(files.info.max_tokens)
    return Reference(
        model_dir,
        fp32_model,
        inputs,
        outputs,
        similarity=lambda expected, got, batch: kind.similarity(files.info, expected, got, batch[1]),
        gate_measure=kind.gate_measure,
        gate_shapes=[list(shape) for shape in gate_shapes(files.info.max_tokens)],
        example=padded_batch(files, rows[:4], min(16, files.info.max_tokens)),
        rank_inputs={bucket: padded_batch(files, [" ".join(sentences)], bucket) for bucket in buckets},
        bucket_shares=bucket_shares(files.tokenizer, buckets),
        payload_mix="README minilm mix (loadtests/payloads.py), one row per call padded to its length bucket",
        device=device,
        threads=threads,
        max_batch=max_batch,
        min_cosine=min_cosine,
        max_tokens=files.info.max_tokens,
    )


# An image model's gate batches beyond the reference images' own groups: the first shape at one image and at many
# (a compiled graph's dynamic batch dim is checked at both ends of what a worker sends).
IMAGE_GATE_ROWS = (1, 16)


def load_image_reference(model_dir: Path, device: str, threads: int, max_batch: int, min_cosine: float) -> Reference:
    """The image engine's own view of the folder: the kind's module (a classifier's logits, or the image-text kind's
    vision tower with its projection), the generated reference images preprocessed as served and grouped by shape,
    and the kind's gate measure. Ranked at one image per call at the served shape (a worker's mean batch is ~1)."""
    import torch

    from handlers.image.kinds import inspect_folder, kind_named
    from handlers.image.preprocess import group_by_shape
    from handlers.image.reference import reference_images

    info = inspect_folder(model_dir)
    kind = kind_named(info.kind)
    assert info.preprocessing is not None  # inspect_folder of a staged folder reads the recorded steps
    preprocessing = info.preprocessing
    fp32_model = kind.build_module(model_dir, info)
    pixels = [preprocessing.pixels(image) for image in reference_images()]
    groups = [preprocessing.tensor([pixels[i] for i in group]) for group in group_by_shape(pixels)]
    first = groups[0]
    inputs = [(group,) for group in groups]
    inputs += [(first[[i % len(first) for i in range(rows)]],) for rows in IMAGE_GATE_ROWS]
    with torch.inference_mode():
        outputs = [fp32_model(*tensors) for tensors in inputs]
    # One served shape (a processor that crops or resizes to height x width): only the batch is dynamic; several
    # (shortest-edge resize, no crop): height and width too, and the gate's groups cover them.
    fixed = len(groups) == 1
    input_dims: list[list[int | None]] = [[None, 3, *first.shape[2:]] if fixed else [None, 3, None, None]]
    return Reference(
        model_dir,
        fp32_model,
        inputs,
        outputs,
        similarity=lambda expected, got, _batch: kind.similarity(info, expected, got),
        gate_measure=kind.gate_measure,
        gate_shapes=[list(tensors[0].shape) for tensors in inputs],
        example=(first[[i % len(first) for i in range(4)]],),
        rank_inputs={0: (first[:1],)},
        bucket_shares={0: 1.0},
        payload_mix="one image per call at the served shape (the reference images' first)",
        device=device,
        threads=threads,
        max_batch=max_batch,
        min_cosine=min_cosine,
        unit="image",
        builder_options={"input_dims": input_dims},
    )


# --- networks (a team's own torch.export program, handlers/network) -----------------------------------------------
NETWORK_KIND = "network"
# Every backend, by default: a network's graph is the team's own, so which one wins is not known in advance.
NETWORK_BACKENDS = ("aot", "openvino", "jit")
NETWORK_CODE_INPUTS = (
    "scripts/build_backends.py",
    "handlers/network",
    "handlers/core/aot.py",
    "handlers/core/openvino_ir.py",
)
NETWORK_RANK_ROWS = (1, 8, 64)  # the ranking's batch sizes (capped by the rows a pass may hold)


class NetworkRunner:
    """A loaded network backend called as the ranking calls every runner, one tensor per input in the signature's
    order; the network's gate calls ``program`` itself."""

    def __init__(self, program: Any, signature: Any) -> None:
        self.program = program
        self.signature = signature

    def __call__(self, *tensors: Any) -> Any:
        return self.signature.call(self.program, tensors)


def network_dynamic_shapes(model: Any, signature: Any) -> tuple:
    """torch.export dynamic_shapes for ``model`` taking the signature's inputs positionally: one Dim per symbol,
    within the range the program was exported for."""
    import torch

    dims: dict[str, Any] = {}
    for spec in signature.inputs:
        for dim in spec.dims:
            if dim.size is None and dim.symbol not in dims:
                dims[dim.symbol] = torch.export.Dim(dim.symbol, min=max(dim.low, 1), max=dim.high)
    shapes = [{axis: dims[d.symbol] for axis, d in enumerate(spec.dims) if d.size is None} for spec in signature.inputs]
    return forward_shapes(model, shapes)


def build_network_aot(
    model_dir: Path, fp32_model: Any, example: tuple, precision: str, device: str, *_: Any, program: Any, signature: Any
) -> dict:
    """AOTInductor package: the ExportedProgram itself at fp32 on the CPU; otherwise the program at ``precision``
    (handlers/network/backends.AtPrecision: float inputs cast in, float outputs back to fp32) exported again with
    the program's own dynamic dims."""
    import torch

    from handlers.network import backends as network

    exported = program
    if precision != "fp32" or device != "cpu":
        module = network.at_precision(fp32_model, precision).to(device)
        with torch.inference_mode():
            inputs = tuple(tensor.to(device) for tensor in example)
            exported = torch.export.export(module, inputs, dynamic_shapes=network_dynamic_shapes(module, signature))
    relative = network.aot_package(precision)
    package = model_dir / relative
    package.unlink(missing_ok=True)
    # Inductor writes the thread count in force now into the package's kernels: the caller set the served one.
    torch._inductor.aoti_compile_and_package(exported, package_path=str(package))
    return {"files": [relative]}


def build_network_openvino(
    model_dir: Path, fp32_model: Any, example: tuple, precision: str, device: str, *_: Any, program: Any, signature: Any
) -> dict:
    """OpenVINO IR converted from the ExportedProgram (its dynamic dims kept; integer inputs stay integer), weights
    kept in fp32 (an fp32 candidate must equal eager within 1e-5; fp16-stored weights would not); built once per run,
    the precision is chosen at load."""
    import openvino

    from handlers.network import backends as network

    if device != "cpu":
        raise ValueError("built for CPU only (this build targets CUDA)")
    xml = model_dir / network.OPENVINO_IR
    folder = xml.parent
    files = [network.OPENVINO_IR, network.OPENVINO_IR.replace(".xml", ".bin")]
    if (folder / ".built").exists():
        return {"files": files}
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    openvino.save_model(openvino.convert_model(program), str(xml), compress_to_fp16=False)
    (folder / ".built").write_text("")
    return {"files": files}


def build_network_jit(*_: Any, **__: Any) -> dict:
    """torch.compile has no artifact: the worker compiles at load; the build gates and ranks it all the same."""
    return {"files": []}


NETWORK_BUILDERS = {"aot": build_network_aot, "openvino": build_network_openvino, "jit": build_network_jit}


def network_rank_inputs(signature: Any, most: int) -> dict[int, tuple[Any, ...]]:
    import torch

    from handlers.network.backends import generated_batch

    generator = torch.Generator().manual_seed(1)
    rows = sorted({min(max(count, signature.rows.low, 1), most) for count in NETWORK_RANK_ROWS})
    return {count: generated_batch(signature, count, "mid", generator) for count in rows}


def load_network_reference(model_dir: Path, device: str, threads: int, max_batch: int, min_cosine: float) -> Reference:
    """A network's staged folder (scripts/prepare_network_model.py): its exported program (model.pt2) and its
    signature file if any, read as a worker reads them (handlers/network/program.py). The gate is the network's own
    (handlers/network/backends.gate: per output, cosine and relative error for floats, exact for integers, against
    eager fp32 or fp64). Ranked by ms per row: each ranking batch size
    is weighted 1 / (sizes x rows) per call, so the weighted sum is the mean over the sizes of the time per row."""
    import torch

    from handlers.network import backends as network
    from handlers.network.program import load_program

    loaded = load_program(model_dir)
    program, signature = loaded.program, loaded.signature
    module = program.module().to(device)
    most = min(
        max_batch,
        signature.rows.high or max_batch,
        signature.limits.max_rows_per_pass or max_batch,
        max(NETWORK_RANK_ROWS),
    )
    batches = network.gate_batches(signature, most)
    reference = network.reference_for(module, signature, batches)
    where = torch.device(device)

    def load(backend: str, precision: str) -> NetworkRunner:
        loaded = network.load_backend(backend, precision, model_dir, program, signature, threads, where)
        network.warm_up(loaded, signature, most)  # torch.compile compiles here, not in the ranking's rounds
        return NetworkRunner(loaded, signature)

    def gate(runner: Any, precision: str) -> Verdict:
        verdict = network.gate(runner.program, precision, signature, reference, min_cosine)
        return Verdict(verdict.min_cosine, verdict.refused, verdict.record())

    rank_inputs = network_rank_inputs(signature, most)
    example = network.generated_batch(signature, max(4, signature.rows.low), "mid", torch.Generator().manual_seed(2))
    return Reference(
        model_dir,
        module,
        batches,
        reference.outputs,
        similarity=lambda expected, got, batch: 1.0,  # unused: the network's gate measures every output itself
        gate_measure="per output: cosine and max relative error for floats, exact for integers and bools",
        gate_shapes=[[list(tensor.shape) for tensor in batch] for batch in batches],
        example=example,
        rank_inputs=rank_inputs,
        bucket_shares={count: 1 / (len(rank_inputs) * count) for count in rank_inputs},
        payload_mix=f"generated batches of {', '.join(map(str, rank_inputs))} rows, mean ms per row over them",
        device=device,
        threads=threads,
        max_batch=most,
        min_cosine=min_cosine,
        unit="row",
        builder_options={"program": program, "signature": signature},
        builders=NETWORK_BUILDERS,
        load=load,
        gate=gate,
        eager=lambda precision: load("eager", precision),
        route_lengths=False,
        gate_record={
            "reference": reference.name,
            "fp32_bounds": {"min_cosine": network.FP32_MIN_COSINE, "max_relative": network.FP32_MAX_RELATIVE},
            "integer_outputs": "exactly equal",
            **reference.record,
        },
    )


def build_candidate(reference: Reference, backend: str, precision: str) -> tuple[dict, Encoder | None]:
    """Build, load and gate one candidate: (its manifest entry, its runner), or (a refusal with its reason, None)."""
    import torch

    from handlers.core import runtime

    entry: dict[str, Any] = {"backend": backend, "precision": precision, "device": reference.device}
    where = f"{backend}/{precision}"
    cannot = runtime.machine_can_run(precision, torch.device(reference.device))
    if cannot:
        log(f"{where}: refused: {cannot}")
        return {**entry, "reason": cannot}, None
    model_dir = reference.model_dir
    started = time.perf_counter()
    try:
        example = example_inputs(reference)
        built = (reference.builders or BUILDERS)[backend](
            model_dir,
            reference.fp32_model,
            example,
            precision,
            reference.device,
            reference.max_batch,
            reference.max_tokens,
            **reference.builder_options,
        )
        built_seconds = time.perf_counter() - started
        if reference.load is None:
            runner = load_candidate(
                backend, precision, model_dir, reference.fp32_model, reference.threads, reference.device
            )
        else:
            runner = reference.load(backend, precision)
        verdict = (
            cosine_gate(runner, precision, reference) if reference.gate is None else reference.gate(runner, precision)
        )
    except Exception as error:  # a backend that cannot be built or loaded here is refused, not fatal
        reason = f"build or load failed: {type(error).__name__}: {(str(error).strip() or '?').splitlines()[0][:300]}"
        log(f"{where}: refused: {reason}")
        return {**entry, "reason": reason}, None
    if verdict.refused:
        log(f"{where}: refused: {verdict.refused}")
        return {**entry, "reason": verdict.refused, **verdict.record}, None
    size = sum((model_dir / name).stat().st_size for name in built["files"])
    log(f"{where}: built in {built_seconds:.0f}s, {size / 1e6:.0f} MB, gate min cosine {verdict.value:.6f}")
    entry.update(
        built,
        **verdict.record,
        build_seconds=round(built_seconds, 1),
        megabytes=round(size / 1e6, 1),
    )
    return entry, runner


def eager_runners(reference: Reference, precisions: list[str]) -> dict[tuple[str, str], Encoder]:
    """Eager at each precision served here: the yardstick of the ranking (the load side's last resort)."""
    import torch

    from handlers.core import runtime

    runners: dict[tuple[str, str], Encoder] = {}
    for precision in precisions:
        if runtime.machine_can_run(precision, torch.device(reference.device)):
            continue
        if reference.eager is not None:
            runners[("eager", precision)] = reference.eager(precision)
        else:
            runners[("eager", precision)] = runtime.convert_model(reference.fp32_model, precision).to(reference.device)
    return runners


def staged_kind(model_dir: Path) -> tuple[str, float, Callable[..., Reference]]:
    """(the staged folder's kind, its gate bound, how its reference loads): an image model's folder (its
    image_model.json, scripts/prepare_image_model.py) or a text model's (text_model.json and the reference
    sentences, scripts/prepare_text_model.py); BuildError for a folder not staged."""
    from handlers.image.folder import SERVED_FILE as IMAGE_SERVED_FILE
    from handlers.network.backends import PROGRAM_FILE, REDUCED_MIN_COSINE
    from handlers.text.folder import SERVED_FILE, FolderError

    if (model_dir / PROGRAM_FILE).is_file():
        return NETWORK_KIND, REDUCED_MIN_COSINE, load_network_reference
    if (model_dir / IMAGE_SERVED_FILE).is_file():
        from handlers.image.kinds import inspect_folder as inspect_image_folder
        from handlers.image.kinds import kind_named as image_kind_named

        try:
            kind = inspect_image_folder(model_dir).kind
        except FolderError as error:
            raise BuildError(f"{model_dir}: {error} (stage it first: python -m scripts.prepare_image_model)") from None
        return kind, image_kind_named(kind).default_min_cosine, load_image_reference

    from handlers.text.kinds import inspect_folder, kind_named

    staged = [name for name in (SERVED_FILE, "reference_sentences.json") if not (model_dir / name).is_file()]
    if staged:
        raise BuildError(
            f"{model_dir} lacks {' and '.join(staged)}: stage the model first with python -m scripts.prepare_text_model"
        )
    try:
        kind = inspect_folder(model_dir).kind
    except FolderError as error:
        raise BuildError(
            f"{model_dir}: {error} (stage the model first: python -m scripts.prepare_text_model)"
        ) from None
    return kind, kind_named(kind).default_min_cosine, load_text_reference


def build(
    model_dir: Path,
    backends: list[str] | None = None,
    precisions: list[str] | None = None,
    min_cosine: float | None = None,
    rank_seconds: float = 30.0,
    threads: int = 1,
    max_batch: int = 1024,
    device: str | None = None,
    force: bool = False,
    beat_eager: bool = True,
) -> dict:
    """Build, gate and rank the backends of ``model_dir``; returns the manifest (also written to backends/)."""
    import torch

    model_dir = Path(model_dir)
    kind, default_min_cosine, load_reference = staged_kind(model_dir)
    min_cosine = min_cosine or default_min_cosine
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if backends is None:
        backends = list(NETWORK_BACKENDS) if kind == NETWORK_KIND else default_backends(device)
    backends = list(backends)
    precisions = list(precisions or machine_precisions(device))
    options = {
        "min_cosine": min_cosine,
        "threads": threads,
        "max_batch": max_batch,
        "beat_eager": beat_eager,
        "kind": kind,
    }
    code = {load_image_reference: IMAGE_CODE_INPUTS, load_network_reference: NETWORK_CODE_INPUTS}.get(
        load_reference, CODE_INPUTS
    )
    key = build_key(model_dir, backends, precisions, device, options, code)
    if not force and up_to_date(model_dir, key):
        log(f"{model_dir / BACKENDS_DIR} up to date (same weights, code, versions, CPU flags and options)")
        return {**(read_manifest(model_dir) or {}), "rebuilt": False}

    out = model_dir / BACKENDS_DIR
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    manifest: dict[str, Any] = {"format": FORMAT, "build_key": key, "built_on": built_on(device)}
    if not backends:  # asked for none: an empty manifest says so, and workers serve eager
        manifest.update(candidates=[], refused=[], not_built="no backends asked (--backends none)")
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        return {**manifest, "rebuilt": True}

    reference = load_reference(model_dir, device, threads, max_batch, min_cosine)
    unit = f"ms_per_{reference.unit}"
    # The served thread count from here on: AOTInductor bakes it into its kernels, and the ranking runs at it.
    torch.set_num_threads(threads)
    candidates, refused, runners = [], [], {}
    for backend in backends:
        for precision in precisions:
            entry, runner = build_candidate(reference, backend, precision)
            if runner is None:
                refused.append(entry)
            else:
                candidates.append(entry)
                runners[(backend, precision)] = runner

    runners |= eager_runners(reference, precisions)
    ms_per_bucket, rank_info = rank(runners, reference.rank_inputs, rank_seconds, device)
    shares = {str(bucket): round(share, 4) for bucket, share in reference.bucket_shares.items()}
    rank_info["bucket_shares"] = shares
    for candidate in candidates:
        own = ms_per_bucket[(candidate["backend"], candidate["precision"])]
        eager = ms_per_bucket.get(("eager", candidate["precision"]))
        routes = eager and reference.route_lengths and candidate["backend"] != "eager"
        routed = route_to_eager(own, eager) if routes else own
        # The worker sends these lengths to eager at the same precision (handlers/text/backends.LengthRouted).
        candidate["eager_buckets"] = [bucket for bucket in routed if routed[bucket] != own[bucket]]
        candidate["ms_per_bucket"] = {str(bucket): ms for bucket, ms in own.items()}
        candidate[unit] = weighted_ms(routed, shares)
    eager_ms = {
        precision: weighted_ms(ms, shares) for (backend, precision), ms in ms_per_bucket.items() if backend == "eager"
    }
    candidates, slower = order_candidates(candidates, eager_ms if beat_eager else {}, reference.unit)
    for entry in slower:
        log(f"{entry['backend']}/{entry['precision']}: refused: {entry['reason']}")
    remove_unpacked_files(model_dir, candidates)

    manifest.update(
        gate={
            "min_cosine_bound": min_cosine,
            "measure": reference.gate_measure,
            "reference": "eager fp32",
            "shapes": reference.gate_shapes,
            **reference.gate_record,
        },
        ranking_benchmark={
            "payload_mix": reference.payload_mix,
            "threads": threads,
            **rank_info,
            f"eager_{unit}": eager_ms,
            "eager_ms_per_bucket": {
                precision: {str(bucket): ms for bucket, ms in ms_per_bucket[("eager", precision)].items()}
                for precision in eager_ms
            },
        },
        candidates=candidates,
        refused=refused + slower,
    )
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log_ranking(manifest, reference.unit)
    return {**manifest, "rebuilt": True}


def log_ranking(manifest: dict, unit: str = "text") -> None:
    for candidate in manifest["candidates"]:
        log(
            f"rank {candidate['rank']}: {candidate['backend']}/{candidate['precision']} "
            f"{candidate[f'ms_per_{unit}']} ms/{unit} (gate {candidate['gate_min_cosine']})"
        )
    for precision, ms in manifest["ranking_benchmark"][f"eager_ms_per_{unit}"].items():
        log(f"yardstick: eager/{precision} {ms} ms/{unit}")


def built_on(device: str) -> dict[str, Any]:
    import torch

    where = {"cpu": machine.cpu_model(), "flags": isa_flags(), "device": device, **versions()}
    if device == "cuda":
        where["cuda_device"] = torch.cuda.get_device_name()
    return where


def order_candidates(
    candidates: list[dict], eager_ms: dict[str, float], unit: str = "text"
) -> tuple[list[dict], list[dict]]:
    """Rank the gated candidates fastest first (rank 1 = best); one slower than eager at its own precision (where
    ``eager_ms`` has it) is refused instead: eager is the load side's last resort anyway, so packing it would only
    make `auto` serve something slower."""
    kept: list[dict] = []
    slower: list[dict] = []
    key = f"ms_per_{unit}"
    for candidate in sorted(candidates, key=lambda candidate: candidate[key]):
        eager = eager_ms.get(candidate["precision"])
        if eager is not None and candidate[key] > eager:
            reason = (
                f"ranking: {candidate[key]} ms/{unit}, slower than eager/{candidate['precision']} ({eager} ms/{unit})"
            )
            # What it measured stays on record (describe shows it); its files are not packed.
            measured = {k: v for k, v in candidate.items() if k not in ("files", "eager_buckets", "ms_per_bucket")}
            slower.append(measured | {"reason": reason})
        else:
            kept.append({**candidate, "rank": len(kept) + 1})
    return kept, slower


def remove_unpacked_files(model_dir: Path, candidates: list[dict]) -> None:
    """Delete every file under backends/ that no surviving candidate lists (refused artifacts are not packed)."""
    kept = {model_dir / name for candidate in candidates for name in candidate["files"]}
    for path in sorted((model_dir / BACKENDS_DIR).rglob("*"), reverse=True):
        if path.is_file() and path not in kept:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def csv_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        values = list(choices) if text == "all" else [value for value in text.split(",") if value]
        unknown = [value for value in values if value not in choices]
        if unknown or not values:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)} (comma-separated) or all")
        return values

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.build_backends",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-dir", type=Path, required=True, help="the staged model folder; backends/ goes in it")
    parser.add_argument(
        "--backends",
        type=csv_list(ALL_BACKENDS),
        help=f"which to build: {', '.join(ALL_BACKENDS)} or all (default: openvino on a CPU with native bf16, "
        "openvino,aot on one without, aot on CUDA)",
    )
    parser.add_argument(
        "--precisions",
        type=csv_list(("fp32", "bf16", "fp16")),
        help="default: what this machine serves natively (fp32; bf16 with AVX512-BF16/AMX; fp16 on CUDA)",
    )
    parser.add_argument(
        "--min-cosine", type=float, help="gate bound to eager fp32 (default: the kind's, 0.999; classifiers 0.99)"
    )
    parser.add_argument(
        "--rank-seconds", type=float, default=30.0, help="ranking benchmark budget, at least 3 rounds (default 30)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads per worker: the ranking runs at it, AOT packages are compiled for it (default 1)",
    )
    parser.add_argument("--max-batch", type=int, default=1024, help="AOT: most rows per forward pass (default 1024)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the inputs did not change")
    parser.add_argument(
        "--keep-slower",
        action="store_true",
        help="pack a candidate that ranked slower than eager at its precision (refused by default)",
    )
    args = parser.parse_args(argv)
    if args.min_cosine is not None and not 0.0 < args.min_cosine <= 1.0:
        parser.error("--min-cosine must be in (0, 1]")
    if args.rank_seconds <= 0 or args.threads < 1 or args.max_batch < 1:
        parser.error("--rank-seconds, --threads and --max-batch must be positive")
    try:
        build(
            args.model_dir,
            args.backends,
            args.precisions,
            args.min_cosine,
            args.rank_seconds,
            args.threads,
            args.max_batch,
            force=args.force,
            beat_eager=not args.keep_slower,
        )
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
