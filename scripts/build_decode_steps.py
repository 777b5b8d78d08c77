"""Build, gate and rank a causal LM's decoding steps when its archive is packaged (the generator's walk-gate-rank).

The text, image and network models' compiled backends go through scripts/build_backends.py; this is the same walk
for a causal LM's decoding step, run by scripts/prepare_generator.py on the staged folder (MODEL_DIR/lm):

  export  the decoder traced once for the paged OpenVINO step (handlers/generation/paged_openvino.py) and saved in
          MODEL_DIR/decode/openvino/ without a second copy of the weights (handlers/generation/decoder_export.py):
          a worker reads it instead of tracing the model at load
  gate    every candidate step decodes the gate prompts greedily (3 together and 1 alone, 12 tokens each), against
          eager fp32: the same tokens, and each chosen token's log probability within 0.1 of fp32's (the worker's
          gate, handlers/generation/precision.py). Candidates: the paged OpenVINO step at fp32, with int8 weights
          (unless handler.decode_weights is full), and at bf16 where this CPU computes bf16 natively; eager torch
          at bf16 there too; eager fp32 is the reference
  rank    the gated candidates' decoding steps, timed round-robin with eager fp32 (--rank-seconds, at least 3
          rounds, at the config's handler.threads): 1 row, and batchSize rows with one long prompt among short
          ones; a candidate's figure is its ms per generated token, the mean of the two sizes. A paged step over
          10 % slower than eager at its own precision (int8 weights: fp32) is refused; one its gate refused is
          timed too (what it would give is on record)

MODEL_DIR/decode/manifest.json records every candidate's gate figures and step times, best first, and every
refusal with its reason. `handler.decode_step: auto` (the default) serves the paged step without what was refused
here (a failed gate or conversion on any machine; "slower" only on a CPU of the same kind), on a CPU of the same
kind fastest first as ranked here, and gates it again at load; int8 weights serve (handler.decode_weights auto)
only where they were ranked here. describe shows the manifest. A rebuild with the same inputs (weights, code,
versions, CPU flags, options) keeps what is there.

    python -m scripts.build_decode_steps --model-dir build/generator --config models/generator/model-config.yaml
Exit codes: 0 built or up to date (refused candidates are recorded, not errors), 1 the folder is unusable, 2 bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.build_backends import build_key, built_on

# The code whose change rebuilds decode/ (the generators' model.yaml lists the same files as their prepare inputs).
CODE_INPUTS = (
    "scripts/build_decode_steps.py",
    "handlers/generation/paged_openvino.py",
    "handlers/generation/decoder_export.py",
    "handlers/generation/gate.py",
    "handlers/generation/precision.py",
    "handlers/generation/running.py",
)
SLOWER_MARGIN = 0.1  # a paged step is refused as slower only when over 10 % slower than eager (noise: a tiny model)
EAGER_PRECISIONS = ("fp32", "bf16")  # int8 is the paged step's alone (its weights)
RANK_LONG_PROMPT = 200  # tokens of the long prompt among short ones in the batchSize-row step (capped by the limits)


class BuildError(Exception):
    """The folder cannot be built from; the message says why."""


def log(message: str) -> None:
    print(f"build_decode_steps: {message}", flush=True)


@dataclass
class Candidate:
    step: str  # openvino | eager
    precision: str
    model: Any = None  # the eager model at this precision
    paged: Any = None  # the paged step (openvino)
    gate: dict[str, Any] | None = None
    refusal: dict[str, Any] | None = None  # why it may not serve (its gate), though it was built and is timed
    samples: dict[int, list[float]] = field(default_factory=dict)  # rows -> step seconds

    @property
    def name(self) -> str:
        return f"{self.step}/{self.precision}"


def handler_config(config_path: Path) -> dict[str, Any]:
    import yaml

    from handlers.core.config import ConfigError, validate
    from handlers.generator import GeneratorHandler

    try:
        config = yaml.safe_load(Path(config_path).read_text()) or {}
        return {"yaml": config, "handler": validate(config.get("handler"), GeneratorHandler.options)}
    except (OSError, yaml.YAMLError, ConfigError) as error:
        raise BuildError(f"{config_path}: {error}") from None


def build(model_dir: Path, config_path: Path, rank_seconds: float = 10.0, force: bool = False) -> dict[str, Any]:
    """Export, gate and rank ``model_dir``'s decoding steps; returns the manifest (also written to decode/)."""
    import torch

    from handlers.core import runtime
    from handlers.generation import decoder_export

    model_dir = Path(model_dir)
    config = handler_config(config_path)
    threads = int(config["handler"]["threads"]) or 1
    rows = int(config["yaml"].get("batchSize") or 1)
    precisions = ["fp32", "bf16"] if runtime.cpu_has_native_bf16() else ["fp32"]
    if config["handler"]["decode_weights"] != "full":
        precisions.append("int8")  # the paged step's int8 weights (eager has none)
    options = {"threads": threads, "rows": rows, "rank_seconds": rank_seconds, "precisions": precisions}
    staged = model_dir / "lm"
    key = build_key(staged, ["paged-openvino", "eager"], precisions, "cpu", options, CODE_INPUTS)
    manifest = decoder_export.read_manifest(model_dir)
    if not force and manifest is not None and manifest.get("build_key") == key and decoder_export.exported(model_dir):
        log(f"{model_dir / decoder_export.FOLDER} up to date (same weights, code, versions, CPU flags and options)")
        return manifest
    out = model_dir / decoder_export.FOLDER
    shutil.rmtree(out, ignore_errors=True)
    torch.set_num_threads(threads)
    loaded = load(model_dir, config["handler"])
    manifest = {
        "format": decoder_export.FORMAT,
        "build_key": key,
        "built_on": {**built_on("cpu"), "cpu_kind": runtime.cpu_kind()},
    }
    with torch.inference_mode(False):
        manifest["decoder"], converted = export(loaded.model, model_dir)
    unconvertible = manifest["decoder"].get("reason", "")
    candidates, refused = walk(loaded, converted, unconvertible, precisions, threads, rows)
    ranking = rank(candidates, loaded, rows, rank_seconds)
    manifest.update(gate=gate_record(), ranking=ranking)
    kept, measured = order(candidates)
    manifest.update(candidates=kept, refused=refused + measured)
    out.mkdir(parents=True, exist_ok=True)
    (out / decoder_export.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    for entry in kept:
        log(f"rank {entry['rank']}: {entry['step']}/{entry['precision']} {entry['ms_per_token']} ms per token "
            f"(steps: {entry['ms_per_step']})")  # fmt: skip
    for entry in refused + measured:
        log(f"{entry['step']}/{entry['precision']}: refused ({entry['kind']}): {entry['reason']}")
    return manifest


def load(model_dir: Path, handler: dict[str, Any]) -> Any:
    from handlers.core.config import ConfigError
    from handlers.generation.model import load_generator

    try:
        return load_generator(str(model_dir), handler, model_dir.name)
    except (ConfigError, OSError, ValueError) as error:
        raise BuildError(f"{model_dir}: does not load as the generator's model folder: {error}") from None


def export(model: Any, model_dir: Path) -> tuple[dict[str, Any], Any]:
    """The decoder traced and saved (decode/openvino/), then read back as a worker reads it and made paged once
    (every candidate compiles that one model, as a worker's walk does); (what the manifest says of it, the paged
    model, or None when the model does not convert: the manifest's ``reason`` says why)."""
    from handlers.generation import decoder_export, paged_openvino

    started = time.perf_counter()
    try:
        stateful = paged_openvino.export(model)
    except paged_openvino.Unconvertible as error:
        return {"exported": False, "reason": str(error)}, None
    files = decoder_export.save(stateful, model, model_dir)
    recipe = json.loads((model_dir / decoder_export.FOLDER / decoder_export.WEIGHTS).read_text())
    from_model = sum(segment["size"] for segment in recipe["segments"] if "tensor" in segment)
    seconds = round(time.perf_counter() - started, 1)
    log(f"exported the decoder in {seconds} s: {from_model} of {recipe['bin_size']} constant bytes are the model's own")
    described = {"exported": True, "files": files, "seconds": seconds, "bin_size": recipe["bin_size"]}
    described["bytes_from_model"] = from_model
    try:
        return described, paged_openvino.to_paged(decoder_export.read(model, model_dir))
    except (paged_openvino.Unconvertible, decoder_export.ExportError) as error:
        return described | {"reason": f"not paged: {error}"}, None


def walk(
    loaded: Any, converted: Any, unconvertible: str, precisions: list[str], threads: int, rows: int
) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """Every candidate built and gated against eager fp32: (those built, eager fp32 first, each with its gate's
    refusal if any; those that could not be built, with why). ``converted``: the paged model (None: it does not
    convert, for ``unconvertible``)."""
    from handlers.generation import paged_openvino, precision
    from handlers.generation.gate import greedy_sequences

    model, pad = loaded.model, loaded.pad_token_id
    reference = greedy_sequences(model, pad, logprobs=True)
    candidates = [Candidate("eager", "fp32", model=model)]
    refused: list[dict[str, Any]] = []

    def gate(paged: Any, wanted: str) -> Any:
        return precision.decoding_gate(model, model, pad, wanted, reference, paged)

    for wanted in precisions:
        if wanted in EAGER_PRECISIONS and wanted != "fp32":
            eager = precision.at_precision(model, wanted)
            figures = precision.decoding_gate(model, eager, pad, wanted, reference)
            denied = None if figures.passed else refusal("eager", wanted, "gate", f"decoding gate: {figures.summary()}")
            candidates.append(Candidate("eager", wanted, model=eager, gate=figures.describe(), refusal=denied))
        if converted is None:
            refused.append(refusal("openvino", wanted, "convert", f"the model does not convert: {unconvertible}"))
            continue
        pool = (rows * (loaded.limits.max_prompt_tokens + loaded.limits.max_new_tokens), rows)
        shape = paged_openvino.cache_shape(model.config)
        paged, kind, reason = paged_openvino.compile_gated(model, converted, shape, threads, pool, wanted, gate)
        if paged is None:
            refused.append(refusal("openvino", wanted, kind, reason))
        else:
            denied = refusal("openvino", wanted, kind, reason) if kind else None
            candidates.append(Candidate("openvino", wanted, model=model, paged=paged, gate=paged.gate, refusal=denied))
    return candidates, refused


def refusal(step: str, precision: str, kind: str, reason: str) -> dict[str, Any]:
    return {"step": step, "precision": precision, "kind": kind, "reason": reason}


def rank(candidates: list[Candidate], loaded: Any, rows: int, seconds: float) -> dict[str, Any]:
    """Each candidate's decoding steps at 1 row and at ``rows`` rows (one long prompt among short ones), timed
    round-robin until ``seconds`` are spent (at least 3 rounds after one untimed)."""
    import torch

    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import new_batch

    limits = loaded.limits
    short = loaded.tokenizer.encode("Once upon a time there was a small model")[: limits.max_prompt_tokens]
    long = (short * (RANK_LONG_PROMPT // max(len(short), 1) + 1))[: min(RANK_LONG_PROMPT, limits.max_prompt_tokens)]
    shapes = {1: [short], rows: [long] + [short] * (rows - 1)}
    budget = limits.max_new_tokens  # the rows' decoding room: each timed step adds one token to every row
    started, rounds = time.perf_counter(), 0
    with torch.inference_mode():
        batches = {}
        for candidate in candidates:
            for count, prompts in shapes.items():
                batch = new_batch(candidate.model, loaded.pad_token_id, (), None, 0, candidate.paged)
                batch.prefill([Sequence(list(ids), SamplingSettings(budget)) for ids in prompts])
                batch.step()  # untimed: the first step allocates
                batches[(candidate.name, count)] = batch
        while rounds < min(3, budget - 2) or (time.perf_counter() - started < seconds and rounds < budget - 2):
            for candidate in candidates:
                for count in shapes:
                    begun = time.perf_counter()
                    batches[(candidate.name, count)].step()
                    candidate.samples.setdefault(count, []).append(time.perf_counter() - begun)
            rounds += 1
        for batch in batches.values():
            batch.remove(list(batch.sequences))
    return {
        "measure": "median ms per decoding step; ms per token = the mean over both sizes of step ms / rows",
        "rows": sorted(shapes),
        "long_prompt_tokens": len(long),
        "short_prompt_tokens": len(short),
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "seconds": round(time.perf_counter() - started, 1),
    }


def order(candidates: list[Candidate]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Candidates fastest first (rank 1 = best), and the refused ones with their figures: those their gate refused,
    and the paged steps slower than eager at their precision."""
    entries: list[dict[str, Any]] = []
    for candidate in candidates:
        steps = {count: round(1000 * statistics.median(times), 2) for count, times in candidate.samples.items()}
        per_token = round(statistics.mean(ms / count for count, ms in steps.items()), 2)
        entry: dict[str, Any] = {"step": candidate.step, "precision": candidate.precision, "gate": candidate.gate}
        entry |= {"ms_per_step": {str(n): ms for n, ms in steps.items()}, "ms_per_token": per_token}
        entries.append(entry | (candidate.refusal or {}))
    from handlers.generation.paged_openvino import STEP_PRECISIONS

    eager = {e["precision"]: e["ms_per_token"] for e in entries if e["step"] == "eager" and "kind" not in e}
    kept: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for entry in sorted(entries, key=lambda entry: entry["ms_per_token"]):
        compute = STEP_PRECISIONS[entry["precision"]].compute if entry["step"] == "openvino" else entry["precision"]
        yardstick = eager.get(compute)  # int8 weights compute in fp32: eager fp32 is theirs
        if "kind" in entry:
            refused.append(entry)
        elif entry["step"] == "openvino" and yardstick and entry["ms_per_token"] > yardstick * (1 + SLOWER_MARGIN):
            reason = f"{entry['ms_per_token']} ms per token, over 10 % slower than eager/{compute} ({yardstick})"
            refused.append(entry | {"kind": "slower", "reason": reason})
        else:
            kept.append(entry | {"rank": len(kept) + 1})
    return kept, refused


def gate_record() -> dict[str, Any]:
    from handlers.generation.gate import GATE_PROMPTS, GATE_TOKENS
    from handlers.generation.precision import MAX_LOGPROB_DIFFERENCE

    return {
        "reference": "eager fp32",
        "measure": "greedy tokens equal to the reference's, and each chosen token's |logprob difference| within "
        "the threshold",
        "rows": len(GATE_PROMPTS) + 1,
        "tokens": GATE_TOKENS,
        "logprob_threshold": MAX_LOGPROB_DIFFERENCE,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.build_decode_steps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-dir", type=Path, required=True, help="the staged folder (lm/, model_info.json)")
    parser.add_argument("--config", type=Path, required=True, help="the model-config.yaml the archive packs")
    parser.add_argument(
        "--rank-seconds", type=float, default=10.0, help="ranking budget, at least 3 rounds (default 10)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when the inputs did not change")
    args = parser.parse_args(argv)
    if args.rank_seconds <= 0:
        parser.error("--rank-seconds must be positive")
    try:
        build(args.model_dir, args.config, args.rank_seconds, args.force)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
