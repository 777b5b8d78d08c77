"""The ideal in-process ceiling at the SLO: the served system with every overhead taken away.

    python -m loadtests.baselines.ideal --archive model_store/minilm.mar --slo-ms 100 [capacity search options]

The archive's handler is loaded as a TorchServe worker loads it (scripts/ops/handler_loader.py: its
model-config.yaml, precision, backend, threads) in as many worker processes as the archive configures
(minWorkers), and a perfect batcher in this process replays the open-loop arrival schedule the capacity search
sends to a server (loadtests/openloop.py, the same seeds, so the same arrival times and texts as Locust's
OpenLoopUser at each step): each arrival joins a FIFO queue at its due time; a free worker is handed up to batchSize
queued requests once the batch is full or maxBatchDelay has passed since the window opened (a worker free and a
request waiting). No HTTP, no frontend, no serialisation beyond the texts sent over a pipe. Latency runs from a
request's scheduled arrival to its answer reaching the dispatcher. The search (loadtests/capacity.py's) finds the
highest rate whose p99 <= SLO, with the same steps, durations and seeds as the served systems' search.

Besides the capacity, it keeps one record per request of the step at capacity (tokens, queue wait, its batch's
compute time and size, latency) and sums up the tail: of the requests at or above the p99, how many were long
(filled the model's token window) themselves, shared a batch with a long text, or waited in the queue while a batch
holding a long text ran. Writes <out>/ideal.json (the result, the steps, the records) and the capacity curve.
Exit codes: 0 searched, 1 the handler failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import tempfile
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

from loadtests import capacity as capacity_search
from loadtests.openloop import arrival_offsets
from loadtests.payloads import answer_of, traffic, worker_requests
from scripts.ops.stats import percentile

OPEN_LOOP_STREAM = 1  # the payload and arrival stream of Locust's one OpenLoopUser (locustfile.stream_id)
DRAIN_SECONDS = 5.0  # as Locust's --drain-seconds: answers this long after the last arrival still count
LATE_SECONDS = 0.010  # as Locust's --late-ms: an arrival queued this late counts as a late start


@dataclass
class Arrival:
    """One request of a step: when it was due, what it sends, and what happened to it (seconds from the start)."""

    index: int
    due: float
    body: Any
    queued: float | None = None
    dispatched: float | None = None
    answered: float | None = None
    batch: int | None = None
    failure: str = ""


@dataclass
class Batch:
    index: int
    worker: int
    started: float
    requests: list[int]
    ended: float | None = None
    compute_s: float | None = None  # handle() as timed inside the worker


class Dispatcher:
    """The perfect batcher's decisions, without clocks or processes: feed it arrivals and finished batches with the
    time they happen, ask it which batches to start now and when to ask again."""

    def __init__(self, workers: int, batch_size: int, max_delay_s: float):
        if workers < 1 or batch_size < 1 or max_delay_s < 0:
            raise ValueError("need workers >= 1, batch_size >= 1 and max_delay_s >= 0")
        self.batch_size = batch_size
        self.max_delay_s = max_delay_s
        self.free: list[int] = list(range(workers))  # lowest id first: deterministic
        self.queue: deque[int] = deque()
        self.window_opened: float | None = None  # when a free worker and a queued request first coexisted

    def arrive(self, request: int, now: float) -> None:
        self.queue.append(request)
        self._open_window(now)

    def finished(self, worker: int, now: float) -> None:
        self.free.append(worker)
        self.free.sort()
        self._open_window(now)

    def _open_window(self, now: float) -> None:
        if self.window_opened is None and self.queue and self.free:
            self.window_opened = now

    def deadline(self) -> float | None:
        """When the filling batch must go even if not full (None: nothing is filling)."""
        return None if self.window_opened is None else self.window_opened + self.max_delay_s

    def take(self, now: float) -> list[tuple[int, list[int]]]:
        """The batches to start now: (worker, request ids) each, full ones at once, a partial one at its deadline."""
        started = []
        while self.free and self.queue:
            deadline = self.deadline()
            if len(self.queue) < self.batch_size and deadline is not None and now < deadline:
                break
            worker = self.free.pop(0)
            count = min(self.batch_size, len(self.queue))
            started.append((worker, [self.queue.popleft() for _ in range(count)]))
            self.window_opened = None
            self._open_window(now)  # what is left waits for the next free worker from now on
        return started

    @property
    def idle(self) -> bool:
        return not self.queue


def schedule(model: str, rate: float, seconds: float, payload_seed: int, arrivals: str) -> list[Arrival]:
    """The arrivals Locust's OpenLoopUser makes in `seconds` at `rate` (same seeds: same times, same bodies)."""
    payloads = traffic(model).payloads(payload_seed, OPEN_LOOP_STREAM)
    offsets = arrival_offsets(rate, arrivals, seed=f"{payload_seed}-{OPEN_LOOP_STREAM}")
    planned = []
    for index, due in enumerate(offsets):
        if due >= seconds:
            break
        planned.append(Arrival(index, due, payloads.next()))
    return planned


