"""Locust users for the served models. Run through ``python -m loadtests.run`` (which picks the profile), or directly:

    PYTHONPATH=. locust -f loadtests/locustfile.py --headless -H http://127.0.0.1:8080 -u 4 -t 30s MinilmUser
    PYTHONPATH=. locust -f loadtests/locustfile.py,loadtests/shapes/step.py --headless -H ... -u 16 ClassifierUser
    PYTHONPATH=. locust -f loadtests/locustfile.py --headless -H ... -u 1 -t 30s --model minilm --rate 20 OpenLoopUser

Closed-loop users (:class:`ClassifierUser`, :class:`MinilmUser`) send back to back (optionally with ``--think-ms``):
the load they offer drops when the server slows down. :class:`OpenLoopUser` starts requests on a fixed arrival
schedule at ``--rate`` requests/s in total (split over the open-loop users), whatever the responses do.

Against a server with token authorization (the production profile) pass the inference token with ``--token`` or
``$TS_INFERENCE_TOKEN``, or TorchServe's key file with ``$TS_KEY_FILE`` (loadtests.run does, from --token or
--key-file): every request then carries ``Authorization: Bearer <key>``. A key file is re-read when it changes, and a
request refused because the key was rotated while it was sent is counted as a failure and sent again with the new key
(scripts/ops/auth.py KeySource), so a run goes through `modelctl keep-keys-fresh` rotations.

Every response is checked (status, JSON, shape) and a wrong one counts as a failure. A 503 is TorchServe's answer to a
full job queue (its message wrongly says no worker is available): users count it as a failure, then retry with
exponential backoff and full jitter, as clients of this service should.
"""

import json
import random
import time
from pathlib import Path

import gevent
from gevent.pool import Pool
from locust import FastHttpUser, constant, events, task
from locust.runners import MasterRunner, WorkerRunner

from loadtests.openloop import OpenLoopCounters, arrival_offsets
from loadtests.payloads import MODELS, answer_of, request_headers, request_parts, traffic
from loadtests.report import stats_snapshot
from scripts.ops import auth

TOKEN_REFUSED_MESSAGE = "Token Authorization failed (TorchServe): the inference token is missing, wrong or expired"
TOKEN_ROTATED_MESSAGE = "Token Authorization failed (TorchServe): the key was rotated as this was sent; sent again"
KEYS = []  # this process's inference KeySource, taken at init from --token / $TS_KEY_FILE
QUEUE_FULL_MESSAGE = "503 queue full (TorchServe's job queue; its message says 'no worker'): retried with backoff"
OPEN_LOOP = OpenLoopCounters()  # this process's open-loop counters; a master sums its workers' into it
ENVIRONMENT = []  # the Locust environment, kept at init for the quit hook (which is not given it)


@events.init_command_line_parser.add_listener
def add_arguments(parser):
    group = parser.add_argument_group("project load test", "Options of loadtests/locustfile.py")
    group.add_argument(
        "--model",
        default="classifier",
        help=f"model OpenLoopUser targets: {', '.join(sorted(MODELS))}, or an embedding model's name",
    )
    group.add_argument("--payload-seed", type=int, default=0, help="seed of the payload streams (same mix each run)")
    group.add_argument("--think-ms", type=float, default=0.0, help="closed-loop users: mean pause between requests")
    group.add_argument("--max-retries", type=int, default=3, help="retries after a 503 (queue full)")
    group.add_argument("--retry-base-ms", type=float, default=50.0, help="first backoff; doubles per retry, jittered")
    group.add_argument("--rate", type=float, default=10.0, help="open loop: total target arrivals per second")
    group.add_argument("--open-loop-users", type=int, default=1, help="open loop: users sharing --rate (= -u)")
    group.add_argument("--arrivals", default="poisson", choices=("poisson", "uniform"), help="open loop: process")
    group.add_argument(
        "--max-in-flight",
        type=int,
        default=512,
        help="open loop: most open requests per user; an arrival beyond it is counted as not started",
    )
    group.add_argument("--late-ms", type=float, default=10.0, help="open loop: a start this late counts as late")
    group.add_argument(
        "--drain-seconds",
        type=float,
        default=5.0,
        help="open loop: at the end, wait this long for started requests to finish",
    )
    group.add_argument("--step-users", type=int, default=2, help="step profile: users added per step")
    group.add_argument("--step-seconds", type=float, default=10.0, help="step/spike profile: seconds per step/phase")
    group.add_argument("--spike-base-users", type=int, default=1, help="spike profile: users before/after the spike")
    group.add_argument("--open-loop-report", default="", help="open loop: write the generator's counters here (JSON)")
    group.add_argument(
        "--final-stats", default="", help="write Locust's final statistics here (JSON) once every user has stopped"
    )
    # On the parser itself, not the group: only Locust's own parser knows is_secret (masked in the web UI).
    parser.add_argument(
        "--token",
        default="",
        env_var=auth.TOKEN_ENV,
        is_secret=True,
        help=f"inference token sent as 'Authorization: Bearer' (also ${auth.TOKEN_ENV}); none for a "
        "server without token authorization",
    )


