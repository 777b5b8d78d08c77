"""In-process benchmark of an embedding handler's inference path (no server, no HTTP): minilm, or --archive NAME.mar.

For every backend x precision x threads x batch size it loads the handler from the built archive (cache off), with
``handler.backend`` and ``handler.precision`` forced, feeds batches of B requests through ``handle()`` (validation,
cache lookup, one tokenizer call, length buckets, forward passes, JSON answers) and reports sequences/s and ms/batch,
the handler's load time (load, accuracy gate, warm-up) and its gate cosine to eager fp32, next to plain eager fp32: the
bare encoder called on the same texts padded to the longest one (no handler, no buckets).

Backends: eager, jit (torch.compile at load: minutes on 2 cores), openvino and aot (prebuilt, scripts/build_backends.py)
and auto (what `backend: auto` picks here; the served column says what). The default archive holds openvino only;
for aot the benchmark builds the packages once into build/bench/minilm-backends/ (minutes). A cell the machine cannot
run (bf16 without native bf16, ...) is skipped with the handler's reason.

Workloads: ``short`` (every text 8-20 tokens) and ``mixed`` (the README payload mix of loadtests/payloads.py: 60 %
short, a tail of paragraphs and of texts past the 256-token window). Results are printed and saved as JSON and markdown.

    python -m scripts.bench_embeddings --quick                  # a short run (fp32, eager and auto, batch 1 and 16)
    python -m scripts.bench_embeddings --backend eager,openvino,aot,auto --precision fp32,bf16 --batch-sizes 1,16
Exit codes: 0 ok, 1 a configuration failed to load or run, 2 bad arguments.
"""

import argparse
import datetime
import json
import logging
import os
import random
import shutil
import statistics
import sys
import time
import zipfile
from pathlib import Path

from scripts.ops import payloads

REPO = Path(__file__).resolve().parent.parent
BACKENDS = ("eager", "jit", "openvino", "aot", "auto")  # handler.backend values (handlers/embeddings.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Common words plus the tokenizer's unusual paths (accents, CJK, emoji).
VOCABULARY = payloads.WORDS + payloads.UNICODE_WORDS


def make_texts(workload, count, seed):
    if workload == "mixed":
        mix = payloads.ReadmeTextMix(seed=seed)
        return [mix.next_text() for _ in range(count)]
    rng = random.Random(seed)
    return [f"{index} " + payloads.words(rng, rng.randint(5, 15), VOCABULARY) for index in range(count)]


def unpack(archive, target):
    target = Path(target)
    stamp = target / ".unpacked-from"
    key = f"{archive}:{archive.stat().st_mtime_ns}"
    if not (stamp.exists() and stamp.read_text() == key):
        target.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive) as mar:
            mar.extractall(target)
        stamp.write_text(key)
    return target


def load_handler(model_dir, precision, backend, threads):
    from scripts.ops.handler_loader import load_handler as load_with_overrides

    overrides = {"precision": precision, "backend": backend, "threads": threads, "cache_size": 0}
    if precision == "int8":
        overrides["min_cosine"] = 0.0  # measure int8 although the gate would refuse it (see the gate column)
    handler, context = load_with_overrides(model_dir, "minilm", overrides)
    return handler, context, handler.load_seconds


def time_batches(run_batch, batches, repeats):
    """Seconds per batch: the median over `repeats` timed passes (after one untimed pass) of a pass's mean.

    A pass's mean weighs every text of the mix (a mixed workload's long texts are its cost), while the median over
    passes drops a pass another process on the machine slowed down."""
    for batch in batches:
        run_batch(batch)
    per_pass = []
    for _ in range(repeats):
        started = time.perf_counter()
        for batch in batches:
            run_batch(batch)
        per_pass.append((time.perf_counter() - started) / len(batches))
    return statistics.median(per_pass)