# ------------------------------------------------------------------------------------------------ worker processes
def worker_main(connection: Connection, model_dir: str, model_name: str, model: str) -> None:
    """One worker: load the handler as TorchServe does, then answer batches of bodies until told to stop (None)."""
    from scripts.ops.handler_loader import load_handler, set_requests, statuses

    try:
        handler, context = load_handler(model_dir, model_name)
    except Exception as error:  # the parent reports it; a traceback here would be lost
        connection.send(("error", f"{type(error).__name__}: {error}"))
        return
    described = handler.describe() if hasattr(handler, "describe") else {}
    connection.send(("ready", described))
    model_traffic = traffic(model)
    while True:
        bodies = connection.recv()
        if bodies is None:
            return
        requests, headers = worker_requests(bodies)
        set_requests(context, headers)
        started = time.perf_counter()
        outputs = handler.handle(requests, context)
        compute_s = time.perf_counter() - started
        failures = []
        for index, (status, output) in enumerate(zip(statuses(context, len(bodies)), outputs, strict=True)):
            if status != 200:
                failures.append(f"HTTP {status}: {str(output)[:120]}")
                continue
            failures.append(judge_answer(model_traffic, output, context.get_response_headers(index)))
        connection.send((compute_s, failures))


def judge_answer(model_traffic: Any, output: Any, headers: Any) -> str:
    """The traffic's verdict on one answer as a client reads it ("" when it is right): a JSON body, or a binary one
    (an OIP answer with Triton's binary extension) through the traffic's own decoder and the answer's headers."""
    if not isinstance(output, (str, bytes, bytearray)):
        return model_traffic.check(output) or ""
    content = output.encode("utf-8") if isinstance(output, str) else bytes(output)
    try:
        answer = answer_of(model_traffic, content, dict(headers or {}))
    except ValueError as error:
        return f"unreadable answer: {error}"[:200]
    return model_traffic.check(answer) or ""


class WorkerPool:
    """N worker processes (spawned: torch and fork do not mix), each behind one pipe."""

    def __init__(self, model_dir: str, model_name: str, model: str, workers: int, start_timeout: float = 600):
        context = multiprocessing.get_context("spawn")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.connections: list[Connection] = []
        self.processes = []
        for _ in range(workers):
            ours, theirs = context.Pipe()
            process = context.Process(target=worker_main, args=(theirs, model_dir, model_name, model), daemon=True)
            process.start()
            self.connections.append(ours)
            self.processes.append(process)
        self.described: dict[str, Any] = {}
        for connection in self.connections:
            if not connection.poll(start_timeout):
                self.close()
                raise RuntimeError(f"a worker did not load the handler within {start_timeout:g} s")
            kind, detail = connection.recv()
            if kind != "ready":
                self.close()
                raise RuntimeError(f"a worker could not load the handler: {detail}")
            self.described = detail

    def close(self) -> None:
        for connection, process in zip(self.connections, self.processes, strict=True):
            try:
                connection.send(None)
            except OSError:
                pass
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join()