@events.init.add_listener
def take_key_source(environment, **_):
    options = environment.parsed_options
    if options is not None:
        KEYS[:] = [auth.KeySource.from_environment(options.token)]


def key_source(options):
    return KEYS[0] if KEYS else auth.KeySource.from_environment(options.token)


@events.init.add_listener
def size_connection_pool(environment, **_):
    # One connection per open request, so requests never wait for a free connection inside the generator.
    options = environment.parsed_options
    if options is not None and getattr(options, "max_in_flight", None):
        OpenLoopUser.concurrency = options.max_in_flight


def send_checked(client, model_traffic, body, options, rng):
    """POST one body; judge the answer; on 503 retry with backoff (each 503 is reported as a failure); a key refused
    because it was rotated meanwhile is reported as a failure too and sent once more with the new key."""
    sent, content_type = request_parts(body)
    keys = key_source(options)
    attempt, renewed = 0, False
    while True:
        key = keys.key()
        headers = {**auth.bearer(key), "Content-Type": content_type, **request_headers(body)}
        with client.post(
            model_traffic.path, name=model_traffic.name, headers=headers, catch_response=True, **sent
        ) as response:
            if response.status_code == 503:
                response.failure(QUEUE_FULL_MESSAGE)
                if attempt >= options.max_retries:
                    return
                attempt += 1
                gevent.sleep(rng.uniform(0, options.retry_base_ms * 2 ** (attempt - 1)) / 1000.0)
                continue
            if auth.refused(response.status_code, response.text) and not renewed and keys.renew(key):
                response.failure(f"HTTP {response.status_code}: {TOKEN_ROTATED_MESSAGE}")
                renewed = True
                continue
            judge(response, model_traffic)
            return


def judge(response, model_traffic):
    """Mark a (non-503) answer as Locust's success or failure, with the reason."""
    if auth.refused(response.status_code, response.text):
        response.failure(f"HTTP {response.status_code}: {TOKEN_REFUSED_MESSAGE}")
        return
    if response.status_code != 200:
        reason = getattr(response, "error", None) or (response.text or "")[:160]
        response.failure(f"HTTP {response.status_code}: {reason}")
        return
    try:
        answer = answer_of(model_traffic, response.content, response.headers)
    except ValueError as error:
        response.failure(f"response is not readable: {str(error)[:120]}")
        return
    reason = model_traffic.check(answer)
    if reason:
        response.failure(reason)
    else:
        response.success()


def stream_id(user):
    """A distinct payload stream per user, also across Locust worker processes."""
    runner = user.environment.runner
    worker = runner.worker_index if isinstance(runner, WorkerRunner) else 0
    type(user).started_users = getattr(type(user), "started_users", 0) + 1
    return worker * 100_000 + type(user).started_users


class ModelUser(FastHttpUser):
    """A closed-loop user of one model: send, check, repeat."""

    abstract = True
    model = None

    def wait_time(self):
        # Uniform in [0, 2 x think] so the mean pause is --think-ms; 0 = back to back.
        think_ms = self.environment.parsed_options.think_ms
        return self.rng.uniform(0, 2 * think_ms) / 1000.0 if think_ms else 0.0

    def on_start(self):
        options = self.environment.parsed_options
        self.traffic = traffic(self.model)
        stream = stream_id(self)
        self.payloads = self.traffic.payloads(options.payload_seed, stream)
        self.rng = random.Random(f"retry-{stream}")

    @task
    def predict(self):
        send_checked(self.client, self.traffic, self.payloads.next(), self.environment.parsed_options, self.rng)


