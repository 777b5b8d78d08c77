"""The generator's decoding step on OpenVINO: what two candidates cost on the 124 M measurement model.

    python -m loadtests.baselines.baseline_env openvino-gen      # once: build/openvino-gen-venv (optimum-intel, GenAI)
    python -m loadtests.generator_openvino                        # both parts, 1 and 16 rows, fp32 and bf16
    python -m loadtests.generator_openvino --parts step --rows 16 --precisions fp32 --steps 5   # a quick look

The model is the measurement archive's model folder (models/generator-124m: GPT-2 small's shape, random weights,
built by its prepare step into build/generator-124m/lm when missing). optimum-intel, in its own venv, exports it once
to an OpenVINO IR (stateful decoder, tokenizer IRs) under build/generator-124m-openvino/.

- ``step``: one decoding step driven from Python, as the handler's scheduler would drive it. Three engines on rows
  of ``--context`` tokens each, stepped in turn (one step of each, then again, ``--steps`` times; medians): the
  project's own eager torch fp32 step (handlers/generation/running.py ``RunningBatch.step``, greedy), the IR turned
  into a paged-attention model (OpenVINO's ``paged_attention_transformation``: keys and values in blocks of a pool
  the caller owns, one flattened token sequence per pass with per-row block tables, built here by
  :class:`BlockTables`), and the stateful IR as exported (keys and values in the request's state, the whole batch
  stepping together). The OpenVINO engines run at each ``--precisions`` (``INFERENCE_PRECISION_HINT``; the key/value
  cache in the same precision), with the CPU plugin settings the project's OpenVINO backends use
  (handlers/core/openvino_settings.py). Their first-token logits are compared with eager torch's (largest absolute
  difference, share of rows with the same argmax). Runs in this venv: it needs only ``openvino``.
- ``pipeline``: ``openvino_genai.ContinuousBatchingPipeline`` on the IR (in build/openvino-gen-venv): output tokens/s
  for ``--rows`` requests submitted together (greedy, ``--max-new-tokens`` each, end-of-text ignored, prefill
  included), and the project's own whole-batch decoding (``running.generate``, eager fp32) of the same prompts.

Every figure is given as wall time and as the process's CPU time (steadier on a shared machine: it leaves out waiting
for a core). Threads: ``--threads`` (1, as the measurement archive's worker) for torch and OpenVINO alike. Writes
loadtests/reports/generator-openvino-<time>.json (the figures, the machine, the load average before and after).
Exit codes: 0 measured, 1 the venv, the model or a part is unusable (the message says what to do), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "loadtests" / "reports"
MODEL = "generator-124m"
ENV_NAME = "openvino-gen"
PARTS = ("step", "pipeline")
PRECISIONS = ("fp32", "bf16")
KV_PRECISIONS = {"fp32": "f32", "bf16": "bf16"}
PROMPT_SEED = 0


class Unavailable(RuntimeError):
    """Something the measurement needs is missing; the message says how to get it."""


# ------------------------------------------------------------------------------------------------ paged inputs
@dataclass
class BlockTables:
    """Rows' key/value blocks in a pool of ``blocks`` blocks of ``block_size`` tokens, and the inputs of one
    paged-attention pass over them (OpenVINO's PagedAttentionExtension: the pass's tokens flattened row after row,
    each row's keys and values read from and written to its own blocks)."""

    block_size: int
    blocks: int
    lengths: list[int] = field(default_factory=list)  # per row: tokens whose keys and values are in its blocks
    tables: list[list[int]] = field(default_factory=list)  # per row: its blocks, in order
    free: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.blocks < 1:
            raise ValueError("block_size and blocks must be >= 1")
        self.free = list(range(self.blocks - 1, -1, -1))  # pop() hands out block 0 first

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def add_row(self) -> int:
        self.lengths.append(0)
        self.tables.append([])
        return len(self.lengths) - 1

    def drop_row(self, row: int) -> None:
        """A row leaves: its blocks go back to the pool (the rows after it move up one)."""
        self.free.extend(reversed(self.tables.pop(row)))
        self.lengths.pop(row)

    def pass_inputs(self, rows: list[int], new_tokens: list[int]) -> dict[str, object]:
        """Reserve blocks for ``new_tokens[i]`` more tokens of row ``rows[i]`` and return the bookkeeping inputs of
        a pass over those rows (numpy int32 arrays, ``max_context_len`` 0-d; rows not named take no part in it);
        their lengths then include those tokens."""
        import numpy as np

        if len(rows) != len(new_tokens) or len(set(rows)) != len(rows) or any(count < 1 for count in new_tokens):
            raise ValueError(f"need distinct rows, each with a token count >= 1: {rows}, {new_tokens}")
        if any(not 0 <= row < len(self.lengths) for row in rows):
            raise ValueError(f"rows {rows}: there are {len(self.lengths)}")
        after = [self.lengths[row] + count for row, count in zip(rows, new_tokens, strict=True)]
        wanted = sum(self.blocks_for(total) - len(self.tables[row]) for row, total in zip(rows, after, strict=True))
        if wanted > len(self.free):
            raise MemoryError(f"the pass needs {wanted} more blocks, the pool has {len(self.free)} free")
        inputs = {
            "past_lens": np.array([self.lengths[row] for row in rows], dtype=np.int32),
            "subsequence_begins": np.array(cumulative(new_tokens), dtype=np.int32),
        }
        for row, total in zip(rows, after, strict=True):
            while len(self.tables[row]) < self.blocks_for(total):
                self.tables[row].append(self.free.pop())
            self.lengths[row] = total
        inputs["block_indices"] = np.array([block for row in rows for block in self.tables[row]], dtype=np.int32)
        inputs["block_indices_begins"] = np.array(cumulative([len(self.tables[row]) for row in rows]), dtype=np.int32)
        inputs["max_context_len"] = np.array(max(after), dtype=np.int32)
        return inputs


def cumulative(counts: list[int]) -> list[int]:
    """[0, c0, c0 + c1, ...]: where each row's part begins in a flattened sequence, and where the last ends."""
    begins = [0]
    for count in counts:
        begins.append(begins[-1] + count)
    return begins


def positions(lengths: list[int], new_tokens: list[int]) -> list[int]:
    """The position of every token of a pass, flattened row after row (a row's new tokens follow its cached ones)."""
    return [position for length, count in zip(lengths, new_tokens, strict=True)
            for position in range(length, length + count)]  # fmt: skip


def prompts(rows: int, tokens: int, vocab: int, seed: int = PROMPT_SEED) -> list[list[int]]:
    """``rows`` prompts of ``tokens`` random token ids (the same in every process for the same arguments)."""
    import numpy as np

    generator = np.random.default_rng(seed)
    return generator.integers(0, vocab, size=(rows, tokens)).tolist()


def median_ms(seconds: list[float]) -> float | None:
    return round(statistics.median(seconds) * 1000, 2) if seconds else None


class Timer:
    """Wall and process CPU seconds of a block. CPU time leaves out the time the process waited for a core (or was
    stopped), so on a shared machine it is the steadier figure; with one thread per engine it is what a quiet core
    would take, roughly."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def throughput(tokens: int, timer: Timer) -> dict[str, float]:
    return {
        "tokens": tokens,
        "seconds": round(timer.wall, 3),
        "tokens_per_s": round(tokens / timer.wall, 2),
        "cpu_seconds": round(timer.cpu, 3),
        "tokens_per_cpu_s": round(tokens / timer.cpu, 2),
    }


# ------------------------------------------------------------------------------------------------ venv, model, IR
def openvino_env():
    from loadtests.baselines import baseline_env

    return baseline_env.ENVS[ENV_NAME]


def venv_python() -> Path:
    env = openvino_env()
    if not env.ready():
        raise Unavailable(
            f"{env.venv} is missing or out of date (optimum-intel and openvino-genai live there, apart from .venv); "
            f"create it with: python -m loadtests.baselines.baseline_env {ENV_NAME}"
        )
    return env.python()


def model_folder(log) -> Path:
    """build/generator-124m/lm, made by the measurement archive's own prepare step when missing or stale."""
    from scripts import package

    spec = package.load_spec(MODEL)
    build_dir = REPO / "build" / MODEL
    values = {k: str(v) for k, v in (spec.get("vars") or {}).items()}
    values.update(python=sys.executable, build=build_dir, repo=REPO, version=str(spec["version"]))
    try:
        package.run_prepare(spec, build_dir, values, False, log)
    except package.PackagingError as error:
        raise Unavailable(str(error)) from None
    return build_dir / "lm"


def exported_ir(python: Path, folder: Path, log) -> Path:
    """The model folder exported by optimum-intel (fp32 weights, stateful, tokenizers), redone when it changed."""
    from scripts import package

    target = REPO / "build" / f"{MODEL}-openvino"
    stamp = target / ".export-hash"
    wanted = package.digest([folder, openvino_env().requirements])
    if stamp.exists() and stamp.read_text() == wanted and (target / "openvino_model.xml").exists():
        return target
    log(f"exporting {folder} to an OpenVINO IR in {target} (optimum-cli, once) ...")
    command = [str(python.parent / "optimum-cli"), "export", "openvino", "--model", str(folder)]
    command += ["--task", "text-generation-with-past", "--weight-format", "fp32", str(target)]
    # optimum-intel needs torchvision, whose only wheel for torch 2.13 is a CUDA build: the stock image
    # classifier's shim lets it import on CPU torch (the export runs none of its compiled ops).
    shim = REPO / "loadtests" / "baselines" / "cpu_torchvision"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0 or not (target / "openvino_model.xml").exists():
        raise Unavailable(f"optimum-cli export failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    stamp.write_text(wanted)
    return target


# ------------------------------------------------------------------------------------------------ step engines
def plugin_config(precision: str, threads: int) -> dict[str, str]:
    from handlers.core.openvino_settings import openvino_config

    return {**openvino_config(precision, threads), "KV_CACHE_PRECISION": KV_PRECISIONS[precision]}


class TorchEngine:
    """The project's eager step: a RunningBatch of greedy rows (fp32, as the measurement archive serves)."""

    name = "torch-eager-fp32"

    def __init__(self, model, rows: list[list[int]]) -> None:
        from handlers.generation.decoding import SamplingSettings, Sequence
        from handlers.generation.running import RunningBatch

        self.batch = RunningBatch(model, 0, [])
        self.sequences = [Sequence(list(row), SamplingSettings(10**6)) for row in rows]
        self.batch.prefill(self.sequences)

    def step(self) -> None:
        self.batch.step()

    @property
    def history(self) -> list[list[int]]:
        return [sequence.token_ids for sequence in self.sequences]


class PagedEngine:
    """The IR with paged attention: a pool of key/value blocks owned here, one flattened pass per step."""

    def __init__(self, compiled, precision: str, rows: list[list[int]], block_size: int, cache_inputs) -> None:
        import openvino as ov

        self.name = f"openvino-paged-{precision}"
        self.request = compiled.create_infer_request()
        longest = len(rows[0]) + 1024
        self.tables = BlockTables(block_size, len(rows) * -(-longest // block_size))
        for port_name, (shape, element_type) in cache_inputs.items():
            self.request.set_tensor(port_name, ov.Tensor(element_type, [self.tables.blocks, *shape]))
        self.first_logits = []
        for prompt in rows:  # one prompt a pass: its logits (every token's) stay small
            self.first_logits.append(self.run_pass([self.tables.add_row()], [prompt])[-1].copy())
        self.tokens = [int(logits.argmax()) for logits in self.first_logits]
        self.history = [[token] for token in self.tokens]

    def run_pass(self, rows: list[int], parts: list[list[int]]):
        """One pass: ``parts[i]`` are the new tokens of row ``rows[i]``; returns logits [tokens, vocab]."""
        import numpy as np

        counts = [len(part) for part in parts]
        flat_positions = positions([self.tables.lengths[row] for row in rows], counts)
        inputs = self.tables.pass_inputs(rows, counts)
        inputs["input_ids"] = np.array([token for part in parts for token in part], dtype=np.int64)
        inputs["position_ids"] = np.array(flat_positions, dtype=np.int64)
        self.request.infer(inputs)
        logits = self.request.get_tensor("logits").data
        return logits.reshape(-1, logits.shape[-1])

    def step(self) -> None:
        logits = self.run_pass(list(range(len(self.tokens))), [[token] for token in self.tokens])
        self.tokens = logits.argmax(axis=-1).tolist()
        for row, token in zip(self.history, self.tokens, strict=True):
            row.append(token)


class StatefulEngine:
    """The IR as exported: the batch's keys and values in the request's state, all rows stepping together."""

    def __init__(self, compiled, precision: str, rows: list[list[int]]) -> None:
        import numpy as np

        self.name = f"openvino-stateful-{precision}"
        self.request = compiled.create_infer_request()
        self.request.reset_state()
        self.rows, self.width = len(rows), len(rows[0])
        logits = self.run(np.array(rows, dtype=np.int64), 0)
        self.first_logits = list(np.array(logits[:, -1, :]))  # a copy: the next pass overwrites the output
        self.tokens = logits[:, -1, :].argmax(axis=-1)
        self.history = [[int(token)] for token in self.tokens]

    def run(self, input_ids, start: int):
        import numpy as np

        columns = input_ids.shape[1]
        self.request.infer({
            "input_ids": input_ids,
            "attention_mask": np.ones((self.rows, start + columns), dtype=np.int64),
            "position_ids": np.broadcast_to(np.arange(start, start + columns, dtype=np.int64), input_ids.shape).copy(),
            "beam_idx": np.arange(self.rows, dtype=np.int32),
        })  # fmt: skip
        self.width = start + columns
        return self.request.get_tensor("logits").data

    def step(self) -> None:
        logits = self.run(self.tokens.reshape(-1, 1).astype("int64"), self.width)
        self.tokens = logits[:, -1, :].argmax(axis=-1)
        for row, token in zip(self.history, self.tokens, strict=True):
            row.append(int(token))


def paged_model(core, ir: Path):
    """The IR with its attention turned into PagedAttentionExtension (inputs: key_cache.N, value_cache.N, ...)."""
    from openvino._offline_transformations import paged_attention_transformation

    model = core.read_model(ir / "openvino_model.xml")
    paged_attention_transformation(model)
    return model


def cache_layout(compiled) -> tuple[int, dict[str, tuple[list[int], object]]]:
    """(block size, {cache input: (its shape after the blocks dimension, element type)}) as the plugin compiled it."""
    caches = {}
    for port in compiled.inputs:
        name = port.get_any_name()
        if name.startswith(("key_cache.", "value_cache.")):
            shape = port.get_partial_shape()
            caches[name] = ([dimension.get_length() for dimension in list(shape)[1:]], port.get_element_type())
    if not caches:
        raise Unavailable("the paged model has no key_cache.N inputs: paged_attention_transformation changed")
    shape, _ = caches["key_cache.0"]
    return shape[1], caches  # [kv heads, block size, head size]


def token_agreement(reference: list[list[int]], tokens: list[list[int]]) -> float:
    """The share of greedy tokens equal to the reference's, position by position, up to a row's first difference
    (after one, the rows continue different texts and compare nothing)."""
    same = total = 0
    for want, got in zip(reference, tokens, strict=True):
        total += len(want)
        for expected, token in zip(want, got, strict=False):
            if expected != token:
                break
            same += 1
    return round(same / total, 3) if total else 1.0


def logit_agreement(reference, logits) -> dict[str, float]:
    """How far an engine's first-token logits are from eager torch's: largest absolute difference, same argmax."""
    import numpy as np

    differences = [float(np.max(np.abs(np.asarray(got, dtype=np.float32) - want))) for got, want in
                   zip(logits, reference, strict=True)]  # fmt: skip
    same = [int(np.argmax(got)) == int(np.argmax(want)) for got, want in zip(logits, reference, strict=True)]
    return {"max_abs_logit_diff": round(max(differences), 4), "argmax_agree_share": round(sum(same) / len(same), 3)}


def compiled_models(core, ir: Path, precisions, threads: int, log) -> dict[str, tuple]:
    """{precision: (paged compiled model, its block size and cache inputs, stateful compiled model)}."""
    compiled = {}
    for precision in precisions:
        config = plugin_config(precision, threads)
        paged = core.compile_model(paged_model(core, ir), "CPU", config)
        block_size, caches = cache_layout(paged)
        stateful = core.compile_model(core.read_model(ir / "openvino_model.xml"), "CPU", config)
        compiled[precision] = (paged, block_size, caches, stateful)
        log(f"compiled {precision}: paged (block size {block_size}, key cache {caches['key_cache.0']}), stateful")
    return compiled


def step_rounds(engines, rounds: int, warmup: int) -> dict[str, dict[str, float | None]]:
    """One step of each engine in turn, ``warmup + rounds`` times; the timed steps' median wall and CPU ms."""
    wall: dict[str, list[float]] = {engine.name: [] for engine in engines}
    cpu: dict[str, list[float]] = {engine.name: [] for engine in engines}
    for round_ in range(warmup + rounds):
        for engine in engines:
            with Timer() as timer:
                engine.step()
            if round_ >= warmup:
                wall[engine.name].append(timer.wall)
                cpu[engine.name].append(timer.cpu)
    return {name: {"step_ms_median": median_ms(wall[name]), "cpu_ms_median": median_ms(cpu[name])} for name in wall}


def measure_step(folder: Path, ir: Path, args, log) -> dict[str, object]:
    import openvino as ov
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    core = ov.Core()
    compiled = compiled_models(core, ir, args.precisions, args.threads, log)
    results: dict[str, object] = {}
    with torch.inference_mode():
        for rows in args.rows:
            batch = prompts(rows, args.context, model.config.vocab_size)
            reference = model(torch.tensor(batch)).logits[:, -1, :].float().numpy()
            engines: list = [TorchEngine(model, batch)]
            for precision, (paged, block_size, caches, stateful) in compiled.items():
                engines.append(PagedEngine(paged, precision, batch, block_size, caches))
                engines.append(StatefulEngine(stateful, precision, batch))
            figures = step_rounds(engines, args.steps, args.warmup)
            for engine in engines:
                if hasattr(engine, "first_logits"):
                    figures[engine.name].update(logit_agreement(reference, engine.first_logits))
                    figures[engine.name]["greedy_tokens_as_eager_share"] = token_agreement(
                        engines[0].history, engine.history
                    )
            results[f"{rows}_rows"] = figures
            log(f"step, {rows} rows of {args.context} tokens: {json.dumps(figures)}")
    return results


# ------------------------------------------------------------------------------------------------ pipeline
def eager_generate(folder: Path, rows: int, args) -> dict[str, float]:
    """The project's whole-batch decoding of ``rows`` prompts (greedy, max_new_tokens each, no stop token)."""
    import torch
    from transformers import AutoModelForCausalLM

    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import generate

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    batch = prompts(rows, args.context, model.config.vocab_size)
    with torch.inference_mode():
        generate(model, [Sequence(batch[0], SamplingSettings(2))], [], 0)  # warm-up
        sequences = [Sequence(row, SamplingSettings(args.max_new_tokens)) for row in batch]
        with Timer() as timer:
            generate(model, sequences, [], 0)
    figures = throughput(sum(len(sequence.token_ids) for sequence in sequences), timer)
    return figures, [sequence.token_ids for sequence in sequences]


def pipeline_worker(spec: dict) -> dict[str, object]:
    """In build/openvino-gen-venv: ContinuousBatchingPipeline on the IR, each precision and request count."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    results: dict[str, object] = {}
    for precision in spec["precisions"]:
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.cache_size = 1  # GB of key/value blocks: 16 rows of ~1,000 tokens need ~1.2 GB at fp32
        scheduler.max_num_seqs = max(spec["rows"])
        scheduler.max_num_batched_tokens = spec["batched_tokens"]
        scheduler.enable_prefix_caching = False
        config = dict(spec["configs"][precision])
        pipe = openvino_genai.ContinuousBatchingPipeline(spec["ir"], scheduler, "CPU", config)
        settings = openvino_genai.GenerationConfig()
        settings.max_new_tokens, settings.ignore_eos, settings.do_sample = spec["max_new_tokens"], True, False
        for rows in spec["rows"]:
            ids = [ov.Tensor(np.array([row], dtype=np.int64)) for row in prompts(rows, spec["context"], spec["vocab"])]
            pipe.generate(ids[:1], [settings])  # warm-up
            with Timer() as timer:
                answers = pipe.generate(ids, [settings] * rows)
            generated = [list(answer.m_generation_ids[0]) for answer in answers]
            figures = throughput(sum(len(ids) for ids in generated), timer)
            results[f"openvino-genai-{precision}/{rows}"] = {**figures, "generated": generated}
        del pipe
    return results


def measure_pipeline(python: Path, ir: Path, folder: Path, args, log) -> dict[str, object]:
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    spec = {
        "ir": str(ir), "rows": args.rows, "precisions": args.precisions, "context": args.context, "vocab": vocab,
        "max_new_tokens": args.max_new_tokens, "batched_tokens": args.batched_tokens,
        "configs": {precision: plugin_config(precision, args.threads) for precision in args.precisions},
    }  # fmt: skip
    results: dict[str, dict] = {}
    eager_tokens = {}
    for rows in args.rows:
        results[f"torch-eager-fp32/{rows}"], eager_tokens[rows] = eager_generate(folder, rows, args)
        log(f"pipeline: eager, {rows} requests: {results[f'torch-eager-fp32/{rows}']}")
    command = [str(python), "-m", "loadtests.generator_openvino", "--worker", json.dumps(spec)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        failure = f"exit {done.returncode}):\n{done.stderr[-2000:]}"
        raise Unavailable(f"the ContinuousBatchingPipeline worker failed ({failure}")
    for key, figures in json.loads(done.stdout.strip().splitlines()[-1]).items():
        generated = figures.pop("generated")
        figures["greedy_tokens_as_eager_share"] = token_agreement(eager_tokens[int(key.rsplit("/", 1)[1])], generated)
        results[key] = figures
        log(f"pipeline: {key}: {figures}")
    return results


# ------------------------------------------------------------------------------------------------ command line
def counts(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def choices_of(allowed):
    def parse(text: str) -> list[str]:
        values = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [value for value in values if value not in allowed]
        if not values or unknown:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)} (comma-separated), got {text!r}")
        return values

    return parse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.generator_openvino",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--parts", type=choices_of(PARTS), default=list(PARTS), help="step,pipeline (default both)")
    parser.add_argument("--rows", type=counts, default=[1, 16], help="rows / concurrent requests (default 1,16)")
    parser.add_argument("--precisions", type=choices_of(PRECISIONS), default=list(PRECISIONS), help="fp32,bf16")
    parser.add_argument("--context", type=int, default=150, help="prompt tokens of every row (default 150)")
    parser.add_argument("--steps", type=int, default=10, help="step: timed steps of each engine (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="step: untimed steps of each engine first (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="pipeline: tokens per request (default 64)")
    parser.add_argument(
        "--batched-tokens",
        type=int,
        default=256,
        help="pipeline: max_num_batched_tokens, the prompt tokens a step may take (default 256)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch and OpenVINO threads (default 1)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # the pipeline part, inside build/openvino-gen-venv
    args = parser.parse_args(argv)
    for name in ("context", "steps", "max_new_tokens", "batched_tokens", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.context + max(args.max_new_tokens, args.warmup + args.steps) > 1024:
        parser.error("--context plus the tokens decoded must fit the model's 1024 positions")
    return args


def run(args, log=print) -> dict[str, object]:
    from scripts.ops import machine

    python = venv_python()
    folder = model_folder(log)
    ir = exported_ir(python, folder, log)
    report: dict[str, object] = {"machine": machine.describe(), "load_average_before": os.getloadavg()}
    report["settings"] = {key: value for key, value in vars(args).items() if key != "worker"}
    if "step" in args.parts:
        report["step"] = measure_step(folder, ir, args, log)
    if "pipeline" in args.parts:
        report["pipeline"] = measure_pipeline(python, ir, folder, args, log)
    report["load_average_after"] = os.getloadavg()
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(pipeline_worker(json.loads(args.worker))))
        return 0
    try:
        report = run(args)
    except Unavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    REPORTS.mkdir(parents=True, exist_ok=True)
    path = REPORTS / f"generator-openvino-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