def _wake_after(now: float, stop_at: float, pending: deque[Arrival], dispatcher: Dispatcher) -> float:
    """Seconds until something can happen without a worker answering: an arrival, a batch deadline, the stop."""
    wake = [stop_at]
    if pending:
        wake.append(pending[0].due)
    deadline = dispatcher.deadline()
    if deadline is not None and dispatcher.free:
        wake.append(deadline)
    return max(0.0, min(wake) - now)


def replay(
    pool: WorkerPool, planned: list[Arrival], batch_size: int, max_delay_s: float, drain_s: float = DRAIN_SECONDS
) -> list[Batch]:
    """Run the schedule in real time against the pool; fills in every arrival's times. Returns the batches."""
    dispatcher = Dispatcher(len(pool.connections), batch_size, max_delay_s)
    batches: list[Batch] = []
    running: dict[int, Batch] = {}  # worker -> its batch
    pending = deque(planned)
    stop_at = (planned[-1].due if planned else 0.0) + drain_s
    origin = time.perf_counter()
    while True:
        now = time.perf_counter() - origin
        while pending and pending[0].due <= now:
            arrival = pending.popleft()
            arrival.queued = now
            dispatcher.arrive(arrival.index, now)
        for worker, members in dispatcher.take(now):
            batch = running[worker] = Batch(len(batches), worker, now, members)
            batches.append(batch)
            for index in members:
                planned[index].dispatched, planned[index].batch = now, batch.index
            pool.connections[worker].send([planned[index].body for index in members])
        if (not pending and not running and dispatcher.idle) or now >= stop_at:
            break  # done, or what is still open counts as unfinished
        timeout = _wake_after(now, stop_at, pending, dispatcher)
        if not running:
            time.sleep(timeout)
            continue
        for ready in wait([pool.connections[worker] for worker in running], timeout):
            connection = cast(Connection, ready)
            compute_s, failures = connection.recv()
            done = time.perf_counter() - origin
            batch = running.pop(pool.connections.index(connection))
            batch.ended, batch.compute_s = done, compute_s
            for index, failure in zip(batch.requests, failures, strict=True):
                planned[index].answered, planned[index].failure = done, failure
            dispatcher.finished(batch.worker, done)
    for batch in running.values():  # still computing at the stop: wait so the next step starts with idle workers
        pool.connections[batch.worker].recv()
    return batches


# ------------------------------------------------------------------------------------------------ records and tail
def request_records(planned: list[Arrival], batches: list[Batch], tokens: list[int] | None) -> list[dict[str, Any]]:
    """One record per request: its tokens, queue wait, its batch's compute and size, latency (ms)."""
    records = []
    for arrival in planned:
        batch = batches[arrival.batch] if arrival.batch is not None else None
        record: dict[str, Any] = {
            "index": arrival.index,
            "due_ms": round(arrival.due * 1e3, 3),
            "tokens": tokens[arrival.index] if tokens else None,
            "queue_wait_ms": None if arrival.dispatched is None else round((arrival.dispatched - arrival.due) * 1e3, 3),
            "batch": arrival.batch,
            "batch_requests": len(batch.requests) if batch else None,
            "batch_compute_ms": None if not batch or batch.compute_s is None else round(batch.compute_s * 1e3, 3),
            "latency_ms": None if arrival.answered is None else round((arrival.answered - arrival.due) * 1e3, 3),
            "failure": arrival.failure,
        }
        records.append(record)
    return records