class ClassifierUser(ModelUser):
    """Random 128-d rows to /predictions/classifier; expects a label and 10 probabilities."""

    model = "classifier"


class MinilmUser(ModelUser):
    """The seeded sentence mix to /predictions/minilm; expects a 384-float embedding."""

    model = "minilm"


class EmbeddingUser(ModelUser):
    """The seeded sentence mix to /predictions/<--model>, an embedding model packaged from its folder; expects an
    embedding of any width."""

    def on_start(self):
        self.model = self.environment.parsed_options.model
        super().on_start()


class OpenLoopUser(FastHttpUser):
    """Starts requests to ``--model`` on an arrival schedule, one greenlet each, without waiting for answers."""

    concurrency = 512  # resized from --max-in-flight at init
    wait_time = constant(0)

    def on_start(self):
        options = self.environment.parsed_options
        self.traffic = traffic(options.model)
        self.stream = stream_id(self)
        self.payloads = self.traffic.payloads(options.payload_seed, self.stream)
        self.rng = random.Random(f"retry-{self.stream}")
        self.rate = options.rate / max(1, options.open_loop_users)
        self.in_flight = Pool(options.max_in_flight)
        self.schedule = None

    def on_stop(self):
        # Let requests already started finish (and be counted) for a moment; no new arrivals start meanwhile.
        if self.schedule is not None:
            OPEN_LOOP.ran(self.stream, time.perf_counter() - self.started_at)
        self.in_flight.join(timeout=self.environment.parsed_options.drain_seconds)
        self.in_flight.kill(block=False)

    def send_one(self, body, options):
        send_checked(self.client, self.traffic, body, options, self.rng)
        OPEN_LOOP.completed += 1

    @task
    def next_arrival(self):
        """Wait for the next arrival and start its request if fewer than the cap are open; one arrival per call,
        so Locust's stop (which waits for the running task) ends the schedule within one inter-arrival gap."""
        options = self.environment.parsed_options
        if self.schedule is None:
            self.started_at = time.perf_counter()
            self.schedule = arrival_offsets(self.rate, options.arrivals, seed=f"{options.payload_seed}-{self.stream}")
        due = self.started_at + next(self.schedule)
        delay = due - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        now = time.perf_counter()
        can_start = not self.in_flight.full()
        OPEN_LOOP.record(
            now - due, can_start, options.late_ms / 1000.0, user=self.stream, elapsed=now - self.started_at
        )
        if can_start:
            self.in_flight.spawn(self.send_one, self.payloads.next(), options)


@events.report_to_master.add_listener
def report_open_loop(client_id, data, **_):
    data["open_loop"] = OPEN_LOOP.take()


@events.worker_report.add_listener
def collect_open_loop(client_id, data, **_):
    if "open_loop" in data:
        OPEN_LOOP.merge(data["open_loop"])


@events.init.add_listener
def remember_environment(environment, **_):
    ENVIRONMENT.append(environment)


@events.quit.add_listener
def write_final_reports(exit_code, **_):
    """Runs after the users stopped (and a master got its workers' last reports), unlike Locust's CSV writer,
    whose last rewrite of _stats.csv may be up to a second before the end."""
    environment = ENVIRONMENT[-1] if ENVIRONMENT else None
    options = environment.parsed_options if environment else None
    if options is None or isinstance(environment.runner, WorkerRunner):
        return
    if options.final_stats:
        Path(options.final_stats).write_text(json.dumps(stats_snapshot(environment.stats), indent=2) + "\n")
    if options.open_loop_report and OPEN_LOOP.scheduled:
        summary = OPEN_LOOP.summary(options.rate)
        summary["arrivals"] = options.arrivals
        summary["distributed"] = isinstance(environment.runner, MasterRunner)
        Path(options.open_loop_report).write_text(json.dumps(summary, indent=2) + "\n")
