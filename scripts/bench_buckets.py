"""Forward-pass time per length bucket and backend: where a compiled backend wins and where eager does.

    python -m scripts.bench_buckets [--archive model_store/minilm.mar] [--backends auto,eager] [--rows 1,4]

Loads the archive's handler in-process as a worker does (one thread per worker, as served), once per backend, then
times the bare forward pass (no tokenizer, no cache) on rows padded to each length bucket: median and max of
--calls calls after 3 warm-up calls. The build's ranking (scripts/build_backends.py) measures single rows only; this
also shows several long rows at once, which is what the slowest requests of a served mix meet.
Exit codes: 0 measured, 1 the archive could not be loaded, 2 bad arguments.
"""

import argparse
import statistics
import sys
import tempfile
import time
import zipfile


def measure(archive: str, backends: list[str], rows_list: list[int], calls: int) -> None:
    import torch

    from scripts.ops.handler_loader import load_handler

    folder = tempfile.mkdtemp(prefix="bench-buckets-")
    zipfile.ZipFile(archive).extractall(folder)
    for backend in backends:
        handler, _ = load_handler(folder, "minilm", {"backend": backend, "cache_size": 0})
        print(f"{backend}: serves {handler.backend} {handler.precision}, {handler.threads} thread(s)")
        for length in handler.loaded.buckets:
            for rows in rows_list:
                ids = torch.full((rows, length), handler.loaded.pad_id + 1000, dtype=torch.long)
                batch = (ids, torch.ones_like(ids))
                times = []
                with torch.inference_mode():
                    for call in range(calls + 3):
                        started = time.perf_counter()
                        handler.engine.forward(handler.loaded.model, batch)
                        if call >= 3:
                            times.append(1000 * (time.perf_counter() - started))
                print(
                    f"  {length:4} tokens x {rows} rows: median {statistics.median(times):7.2f} ms, "
                    f"max {max(times):7.2f}"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench_buckets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--archive", default="model_store/minilm.mar")
    parser.add_argument("--backends", default="auto,eager", help="comma-separated handler.backend values")
    parser.add_argument("--rows", default="1,4", help="rows per forward pass, comma-separated")
    parser.add_argument("--calls", type=int, default=15, help="timed calls per cell")
    args = parser.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows must be comma-separated integers, got {args.rows!r}")
    if args.calls < 1 or any(r < 1 for r in rows):
        parser.error("--calls and --rows must be at least 1")
    try:
        measure(args.archive, [b for b in args.backends.split(",") if b], rows, args.calls)
    except (OSError, zipfile.BadZipFile) as error:
        print(f"bench_buckets: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