def tail_breakdown(records: list[dict[str, Any]], batches: list[dict[str, Any]], long_tokens: int) -> dict[str, Any]:
    """Where the slowest 1 % of requests lost their time, against all requests: a long text's own forward pass, a
    short text in a batch with a long one, or a wait in the queue while a batch holding a long text ran.

    ``batches``: {"index", "started_ms", "ended_ms", "requests"} each; ``records`` as request_records makes them."""
    answered = [r for r in records if r["latency_ms"] is not None]
    if not answered or all(r["tokens"] is None for r in answered):
        return {}
    long_requests = {r["index"] for r in answered if (r["tokens"] or 0) >= long_tokens}
    long_batches = [b for b in batches if long_requests.intersection(b["requests"])]
    long_batch_ids = {b["index"] for b in long_batches}

    def queued_behind_long(record: dict[str, Any]) -> bool:
        waited_from, waited_to = record["due_ms"], record["due_ms"] + (record["queue_wait_ms"] or 0.0)
        return any(
            b["index"] != record["batch"] and b["started_ms"] < waited_to and (b["ended_ms"] or 1e18) > waited_from
            for b in long_batches
        )

    def shares(group: list[dict[str, Any]]) -> dict[str, Any]:
        if not group:
            return {"requests": 0}
        is_long = [r["index"] in long_requests for r in group]
        shared = [not own and r["batch"] in long_batch_ids for r, own in zip(group, is_long, strict=True)]
        behind = [queued_behind_long(r) for r in group]
        count = len(group)
        return {
            "requests": count,
            "long_itself": round(sum(is_long) / count, 4),
            "shared_batch_with_long": round(sum(shared) / count, 4),
            "queued_behind_long": round(sum(behind) / count, 4),
            "any_long": round(sum(a or b or c for a, b, c in zip(is_long, shared, behind, strict=True)) / count, 4),
            "mean_latency_ms": round(sum(r["latency_ms"] for r in group) / count, 3),
            "mean_queue_wait_ms": round(sum(r["queue_wait_ms"] or 0.0 for r in group) / count, 3),
            "mean_batch_compute_ms": round(sum(r["batch_compute_ms"] or 0.0 for r in group) / count, 3),
        }

    p99 = percentile([r["latency_ms"] for r in answered], 0.99)
    tail = [r for r in answered if r["latency_ms"] >= p99]
    long_compute = [r["batch_compute_ms"] for r in answered if r["index"] in long_requests and r["batch_compute_ms"]]
    other_compute = [
        b["compute_ms"] for b in batches if b["index"] not in long_batch_ids and b.get("compute_ms") is not None
    ]
    return {
        "long_tokens": long_tokens,
        "p99_ms": p99,
        "p99_requests": shares(tail),
        "all_requests": shares(answered),
        "batch_compute_with_long_p50_ms": percentile(long_compute, 0.5),
        "batch_compute_without_long_p50_ms": percentile(other_compute, 0.5),
    }


def batch_records(batches: list[Batch]) -> list[dict[str, Any]]:
    return [
        {
            "index": b.index,
            "worker": b.worker,
            "started_ms": round(b.started * 1e3, 3),
            "ended_ms": None if b.ended is None else round(b.ended * 1e3, 3),
            "compute_ms": None if b.compute_s is None else round(b.compute_s * 1e3, 3),
            "requests": b.requests,
        }
        for b in batches
    ]


def step_result(rate: float, seconds: float, planned: list[Arrival]) -> capacity_search.Step:
    """The step as the capacity search judges a served one (failures, unfinished, late starts, p50/p99)."""
    latencies = [(a.answered - a.due) * 1e3 for a in planned if a.answered is not None]
    late = sum(1 for a in planned if a.queued is not None and a.queued - a.due > LATE_SECONDS)
    answered = [a for a in planned if a.answered is not None]
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    return capacity_search.Step(
        rate=rate,
        p50_ms=None if p50 is None else round(p50, 3),
        p99_ms=None if p99 is None else round(p99, 3),
        failures=sum(1 for a in answered if a.failure),
        requests=len(answered),
        achieved_rate=round(len(planned) / seconds, 3) if seconds else None,
        throughput=round(len(answered) / max(a.answered for a in answered), 3) if answered else None,  # type: ignore
        unfinished=len(planned) - len(answered),
        late_share=round(late / len(planned), 4) if planned else 0.0,
    )


