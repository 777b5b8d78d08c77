"""Traffic generators for the reliability checks: closed loop (N clients) and open loop (fixed arrival rate).

Plain threads with one keep-alive connection each: enough for the rates a 2-core server reaches, and every outcome
(status, latency, body, start lag) is recorded per request so the checks can verify each answer.
"""

import http.client
import json
import queue
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class Outcome:
    index: int
    status: int  # 0 = no HTTP answer (connection error, timeout)
    latency_s: float
    body: bytes = b""
    started_at: float = 0.0
    start_lag_s: float = 0.0
    error: str = ""

    def json(self):
        return strict_json(self.body)


def _not_json(token):
    raise ValueError(f"{token} is not JSON")


def strict_json(text):
    """Parse an answer as a strict JSON client would: Python's json.loads accepts NaN, Infinity and -Infinity,
    which RFC 8259 does not allow (browsers' JSON.parse, Go, Java reject them), so they raise ValueError here."""
    return json.loads(text, parse_constant=_not_json)


class Client:
    """One keep-alive HTTP connection to a URL; reconnects after errors."""

    def __init__(self, url, timeout=60, headers=None):
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname, parts.port, parts.path
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.connection = None

    def post(self, body):
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.connection.request("POST", self.path, body=body, headers=self.headers)
            response = self.connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as error:
            self.connection.close()
            self.connection = None
            return 0, str(error).encode()


def closed_loop(url, bodies, concurrency, timeout=60, headers=None):
    """Send every body once from `concurrency` clients; returns one Outcome per body, in body order."""
    work = queue.Queue()
    for index, body in enumerate(bodies):
        work.put((index, body))
    outcomes = [None] * len(bodies)

    def run():
        client = Client(url, timeout, headers)
        while True:
            try:
                index, body = work.get_nowait()
            except queue.Empty:
                return
            started = time.perf_counter()
            status, payload = client.post(body)
            outcomes[index] = Outcome(index, status, time.perf_counter() - started, payload, started)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def open_loop(url, make_body, rate, duration_s, max_in_flight=256, timeout=30, headers=None):
    """Start request i at t0 + i/rate whatever the answers do (no coordinated omission).

    A request that cannot start on time because all `max_in_flight` clients are busy starts late; its start lag is
    recorded, so the achieved rate and lateness can be reported next to the target."""
    total = int(rate * duration_s)
    arrivals = queue.Queue()
    for index in range(total):
        arrivals.put(index)
    outcomes = [None] * total
    t0 = time.perf_counter() + 0.2

    def run():
        client = Client(url, timeout, headers)
        while True:
            try:
                index = arrivals.get_nowait()
            except queue.Empty:
                return
            due = t0 + index / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            started = time.perf_counter()
            status, payload = client.post(make_body(index))
            outcomes[index] = Outcome(
                index, status, time.perf_counter() - started, payload, started, max(0.0, started - due)
            )

    threads = [threading.Thread(target=run, daemon=True) for _ in range(min(max_in_flight, max(1, total)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def steady_load(url, make_body, clients, stop_event, timeout=30, headers=None):
    """Closed-loop load from `clients` threads until stop_event is set; returns the outcomes in start order."""
    outcomes = []
    lock = threading.Lock()
    counter = iter(range(10**9))

    def run():
        client = Client(url, timeout, headers)
        while not stop_event.is_set():
            with lock:
                index = next(counter)
            started = time.perf_counter()
            status, payload = client.post(make_body(index))
            outcome = Outcome(index, status, time.perf_counter() - started, payload, started)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    return threads, outcomes
