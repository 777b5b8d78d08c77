"""The in-process ceiling: the packaged handler called directly in a loop, no HTTP, no queue, no batching delay.

    python -m loadtests.baselines.inprocess --archive model_store/minilm.mar [--seconds 10] [--batch-sizes 1,8,16,32]

The archive is unpacked and its handler loaded exactly as a TorchServe worker would (same code, model-config.yaml,
precision, backend, threads), then ``handle()`` is called with batches of the load tests' seeded payload mix
(loadtests/payloads.py, so the cache sees the same repeats). For each batch size it reports requests/s and the
per-batch time; the best is the ceiling a server of this handler can approach. It also times one raw forward pass of
a single input (for the classifier target: p50 at low load <= raw forward + maxBatchDelay + 3 ms).

scripts/bench_embeddings.py is the minilm handler's own benchmark (precision x backend x threads, cache off, its own
texts). This loop differs on purpose: any model, the archive's configuration exactly as served, and the load tests'
payload mix with the cache on, so the ceiling sees the same work per request as the served runs it is compared with.
Exit codes: 0 measured, 1 the handler failed or answered wrongly, 2 bad arguments.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from loadtests.payloads import traffic, worker_requests
from scripts.ops import registry
from scripts.ops.stats import percentile

REPO = Path(__file__).resolve().parents[2]


def load_handler(model_dir, batch_size):
    """The archive's handler, initialised from its own files (model-config.yaml, weights) as a worker does it."""
    from scripts.ops.handler_loader import load_handler as load_with_overrides

    manifest = json.loads((Path(model_dir) / "MAR-INF" / "MANIFEST.json").read_text())
    handler, context = load_with_overrides(model_dir, manifest["model"]["modelName"], batch_size=batch_size)
    return handler, context, context.model_yaml_config


def answers(outputs):
    for output in outputs:
        yield json.loads(output) if isinstance(output, (str, bytes, bytearray)) else output


def measure_batches(handler, context, model, batch_size, seconds, seed=0):
    """Call handle() with batches of `batch_size` requests for `seconds`; every answer is checked."""
    from scripts.ops.handler_loader import set_requests

    model_traffic = traffic(model)
    payloads = model_traffic.payloads(seed, 0)
    durations, requests = [], 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        bodies, headers = worker_requests([payloads.next() for _ in range(batch_size)])
        set_requests(context, headers)
        started = time.perf_counter()
        outputs = handler.handle(bodies, context)
        durations.append(time.perf_counter() - started)
        for answer in answers(outputs):
            reason = model_traffic.check(answer)
            if reason:
                raise RuntimeError(f"the handler answered wrongly in process: {reason}")
        requests += batch_size
    total = sum(durations)
    return {
        "batch_size": batch_size,
        "requests": requests,
        "seconds": round(total, 3),
        "requests_per_s": round(requests / total, 2) if total else None,
        "batch_p50_ms": round(percentile(durations, 0.5) * 1e3, 3),
        "batch_p99_ms": round(percentile(durations, 0.99) * 1e3, 3),
    }


def raw_forward_ms(handler, model, inputs, repeats=200):
    """Median time of one forward pass on a single input (no parsing, no pre/post-processing); ``inputs``: what the
    model's requests carry (scripts/ops/registry.py), "rows" of numbers or "texts". None for images: the figure
    feeds only the low-load target of a model whose forward pass is short (the classifier), and an image's time is
    mostly its decode, which the ceiling's batches already include."""
    import torch

    if inputs == "images":
        return None

    engine = handler.engine  # what the handler computes with, called without the request side
    payload = traffic(model).payloads(0, 0).next()
    if inputs == "rows":  # a network (handlers/network/): its engine takes one tensor per program input
        batch = [torch.tensor([payload["inputs"]], dtype=torch.float32)]
    else:
        batch = engine.encode_padded([payload["text"]])
    times = []
    with torch.inference_mode():
        for _ in range(5):
            engine.forward(engine.model, batch)
        for _ in range(repeats):
            started = time.perf_counter()
            engine.forward(engine.model, batch)
            times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e3, 3)


def ceiling(archive, model, batch_sizes, seconds, seed=0, log=print):
    with tempfile.TemporaryDirectory(prefix=f"inprocess-{model}-") as folder:
        with zipfile.ZipFile(archive) as mar:
            mar.extractall(folder)
        handler, context, yaml_config = load_handler(folder, max(batch_sizes))
        described = handler.describe() if hasattr(handler, "describe") else {}
        results = []
        # One untimed pass per size first: the cache and allocator warm up as in a long-running worker.
        for size in batch_sizes:
            measure_batches(handler, context, model, size, min(1.0, seconds / 4), seed)
            result = measure_batches(handler, context, model, size, seconds, seed)
            log(f"  batch {size:3d}: {result['requests_per_s']} requests/s (batch p50 {result['batch_p50_ms']} ms)")
            results.append(result)
        best = max(results, key=lambda r: r["requests_per_s"] or 0)
        return {
            "model": model,
            "archive": str(archive),
            "precision": described.get("precision"),
            "backend": described.get("backend") or described.get("compile"),
            "threads": described.get("threads"),
            "configured_batch_size": yaml_config.get("batchSize"),
            "configured_max_batch_delay_ms": yaml_config.get("maxBatchDelay"),
            "results": results,
            "best": best,
            "raw_forward_ms": raw_forward_ms(handler, model, registry.archive_model(archive).inputs),
        }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.baselines.inprocess",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--archive", required=True, help="the .mar to load (e.g. model_store/minilm.mar)")
    parser.add_argument("--model", help="traffic to use (default: the archive's file name)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per batch size")
    parser.add_argument("--batch-sizes", default="1,8,16,32", help="comma-separated batch sizes")
    parser.add_argument("--payload-seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    archive = Path(args.archive)
    if not archive.exists():
        parser.error(f"{archive} not found (make mar)")
    model = args.model or archive.stem
    try:
        traffic(model)
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    except ValueError as error:
        parser.error(str(error))
    if not sizes or min(sizes) < 1 or args.seconds <= 0:
        parser.error("batch sizes must be >= 1 and --seconds > 0")
    log = (lambda *_: None) if args.json else print
    try:
        result = ceiling(archive, model, sizes, args.seconds, args.payload_seed, log=log)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        best = result["best"]
        print(
            f"{model} in process ({result['precision']}, backend {result['backend']}, {result['threads']} threads): "
            f"best {best['requests_per_s']} requests/s at batch {best['batch_size']}; raw forward of one input "
            f"{result['raw_forward_ms']} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