# ------------------------------------------------------------------------------------------------ the search
def token_counter(model_dir: str, described: dict[str, Any]) -> Callable[[list[Any]], list[int]] | None:
    """Tokens per request body (truncated at the model's window), counted here after a step, never in a worker."""
    max_tokens = described.get("max_tokens")
    if not max_tokens:
        return None
    from handlers.text.model import read_model_files

    tokenizer = read_model_files(model_dir, "embedding").tokenizer  # truncates at the model's own limit

    def count(bodies: list[Any]) -> list[int]:
        return [len(encoding.ids) for encoding in tokenizer.encode_batch([body["text"] for body in bodies])]

    return count


def ideal_capacity(
    archive: str | Path,
    model: str,
    slo_ms: float,
    out_dir: str | Path,
    start_rate: float = 8.0,
    max_rate: float = 4000.0,
    growth: float = 2.0,
    tolerance: float = 0.1,
    max_steps: int = 12,
    step_seconds: float = 20.0,
    cooldown_seconds: float = 2.0,
    payload_seed: int = 0,
    arrivals: str = "poisson",
    max_late_share: float = 0.1,
    warmup_seconds: float = 10.0,
    min_requests: int = 0,
    max_step_seconds: float | None = None,
    workers: int = 0,  # Locust's worker processes: nothing to distribute here
    log: Callable[..., Any] = print,
    confirm: int = 3,
    margin: float = 0.85,
) -> dict[str, Any]:
    """Load the archive's handler in its configured workers, search the capacity, write <out_dir>/ideal.json."""
    import yaml

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"ideal-{model}-") as folder:
        with zipfile.ZipFile(archive) as mar:
            mar.extractall(folder)
            model_name = json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]["modelName"]
        config = yaml.safe_load((Path(folder) / "model-config.yaml").read_text()) or {}
        worker_count = int(config.get("minWorkers") or 1)
        batch_size = int(config.get("batchSize") or 1)
        max_delay_s = float(config.get("maxBatchDelay") or 0) / 1e3
        log(f"ideal: {worker_count} workers, batchSize {batch_size}, maxBatchDelay {max_delay_s * 1e3:g} ms")
        pool = WorkerPool(folder, model_name, model, worker_count)
        try:
            count_tokens = token_counter(folder, pool.described)
            # Each run's records, per rate in run order: a confirmed rate has several, and the one kept is the run
            # that stands for the capacity.
            kept: dict[float, list[dict[str, Any]]] = {}
            counter = {"n": 0}

            def run_step(rate: float, seconds: float, seed: int) -> tuple[capacity_search.Step, list[Arrival], list]:
                planned = schedule(model, rate, seconds, seed, arrivals)
                batches = replay(pool, planned, batch_size, max_delay_s)
                time.sleep(cooldown_seconds)
                return step_result(rate, seconds, planned), planned, batches

            def measure(rate: float) -> capacity_search.Step:
                counter["n"] += 1
                seconds = round(capacity_search.step_duration(rate, step_seconds, min_requests, max_step_seconds), 1)
                step, planned, batches = run_step(rate, seconds, payload_seed + counter["n"])
                tokens = count_tokens([a.body for a in planned]) if count_tokens else None
                kept.setdefault(rate, []).append(
                    {"records": request_records(planned, batches, tokens), "batches": batch_records(batches)}
                )
                return step

            if warmup_seconds > 0:
                log(f"warm-up: {warmup_seconds:g} s at {start_rate:g}/s (not measured)")
                run_step(start_rate, warmup_seconds, payload_seed + 1000)
            found = capacity_search.search(
                measure,
                slo_ms,
                start_rate,
                max_rate,
                growth,
                tolerance,
                max_steps,
                max_late_share=max_late_share,
                log=log,
                confirm=confirm,
                margin=margin,
            )
        finally:
            pool.close()
    at_capacity = found["at_capacity"]
    detail = kept[at_capacity.rate][at_capacity.run - 1] if at_capacity else None
    long_tokens = int(pool.described.get("max_tokens") or 0)
    result = {
        "model": model,
        "archive": str(archive),
        "slo_ms": slo_ms,
        "workers": worker_count,
        "batch_size": batch_size,
        "max_batch_delay_ms": max_delay_s * 1e3,
        "threads": pool.described.get("threads"),
        "precision": pool.described.get("precision"),
        "backend": pool.described.get("backend") or pool.described.get("compile"),
        "capacity_rate": found["capacity_rate"],
        "stopped_because": found["stopped_because"],
        "steps": [dataclasses.asdict(step) for step in found["steps"]],
        "capacity_spread": found["capacity_spread"],
        "at_capacity": dataclasses.asdict(at_capacity) if at_capacity else None,
        "tail": tail_breakdown(detail["records"], detail["batches"], long_tokens) if detail and long_tokens else {},
        "requests_at_capacity": detail["records"] if detail else [],
        "batches_at_capacity": detail["batches"] if detail else [],
    }
    (out_dir / "ideal.json").write_text(json.dumps(result, indent=1) + "\n")
    capacity_search.plot_curve(
        found["steps"], slo_ms, out_dir / "capacity.png", f"{model}: ideal in-process batcher", found["capacity_rate"]
    )
    result["report_dir"] = str(out_dir)
    return result


