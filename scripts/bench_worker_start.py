"""How long a new worker takes to start, per backend: each start a fresh Python process, as TorchServe starts one.

Scale-up, restarts and rollouts wait for a worker's ``initialize``. For every start asked (``auto``, or a
``backend:precision`` forced through ``handler.backend`` / ``handler.precision``) this runs --repeats fresh processes
that each load the archive's handler in-process (scripts/ops/handler_loader.py, shared cache off) and report:

- ``load_seconds``: the handler's ``initialize`` (what describe shows), with its phases (``load_phases``: model, the
  gate's reference inputs and fp32 outputs, backend load, the gate's pass, warm-up, other);
- process start to ready: the child process's whole run seen from outside (Python start, importing torch and the
  handler package, ``initialize``, exit).

The table gives the median of the repeats (the machine may be shared: repeat and read the median) and the machine's
CPU flags; the JSON goes to --out. The default archive has the backends its build machine ranks (OpenVINO only on a
CPU with native bf16); --with-aot adds AOTInductor packages to a copy first (scripts/bench_embeddings.py builds them,
a minute or two per precision, kept while their inputs do not change).

    python -m scripts.bench_worker_start                                     # auto, 3 starts
    python -m scripts.bench_worker_start --with-aot --starts auto,openvino:fp32,aot:fp32,eager:fp32 --repeats 5
Exit codes: 0 every start loaded, 1 a start failed (its error is printed), 2 bad arguments.
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BACKENDS = ("auto", "eager", "jit", "openvino", "aot")
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
# Environment that changes which kernels a start uses (recorded with the figures).
KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "SERVING_CPU_KIND", "OMP_NUM_THREADS")


def parse_start(text: str) -> tuple[str, str]:
    """'auto' -> ('auto', 'auto'); 'aot:fp32' -> ('aot', 'fp32')."""
    backend, _, precision = text.partition(":")
    precision = precision or ("auto" if backend == "auto" else "fp32")
    if backend not in BACKENDS or (precision != "auto" and precision not in PRECISIONS):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected auto or BACKEND:PRECISION with BACKEND in {', '.join(BACKENDS[1:])} and PRECISION "
            f"in {', '.join(PRECISIONS)}"
        )
    return backend, precision


def starts_list(text: str) -> list[tuple[str, str]]:
    return [parse_start(item) for item in text.split(",") if item]


def one_start(model_dir: str, model_name: str, backend: str, precision: str, threads: int | None) -> dict[str, Any]:
    """Load the handler once in this process; what it served and how long each part took."""
    from scripts.ops.handler_loader import load_handler

    overrides: dict[str, Any] = {"backend": backend, "precision": precision, "cache_size": 0}
    if threads is not None:
        overrides["threads"] = threads
    handler, _ = load_handler(model_dir, model_name, overrides)
    described = handler.describe()
    return {
        "backend": described["backend"],
        "precision": described["precision"],
        "threads": described["threads"],
        "fallbacks": described["backend_fallbacks"],
        "load_seconds": handler.load_seconds,
        "load_phases": handler.load_phases.seconds,
    }


def run_start(model_dir: Path, model_name: str, backend: str, precision: str, threads: int | None) -> dict[str, Any]:
    """One start in a fresh process: its report, plus process start to ready as this process saw it."""
    command = [sys.executable, "-m", "scripts.bench_worker_start", "--one-start", str(model_dir), model_name]
    command += [backend, precision, str(threads or 0)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {**report, "process_seconds": elapsed}


def summarize(backend: str, precision: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the repeats (phases: the median of each phase)."""
    phases = {
        name: round(statistics.median(run["load_phases"].get(name, 0.0) for run in runs), 2)
        for name in runs[0]["load_phases"]
    }
    return {
        "start": backend if backend == "auto" else f"{backend}:{precision}",
        "served": f"{runs[0]['backend']} {runs[0]['precision']}",
        "threads": runs[0]["threads"],
        "repeats": len(runs),
        "load_seconds_median": round(statistics.median(run["load_seconds"] for run in runs), 2),
        "load_seconds_all": [round(run["load_seconds"], 2) for run in runs],
        "process_seconds_median": round(statistics.median(run["process_seconds"] for run in runs), 2),
        "load_phases_median": phases,
        "refused_before": [f"{f['backend']} {f['precision']}: {f['reason']}" for f in runs[0]["fallbacks"]],
        "runs": [{key: run[key] for key in ("load_seconds", "load_phases", "process_seconds")} for run in runs],
    }


