"""Reliability check "logs": what serving costs on disk, and that the logs stay readable.

Sends `requests` requests to a private server, half good (distinct inputs, answers checked against the in-process
reference) and half bad (the model's bad-request corpus, tests/data/bad_requests/<model>.yaml, cycled; bodies over
64 KiB are sent once each so the phase stays short), and measures what the log folder gained in each half. It fails
unless all of these hold:

- log bytes per request <= MAX_BYTES_PER_REQUEST in each half (the full run sends 10,000 requests per model);
- no traceback was written (a client error costs at most one line; a traceback would be ~15);
- a bad request writes at most one line more than a good one;
- ts_log.log holds each event once, and no copies of the worker, access or metrics logs' lines (TorchServe's
  built-in log4j2 configuration writes most frontend lines twice and copies those logs into ts_log);
- torchserve-start.log did not grow while requests were served and is at most MAX_START_LOG_BYTES (start-up output
  only: TorchServe's console appender used to copy every log line there);
- every good request was answered 200 with its reference answer and every bad one with a 4xx, so the figures are
  about served traffic and not about a server that refused everything.

    python -m scripts.reliability --only logs [--requests 10000] [--models classifier]
"""

import re
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from scripts.ops.server import START_LOG
from scripts.reliability import corpus
from scripts.reliability.rows import Row, verify
from scripts.reliability.traffic import closed_loop

# Budgets per request, both halves: an access-log line (~90 bytes) plus, for a bad body TorchServe cannot decode, one
# warning line (~220 bytes). TorchServe's own configuration wrote 2-7 KB per request here (3.8 KB averaged over
# 10,000 classifier requests, half bad).
MAX_BYTES_PER_REQUEST = 512
MAX_EXTRA_LINES_PER_BAD_REQUEST = 1.0
MAX_START_LOG_BYTES = 64 * 1024
LARGE_BODY_BYTES = 64 * 1024
# An event line starts with log4j's ISO8601 stamp; other lines continue the event above (tracebacks, config dump).
EVENT_LINE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2},\d{3} ")
# In ts_log.log, events of these loggers are copies: each has its own file.
OTHER_LOGS = (" MODEL_LOG - ", " ACCESS_LOG - ", " MODEL_METRICS - ", " TS_METRICS - ")
TRACEBACK = "Traceback (most recent call last)"


def snapshot(log_dir):
    """{file name: (inode, bytes)} of every file in the log folder (rolled .gz files included)."""
    return {path.name: (path.stat().st_ino, path.stat().st_size) for path in Path(log_dir).iterdir() if path.is_file()}


def new_lines(log_dir, before):
    """The lines each *.log file gained since the snapshot `before`. A file with another inode was rolled (log4j
    renames the full file and starts a new one): all of the new file is new."""
    lines = {}
    for path in sorted(Path(log_dir).glob("*.log")):
        inode, offset = before.get(path.name, (None, 0))
        with open(path, "rb") as file:
            if inode == path.stat().st_ino and path.stat().st_size >= offset:
                file.seek(offset)
            lines[path.name] = file.read().decode("utf-8", errors="replace").splitlines()
    return lines


@dataclass
class Phase:
    """What one half of the traffic wrote to the log folder."""

    name: str
    requests: int
    wrong_answers: int  # good half: not 200 or not the reference answer; bad half: not a 4xx
    bytes_by_file: dict
    lines: int  # every new line in every *.log file
    tracebacks: int
    repeated_ts_events: int  # ts_log.log events identical to one written earlier in this phase
    copied_ts_events: int  # ts_log.log events of the worker/access/metrics loggers
    start_log_growth: int

    @property
    def bytes(self):
        return sum(self.bytes_by_file.values())

    @property
    def bytes_per_request(self):
        return self.bytes / self.requests if self.requests else float("inf")

    @property
    def lines_per_request(self):
        return self.lines / self.requests if self.requests else float("inf")


def measure(name, before, after, lines, requests, wrong_answers):
    """A Phase from two snapshot()s and the new_lines() in between. Bytes are what the folder gained on disk (a file
    rolled in between counts compressed; at 10 MB per file that is rare within one check)."""
    grown = {file: after[file][1] - before.get(file, (None, 0))[1] for file in after}
    ts_events = [line for line in lines.get("ts_log.log", []) if EVENT_LINE.match(line)]
    repeats = sum(count - 1 for count in Counter(ts_events).values())
    copies = sum(1 for line in ts_events if any(marker in line for marker in OTHER_LOGS))
    return Phase(
        name,
        requests,
        wrong_answers,
        {k: v for k, v in grown.items() if v},
        sum(len(v) for v in lines.values()),
        sum(line.count(TRACEBACK) for v in lines.values() for line in v),
        repeats,
        copies,
        grown.get(START_LOG, 0),
    )