def summarize_tail(tail: dict[str, Any]) -> str:
    """One sentence for the report: what share of the p99 requests met a long text, and how."""
    slow = tail.get("p99_requests") or {}
    everyone = tail.get("all_requests") or {}
    if not slow.get("requests"):
        return ""
    return (
        f"of the {slow['requests']} requests at or above p99 ({tail['p99_ms']:g} ms), "
        f"{slow['any_long']:.0%} met a {tail['long_tokens']}-token text (all requests: {everyone['any_long']:.0%}): "
        f"{slow['long_itself']:.0%} were one, {slow['shared_batch_with_long']:.0%} shared its batch, "
        f"{slow['queued_behind_long']:.0%} queued while one computed; their mean queue wait "
        f"{slow['mean_queue_wait_ms']:g} ms, batch compute {slow['mean_batch_compute_ms']:g} ms "
        f"(batch p50 with a long text {tail.get('batch_compute_with_long_p50_ms')} ms, "
        f"without {tail.get('batch_compute_without_long_p50_ms')} ms)"
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.baselines.ideal",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--archive", required=True, help="the .mar to load (e.g. model_store/minilm.mar)")
    parser.add_argument("--model", help="traffic to use (default: the archive's file name)")
    parser.add_argument("--out", help="report folder (default build/ideal-<model>)")
    capacity_search.add_search_arguments(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    archive = Path(args.archive)
    if not archive.exists():
        parser.error(f"{archive} not found (make mar)")
    model = args.model or archive.stem
    try:
        traffic(model)
    except ValueError as error:
        parser.error(str(error))
    out_dir = Path(args.out or Path("build") / f"ideal-{model}")
    try:
        result = ideal_capacity(archive, model, args.slo_ms, out_dir, **capacity_search.search_kwargs(args))
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"ideal capacity of {model} at p99 <= {args.slo_ms:g} ms: {result['capacity_rate']} requests/s")
    sentence = summarize_tail(result["tail"])
    if sentence:
        print(sentence[0].upper() + sentence[1:] + ".")
    print(f"report: {out_dir}/ideal.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