def model_folder(archive: Path, with_aot: bool, starts: list[tuple[str, str]]) -> Path:
    """The unpacked archive (reused while the .mar is unchanged), or a copy with AOTInductor packages added at the
    precisions of the aot starts asked."""
    from scripts.bench_embeddings import unpack, with_aot_packages

    folder = archive if archive.is_dir() else unpack(archive, REPO / "build" / "bench" / f"{archive.stem}-unpacked")
    if not with_aot:
        return folder
    precisions = sorted({precision for backend, precision in starts if backend == "aot"}) or None
    # Inductor compiles for ATEN_CPU_CAPABILITY where it is set (an emulated AVX2 run): one copy per setting.
    isa = os.environ.get("ATEN_CPU_CAPABILITY", "native")
    return with_aot_packages(folder, REPO / "build" / "bench" / f"{archive.stem}-backends-{isa}", precisions)


def archive_model_name(folder: Path) -> str:
    manifest = json.loads((folder / "MAR-INF" / "MANIFEST.json").read_text())
    return str(manifest["model"]["modelName"])


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| start | serves | threads | load_seconds (median) | process start to ready | phases (median s) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row in rows:
        phases = ", ".join(f"{name} {seconds}" for name, seconds in row["load_phases_median"].items())
        lines.append(
            f"| {row['start']} | {row['served']} | {row['threads']} | {row['load_seconds_median']} "
            f"({', '.join(map(str, row['load_seconds_all']))}) | {row['process_seconds_median']} | {phases} |"
        )
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench_worker_start",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--archive",
        type=Path,
        default=REPO / "model_store" / "minilm.mar",
        help="a .mar, or an unpacked archive's folder (default model_store/minilm.mar)",
    )
    parser.add_argument(
        "--starts",
        type=starts_list,
        default=[("auto", "auto")],
        help="comma-separated: auto (what backend: auto serves here) or BACKEND:PRECISION, e.g. aot:fp32 "
        "(default auto)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per start (default 3)")
    parser.add_argument("--threads", type=int, help="handler.threads (default: the archive's)")
    parser.add_argument("--with-aot", action="store_true", help="add AOTInductor packages to a copy first (minutes)")
    parser.add_argument(
        "--out", type=Path, default=REPO / "build" / "bench", help="folder for worker-start-<time>.json (build/bench)"
    )
    parser.add_argument("--one-start", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_start is None:
        if args.repeats < 1 or (args.threads is not None and args.threads < 1):
            parser.error("--repeats and --threads must be positive")
        if not args.archive.exists():
            parser.error(f"{args.archive} not found: build it with `python -m scripts.package minilm`")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.one_start is not None:  # the child: one start, one JSON line
        model_dir, model_name, backend, precision, threads = args.one_start
        print(json.dumps(one_start(model_dir, model_name, backend, precision, int(threads) or None)))
        return 0

    from scripts.ops import machine

    folder = model_folder(args.archive, args.with_aot, args.starts)
    model_name = archive_model_name(folder)
    described_machine = machine.describe()
    environment = {name: os.environ[name] for name in KERNEL_ENV if name in os.environ}
    print(f"{described_machine}; {environment or 'no kernel environment set'}", flush=True)
    rows, failed = [], False
    for backend, precision in args.starts:
        runs = []
        for repeat in range(args.repeats):
            try:
                runs.append(run_start(folder, model_name, backend, precision, args.threads))
            except RuntimeError as error:
                print(f"error: {backend}:{precision} did not start: {error}", file=sys.stderr)
                failed = True
                break
            last = runs[-1]
            print(
                f"{backend}:{precision} start {repeat + 1}: serves {last['backend']} {last['precision']}, "
                f"load {last['load_seconds']:.2f} s, process start to ready {last['process_seconds']:.2f} s",
                flush=True,
            )
        if runs:
            rows.append(summarize(backend, precision, runs))
    print()
    print(table(rows))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / f"worker-start-{stamp}.json"
    command = "python -m scripts.bench_worker_start " + " ".join(argv if argv is not None else sys.argv[1:])
    record = {
        "command": command,
        "machine": described_machine,
        "cpu_kind": machine.cpu_kind(),
        "environment": environment,
        "load_average_at_end": round(os.getloadavg()[0], 1),
        "rows": rows,
    }
    saved.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nsaved {saved}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