def first_batches(items, batch_size):
    """Consecutive batches of `batch_size` over at least 64 texts (8 batches of the larger sizes)."""
    batches = [items[i : i + batch_size] for i in range(0, len(items) - batch_size + 1, batch_size)]
    return batches[: max(8, 64 // batch_size)]


def bench_handler(handler, context, texts, batch_size, repeats):
    from scripts.ops.handler_loader import set_requests

    batches = first_batches(texts, batch_size)

    def run_batch(batch):
        set_requests(context, [{"Content-Type": "application/json"}] * len(batch))
        answers = handler.handle([{"body": {"text": text}} for text in batch], context)
        if not all(isinstance(answer, str) for answer in answers):
            raise RuntimeError(f"a request failed: {answers}")

    return time_batches(run_batch, batches, repeats)


def bench_plain_eager(model_dir, texts, batch_size, repeats, threads):
    """The bare fp32 encoder on texts padded to the longest of each batch: no handler, no buckets, no JSON."""
    import torch

    from handlers.text.model import load_sentence_encoder, read_model_files

    torch.set_num_threads(threads)
    model = load_sentence_encoder(model_dir)
    tokenizer = read_model_files(model_dir, "embedding").tokenizer
    batches = []
    for start in range(0, len(texts) - batch_size + 1, batch_size):
        encodings = tokenizer.encode_batch(texts[start : start + batch_size])
        longest = max(len(e.ids) for e in encodings)
        ids = torch.tensor([e.ids + [0] * (longest - len(e.ids)) for e in encodings])
        mask = torch.tensor([[1] * len(e.ids) + [0] * (longest - len(e.ids)) for e in encodings])
        batches.append((ids, mask))
    batches = batches[: len(first_batches(texts, batch_size))]

    def run_batch(batch):
        with torch.inference_mode():
            model(*batch)

    return time_batches(run_batch, batches, repeats)


def row(name, precision, backend, threads, workload, batch_size, seconds, load_seconds=None, gate=None):
    return {
        "path": name,
        "precision": precision,
        "backend": backend,
        "threads": threads,
        "workload": workload,
        "batch_size": batch_size,
        "ms_per_batch": round(seconds * 1000, 2),
        "sequences_per_s": round(batch_size / seconds, 1),
        "load_s": None if load_seconds is None else round(load_seconds, 1),
        "gate_min_cosine": gate,
    }


def markdown(rows, command, machine):
    lines = [
        f"Command: `{command}`  ",
        f"Machine: {machine}",
        "",
        "| path | backend | precision | threads | workload | batch | ms/batch | seq/s | load s | gate cos |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['path']} | {r['backend']} | {r['precision']} | {r['threads']} | {r['workload']} | "
            f"{r['batch_size']} | {r['ms_per_batch']} | {r['sequences_per_s']} | "
            f"{'' if r['load_s'] is None else r['load_s']} | "
            f"{'' if r['gate_min_cosine'] is None else r['gate_min_cosine']} |"
        )
    return "\n".join(lines) + "\n"


def csv_list(kind, choices=None):
    def parse(text):
        values = [kind(v) for v in text.split(",") if v]
        if choices and any(v not in choices for v in values):
            raise argparse.ArgumentTypeError(f"choose from {sorted(choices)}")
        return values

    return parse


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench_embeddings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--archive",
        type=Path,
        default=REPO / "model_store" / "minilm.mar",
        help="the minilm archive to benchmark (default model_store/minilm.mar)",
    )
    parser.add_argument("--precision", type=csv_list(str, {"fp32", "bf16", "fp16", "int8"}), default=["fp32", "bf16"])
    parser.add_argument(
        "--backend",
        type=csv_list(str, set(BACKENDS)),
        default=["eager", "openvino", "aot", "auto"],
        help="jit compiles for minutes on 2 cores at every load; aot builds its packages once (minutes)",
    )
    parser.add_argument("--threads", type=csv_list(int), default=[1, 2], help="threads per worker")
    parser.add_argument("--batch-sizes", type=csv_list(int), default=[1, 16])
    parser.add_argument("--workload", type=csv_list(str, {"short", "mixed"}), default=["short", "mixed"])
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed passes over the batches: 64 texts, at least 8 batches (default 3)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="short run: fp32, eager and auto, 1 thread, batch 1 and 16, mixed"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "build" / "bench",
        help="folder for embeddings-<time>.json/.md (default build/bench)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.precision, args.backend, args.threads = ["fp32"], ["eager", "auto"], [1]
        args.batch_sizes, args.workload, args.repeats = [1, 16], ["mixed"], 1
    if not args.archive.is_file():
        parser.error(f"{args.archive} not found: build it with `python -m scripts.package minilm`")
    return args


def report_row(rows, r):
    """Keep one result row and print it as it is measured."""
    rows.append(r)
    print(
        f"{r['path']:11} {r['backend']:14} {r['precision']:5} threads={r['threads']} {r['workload']:6} "
        f"batch={r['batch_size']:<3} {r['ms_per_batch']:9.1f} ms/batch {r['sequences_per_s']:8.1f} seq/s",
        flush=True,
    )


def bench_one_handler(directory, precision, backend, threads, texts, args, rows):
    """Every workload x batch size through one loaded handler; False when it did not load (reported, not raised)."""
    try:
        handler, context, load_seconds = load_handler(directory, precision, backend, threads)
    except Exception as error:  # report and go on with the other configurations
        print(f"error: {backend}/{precision}/threads={threads} did not load: {error}", file=sys.stderr)
        return False
    served = f"{handler.backend}/{handler.precision}"
    if backend != "auto" and (handler.backend, handler.precision) != (backend, precision):
        reasons = "; ".join(f"{f['backend']}/{f['precision']}: {f['reason']}" for f in handler.backend_fallbacks)
        print(f"skipping {backend}/{precision}/threads={threads}: {served} would serve ({reasons})")
        return True
    label = f"auto={handler.backend}" if backend == "auto" else backend
    gate = round(handler.min_cosine, 6)
    for workload in args.workload:
        for batch_size in args.batch_sizes:
            seconds = bench_handler(handler, context, texts[workload], batch_size, args.repeats)
            result = row(
                "handler", handler.precision, label, threads, workload, batch_size, seconds, load_seconds, gate
            )
            report_row(rows, result)
    return True


def with_aot_packages(model_dir, target, precisions=None):
    """A copy of the unpacked archive with AOTInductor packages added (built once; scripts/build_backends.py keeps
    them while its inputs do not change), at ``precisions`` (default: those this machine serves natively).
    Slower-than-eager candidates are kept: the benchmark measures them."""
    from scripts import build_backends

    target.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.name != build_backends.BACKENDS_DIR and path.is_file():
            shutil.copy2(path, target / path.name)
        elif path.is_dir() and path.name != build_backends.BACKENDS_DIR:
            shutil.copytree(path, target / path.name, dirs_exist_ok=True)
    print("building AOTInductor packages for the aot cells (minutes the first time) ...", flush=True)
    build_backends.build(
        target, backends=list(build_backends.ALL_BACKENDS), precisions=precisions, rank_seconds=10, beat_eager=False
    )
    return target


def bench_handlers(model_dir, texts, args, rows):
    """backend x precision x threads through the serving handler; False when a configuration failed to load."""
    all_loaded = True
    aot_dir = None
    for backend in args.backend:
        directory = model_dir
        if backend == "aot":
            aot_dir = aot_dir or with_aot_packages(model_dir, REPO / "build" / "bench" / "minilm-backends")
            directory = aot_dir
        for precision in args.precision if backend != "auto" else ["auto"]:
            for threads in args.threads:
                all_loaded &= bench_one_handler(directory, precision, backend, threads, texts, args, rows)
    return all_loaded


def save_results(rows, args, argv):
    import torch

    command = "python -m scripts.bench_embeddings " + " ".join(argv if argv is not None else sys.argv[1:])
    from scripts.ops import machine as this_machine

    machine = f"{this_machine.describe()}, torch {torch.__version__}, load average {os.getloadavg()[0]:.1f} at the end"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"embeddings-{stamp}.json").write_text(
        json.dumps({"command": command, "machine": machine, "rows": rows}, indent=2) + "\n"
    )
    (args.out / f"embeddings-{stamp}.md").write_text(markdown(rows, command, machine))
    print(f"\nsaved {args.out / f'embeddings-{stamp}.json'} and .md")


def main(argv=None):
    args = parse_arguments(argv)
    logging.basicConfig(level=logging.WARNING)
    model_dir = unpack(args.archive, REPO / "build" / "bench" / "minilm-unpacked")
    texts = {w: make_texts(w, 8 * max(args.batch_sizes), seed=0) for w in args.workload}
    rows = []
    for threads in args.threads:
        for workload in args.workload:
            for batch_size in args.batch_sizes:
                seconds = bench_plain_eager(model_dir, texts[workload], batch_size, args.repeats, threads)
                report_row(rows, row("plain eager", "fp32", "eager", threads, workload, batch_size, seconds))
    all_loaded = bench_handlers(model_dir, texts, args, rows)
    save_results(rows, args, argv)
    return 0 if all_loaded else 1


if __name__ == "__main__":
    sys.exit(main())