def phase_reasons(phase, wanted):
    """What one phase (good or bad requests) misses of its targets; `wanted` is the answer its requests need."""
    if phase.requests <= 0:
        return [f"{phase.name}: no requests were sent, nothing was measured"]
    reasons = []
    if phase.wrong_answers:
        reasons.append(f"{phase.name}: {phase.wrong_answers}/{phase.requests} requests not answered {wanted}")
    if phase.bytes_per_request > MAX_BYTES_PER_REQUEST:
        reasons.append(
            f"{phase.name}: {phase.bytes_per_request:.0f} log bytes/request > {MAX_BYTES_PER_REQUEST} "
            f"({phase.bytes_by_file})"
        )
    if phase.tracebacks:
        reasons.append(f"{phase.name}: {phase.tracebacks} traceback(s) written")
    if phase.repeated_ts_events:
        reasons.append(f"{phase.name}: ts_log.log wrote {phase.repeated_ts_events} event(s) twice")
    if phase.copied_ts_events:
        reasons.append(f"{phase.name}: ts_log.log holds {phase.copied_ts_events} copies of other logs' lines")
    if phase.start_log_growth:
        reasons.append(f"{phase.name}: {START_LOG} grew by {phase.start_log_growth} bytes while serving")
    return reasons


def judge(good, bad, start_log_bytes):
    """Every reason the measurement misses its target ([] = pass)."""
    reasons = phase_reasons(good, "200 with the reference answer") + phase_reasons(bad, "a 4xx")
    if good.requests > 0 and bad.requests > 0:
        extra = bad.lines_per_request - good.lines_per_request
        if extra > MAX_EXTRA_LINES_PER_BAD_REQUEST:
            reasons.append(
                f"a bad request writes {extra:.1f} more log lines than a good one "
                f"(at most {MAX_EXTRA_LINES_PER_BAD_REQUEST:.0f})"
            )
    if start_log_bytes > MAX_START_LOG_BYTES:
        reasons.append(f"{START_LOG} is {start_log_bytes} bytes > {MAX_START_LOG_BYTES}: more than start-up output")
    return reasons


def bad_bodies(model, count):
    """`count` (body, content type) pairs from the model's corpus: large bodies once each, the others cycled."""
    cases = [case for case in corpus.load(model) if not case.path]  # the model's own URL only
    large = [case for case in cases if len(case.body) > LARGE_BODY_BYTES]
    small = [case for case in cases if len(case.body) <= LARGE_BODY_BYTES]
    chosen = large[:count] + [small[i % len(small)] for i in range(max(0, count - len(large)))] if small else large
    return [(case.body, case.content_type) for case in chosen[:count]]


def send_bad(url, bodies, clients, auth):
    """Send (body, content type) pairs, one closed loop per content type; returns the HTTP statuses."""
    statuses = []
    for content_type in sorted({ct for _, ct in bodies}):
        group = [body for body, ct in bodies if ct == content_type]
        outcomes = closed_loop(url, group, clients, headers={**auth, "Content-Type": content_type})
        statuses += [o.status if o is not None else 0 for o in outcomes]
    return statuses


def settle(log_dir, seconds=1.0, timeout=15.0):
    """Wait until the log folder stops growing (worker lines reach the frontend through a pipe, a little later)."""
    deadline = time.time() + timeout
    last = snapshot(log_dir)
    while time.time() < deadline:
        time.sleep(seconds)
        now = snapshot(log_dir)
        if now == last:
            return now
        last = now
    return last


def logs_check(server, reference, requests_total, clients=16):
    """Row for the report: log bytes per request of good and bad traffic, and the log-shape rules above."""
    model = reference.name
    url = f"{server.inference_url}/predictions/{model}"
    auth = server.headers("inference")
    log_dir = server.log_dir
    half = requests_total // 2

    before = settle(log_dir)
    outcomes = closed_loop(url, [reference.body(i) for i in range(half)], clients, headers=auth)
    lost, errors, mismatches = verify(reference, outcomes)
    middle = settle(log_dir)
    good = measure("good", before, middle, new_lines(log_dir, before), half, lost + errors + mismatches)

    statuses = send_bad(url, bad_bodies(model, requests_total - half), clients, auth)
    after = settle(log_dir)
    bad = measure(
        "bad",
        middle,
        after,
        new_lines(log_dir, middle),
        len(statuses),
        sum(1 for status in statuses if not 400 <= status < 500),
    )

    start_log = log_dir / START_LOG
    start_log_bytes = start_log.stat().st_size if start_log.exists() else 0
    reasons = judge(good, bad, start_log_bytes)
    total = good.requests + bad.requests
    per_request = (good.bytes + bad.bytes) / total if total else float("inf")
    return Row(
        f"{model}: log volume over {total} requests ({good.requests} good, {bad.requests} bad)",
        f"{per_request:.0f} log bytes/request (good {good.bytes_per_request:.0f}, bad "
        f"{bad.bytes_per_request:.0f}); tracebacks {good.tracebacks + bad.tracebacks}; ts_log repeats "
        f"{good.repeated_ts_events + bad.repeated_ts_events}; start log {start_log_bytes} bytes"
        + (f"; FAILED: {'; '.join(reasons)}" if reasons else ""),
        f"<= {MAX_BYTES_PER_REQUEST} B/request, 0 tracebacks, <= 1 extra line per bad request, "
        f"no repeated or copied lines, start log <= {MAX_START_LOG_BYTES // 1024} KiB and not growing",
        not reasons,
        {
            "good": {**asdict(good), "bytes_per_request": round(good.bytes_per_request, 1)},
            "bad": {**asdict(bad), "bytes_per_request": round(bad.bytes_per_request, 1)},
            "bytes_per_request": round(per_request, 1),
            "start_log_bytes": start_log_bytes,
            "reasons": reasons,
        },
    )
