"""What borrowing idle cores (the core lease, handlers/core/cores.py) does to one request at a time, and to short
requests under a mixed load.

One request at a time, for a short query and a long document (~360 tokens before the model's own truncation):

- in process: the archive's engine (handlers/text/engine.py, as a worker loads it: same backend walk, shared cache
  off) at 1 thread and at every core, the whole path (tokenize, forward, pooling) per request;
- served: a TorchServe from the project's config.properties with only this model (its own worker count, e.g. minilm's
  2 workers x 1 thread), a copy of its archive with ``handler.borrow_idle_cores: true`` (in a temporary store), once
  with the lease (what ``python -m scripts.server`` starts) and once without it (``TS_CORE_LEASE_DIR`` empty, as a
  bare ``torchserve --start``, which is also how the shipped archive, with borrowing off, serves); client-side
  latency.

Then a mixed load per served variant: one client sends long documents back to back while another sends short
queries back to back, for --mixed-seconds; the short queries' p50/p99 say whether they wait behind the long ones.

Every text carries a fresh number so no cache (the worker's LRU; the shared tier is off) answers it. Medians of
--repeats; the machine's CPU flags and the exact commands are saved with the numbers (--out, build/bench). Timings on
a shared machine are noisy: rerun and compare medians.

    python -m scripts.bench_cores                         # minilm, 15 repeats, 20 s of mixed load per variant
    python -m scripts.bench_cores --model mpnet --repeats 7
Exit codes: 0 measured, 1 a server or request failed, 2 bad arguments or an archive packaged with older handler code.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
SHORT = "how do I reset my password"
SENTENCE = "The operator restarted the ingestion service after the nightly batch window had closed without errors"
LONG_SENTENCES = 22  # ~360 tokens for a BERT-like WordPiece tokenizer (the model truncates at its own limit)
counter = itertools.count()


def short_text() -> str:
    return f"{SHORT} {next(counter)}"


def long_text() -> str:
    return f"document {next(counter)}. " + " ".join(f"{SENTENCE} ({i})." for i in range(LONG_SENTENCES))


def timed(call: Any, repeats: int, make_text: Any) -> list[float]:
    """Milliseconds of ``call(text)`` per repeat, a fresh text each time (after one untimed call)."""
    call(make_text())
    spans = []
    for _ in range(repeats):
        text = make_text()
        start = time.perf_counter()
        call(text)
        spans.append((time.perf_counter() - start) * 1000)
    return spans


def in_process(model_dir: Path, threads: int, repeats: int) -> dict[str, Any]:
    import torch

    from handlers.text.engine import EncodeOptions, TextEngine

    engine = TextEngine.load(model_dir, {"cache_size": 0, "shared_cache": {"url": ""}}, threads=threads)
    torch.set_num_threads(threads)

    def call(text: str) -> None:
        [row] = engine.encode([text], EncodeOptions())
        assert not isinstance(row, Exception), row

    tokens = len(engine.tokenize([long_text()])[0].ids)
    return {
        "backend": f"{engine.backend} {engine.precision}",
        "threads": threads,
        "long_tokens": tokens,
        "short_ms": statistics.median(timed(call, repeats, short_text)),
        "long_ms": statistics.median(timed(call, repeats, long_text)),
    }


def borrowing_store(model: str, source: Path, target: Path) -> Path:
    """``target`` holding a copy of ``source``'s ``<model>.mar`` whose packed model-config.yaml (the one TorchServe
    and the handler read) says ``handler.borrow_idle_cores: true``; every other file is the archive's own, so any
    packaged model can be measured (a project spec or one made from a template, such as mpnet)."""
    import yaml

    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source / f"{model}.mar") as archive:
        config_name = json.loads(archive.read("MAR-INF/MANIFEST.json"))["model"]["configFile"]
        config = yaml.safe_load(archive.read(config_name))
        config.setdefault("handler", {})["borrow_idle_cores"] = True
        config["handler"]["borrow_min_forward_ms"] = 0  # measure borrowing itself, whatever the model's size
        with zipfile.ZipFile(target / f"{model}.mar", "w", zipfile.ZIP_STORED) as copy:
            for entry in archive.infolist():
                data = yaml.safe_dump(config).encode() if entry.filename == config_name else archive.read(entry)
                copy.writestr(entry, data)
    return target


def served(store: Path, model: str, lease: bool, repeats: int, mixed_seconds: float) -> dict[str, Any]:
    from handlers.core.cores import LEASE_DIR_ENV
    from handlers.text.shared_cache import URL_ENV
    from scripts.java_home import find_java_home
    from scripts.ops import server as ops_server

    env = {URL_ENV: ""} if lease else {URL_ENV: "", LEASE_DIR_ENV: ""}
    with tempfile.TemporaryDirectory(prefix="bench-cores-") as run_dir:
        server = ops_server.start_isolated(
            REPO / "config.properties", run_dir, store, find_java_home(verbose=False), [model], None, 900, env
        )
        try:
            url = f"{server.inference_url}/predictions/{model}"
            session = requests.Session()

            def call(text: str, client: requests.Session = session) -> None:
                response = client.post(url, json={"input": [text]}, timeout=120)
                if response.status_code != 200:
                    raise RuntimeError(f"{response.status_code}: {response.text[:200]}")

            choices = server.management(timeout=60).handler_choices(model)
            result = {
                "lease": lease,
                "backend": f"{choices['backend']} {choices['precision']}",
                "threads": choices["threads"],
                "short_ms": statistics.median(timed(call, repeats, short_text)),
                "long_ms": statistics.median(timed(call, repeats, long_text)),
            }
            if mixed_seconds > 0:
                result["mixed"] = mixed_load(call, mixed_seconds)
            return result
        finally:
            server.stop()


def mixed_load(call: Any, seconds: float) -> dict[str, Any]:
    """One client sending long documents back to back beside one sending short queries back to back."""
    stop = time.monotonic() + seconds
    spans: dict[str, list[float]] = {"short": [], "long": []}

    def client(kind: str, make_text: Any) -> None:
        session = requests.Session()
        while time.monotonic() < stop:
            text = make_text()
            start = time.perf_counter()
            call(text, session)
            spans[kind].append((time.perf_counter() - start) * 1000)

    threads = [threading.Thread(target=client, args=args) for args in (("short", short_text), ("long", long_text))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    def percentile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {
        kind: {
            "requests": len(values),
            "p50_ms": percentile(values, 0.5),
            "p99_ms": percentile(values, 0.99),
        }
        for kind, values in spans.items()
    }


def table(record: dict[str, Any]) -> str:
    lines = ["| | backend | short query ms | long document ms |", "|---|---|---:|---:|"]
    for row in record["in_process"]:
        lines.append(
            f"| in process, {row['threads']} thread(s) | {row['backend']} | {row['short_ms']:.1f} | "
            f"{row['long_ms']:.1f} |"
        )
    for row in record["served"]:
        name = "served, lease on" if row["lease"] else "served, lease off"
        lines.append(
            f"| {name} ({row['threads']} thread(s) per worker) | {row['backend']} | {row['short_ms']:.1f} | "
            f"{row['long_ms']:.1f} |"
        )
    mixed = [row for row in record["served"] if "mixed" in row]
    if mixed:
        lines += [
            "",
            "| mixed load | short p50 | short p99 | long p50 | long p99 | short / long requests |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in mixed:
            short, long = row["mixed"]["short"], row["mixed"]["long"]
            lines.append(
                f"| lease {'on' if row['lease'] else 'off'} | {short['p50_ms']:.1f} | {short['p99_ms']:.1f} | "
                f"{long['p50_ms']:.1f} | {long['p99_ms']:.1f} | {short['requests']} / {long['requests']} |"
            )
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench_cores",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="minilm", help="archive model_store/<model>.mar (default minilm)")
    parser.add_argument(
        "--store",
        type=Path,
        default=REPO / "model_store",
        help="model store holding <model>.mar (default model_store/)",
    )
    parser.add_argument("--repeats", type=int, default=15, help="requests per text and variant (default 15)")
    parser.add_argument("--mixed-seconds", type=float, default=20.0, help="mixed load per served variant; 0 = none")
    parser.add_argument("--skip-served", action="store_true", help="in process only (no TorchServe)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "bench", help="folder for cores-<time>.json")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.mixed_seconds < 0:
        parser.error("--repeats must be >= 1 and --mixed-seconds >= 0")
    if not (args.store / f"{args.model}.mar").is_file():
        parser.error(f"no {args.store / (args.model + '.mar')} (python -m scripts.package builds it)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    from handlers.core import runtime
    from handlers.core.cores import available_cores

    cores = available_cores()
    record: dict[str, Any] = {
        "command": "python -m scripts.bench_cores " + " ".join(sys.argv[1:] if argv is None else argv),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": args.model,
        "cores": cores,
        "cpu_kind": runtime.cpu_kind(),
        "cpu_flags": sorted(runtime.cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
        "in_process": [],
        "served": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-cores-model-") as folder:
        with zipfile.ZipFile(args.store / f"{args.model}.mar") as archive:
            archive.extractall(folder)
        packed = Path(folder) / "handlers" / "text" / "engine.py"
        if not packed.is_file() or '"borrow_min_forward_ms"' not in packed.read_text():
            # The served part would start workers that refuse the option and TorchServe would retry them until the
            # start timeout: say so now instead.
            print(
                f"{args.store / f'{args.model}.mar'} was packaged with handler code older than this checkout (it "
                f"has no handler.borrow_min_forward_ms): rebuild it first (make mar for the bundled models, "
                f"make package NAME={args.model} MODEL_DIR=<folder> for your own)",
                file=sys.stderr,
            )
            return 2
        for threads in sorted({1, cores}):
            record["in_process"].append(in_process(Path(folder), threads, args.repeats))
            print(record["in_process"][-1], flush=True)
    try:
        if not args.skip_served:
            with tempfile.TemporaryDirectory(prefix="bench-cores-store-") as store:
                borrowing_store(args.model, args.store, Path(store))
                for lease in (True, False):
                    record["served"].append(served(Path(store), args.model, lease, args.repeats, args.mixed_seconds))
                    print(record["served"][-1], flush=True)
    except Exception as error:  # a server that did not start, or a refused request: report it, keep what was measured
        print(f"served measurement failed: {type(error).__name__}: {error}", file=sys.stderr)
        return_code = 1
    else:
        return_code = 0
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    saved = args.out / f"cores-{args.model}-{stamp}.json"
    saved.write_text(json.dumps(record, indent=2) + "\n")
    print(table(record))
    print(f"CPU: {', '.join(record['cpu_flags'])} ({record['cpu_kind']}), {cores} cores; saved {saved}")
    return return_code


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
