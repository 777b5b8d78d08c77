"""Locust user for ``generator``: streamed generations timed to the first token and to the last.

    PYTHONPATH=. locust -f loadtests/generator_user.py --headless -H http://127.0.0.1:8080 -u 4 -t 60s GeneratorUser

A streamed request is reported as two Locust entries, so that both get their own percentiles:

- ``generator stream: first token``: from sending the request to the first NDJSON line carrying text;
- ``generator stream: total``: from sending it to the final line (``"done": true``, with the token counts).

A smaller share of plain (non-streamed) requests goes through Locust's client as ``generator plain``. Every answer is
checked (status, NDJSON shape, ``done`` last, token count) and a wrong one is a failure. Importing this module
registers nothing: settings are class attributes (subclass to change them). Against a server with token
authorization set ``$TS_INFERENCE_TOKEN`` to the inference key (e.g. ``jq -r .inference.key .run/key_file.json``):
every request then carries ``Authorization: Bearer <key>``.
"""

import json
import os
import random
import time

import requests
from locust import HttpUser, constant, task

from scripts.ops import auth

FIRST_TOKEN = "generator stream: first token"
TOTAL = "generator stream: total"
PLAIN = "generator plain"


class GeneratorUser(HttpUser):
    """Closed loop: one generation after another (streamed 3 times out of 4)."""

    wait_time = constant(0)
    path = "/predictions/generator"
    prompts = (
        "Hello world",
        "Once upon a time there was a small model",
        "The quick brown fox jumps over the lazy dog.",
        "What is the answer? It is",
    )
    max_new_tokens = 32
    temperature = 0.8
    top_k = 50

    def on_start(self):
        self.rng = random.Random()
        # Streamed requests use their own session: Locust's client would record one entry per request (at the
        # response headers), where we want the first-token and total times as two entries of our own.
        self.stream_session = requests.Session()
        token_headers = auth.bearer(os.environ.get(auth.TOKEN_ENV))
        self.stream_session.headers.update(token_headers)
        self.client.headers.update(token_headers)

    def on_stop(self):
        self.stream_session.close()

    def body(self, stream):
        return {
            "prompt": self.rng.choice(self.prompts),
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "seed": self.rng.randrange(2**31),
            "stream": stream,
        }

    def report(self, name, started, length, error):
        self.environment.events.request.fire(
            request_type="POST",
            name=name,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=length,
            exception=error,
            context={},
        )

    @task(3)
    def streamed(self):
        started = time.perf_counter()
        first_token_reported, received, lines = False, 0, []
        try:
            with self.stream_session.post(
                self.host + self.path, json=self.body(stream=True), stream=True, timeout=120
            ) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
                for line in response.iter_lines():
                    if not line:
                        continue
                    received += len(line) + 1
                    lines.append(json.loads(line))
                    if not first_token_reported and lines[-1].get("text"):
                        self.report(FIRST_TOKEN, started, received, None)
                        first_token_reported = True
            check_stream(lines, self.max_new_tokens)
        except Exception as error:  # any failure is reported under both names, never silently dropped
            if not first_token_reported:
                self.report(FIRST_TOKEN, started, received, error)
            self.report(TOTAL, started, received, error)
            return
        if not first_token_reported:  # no text at all (e.g. an immediate stop token): the end is the first token
            self.report(FIRST_TOKEN, started, received, None)
        self.report(TOTAL, started, received, None)

    @task(1)
    def plain(self):
        with self.client.post(self.path, json=self.body(stream=False), name=PLAIN, catch_response=True) as response:
            try:
                answer = response.json()
                if response.status_code != 200 or not isinstance(answer.get("text"), str):
                    raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
                if not 1 <= answer["completion_tokens"] <= self.max_new_tokens:
                    raise ValueError(f"completion_tokens {answer['completion_tokens']} out of range")
            except (ValueError, KeyError) as error:
                response.failure(str(error))


def check_stream(lines, max_new_tokens):
    """A streamed answer is NDJSON: text lines with done=false, then exactly one final line with the counts."""
    if not lines or lines[-1].get("done") is not True:
        raise ValueError("stream ended without a final line (done: true)")
    if any(line.get("done") is not False for line in lines[:-1]):
        raise ValueError("a line before the last one says done")
    final = lines[-1]
    if "code" in final:
        raise ValueError(f"stream ended with an error: {final.get('message')}")
    if not 1 <= final.get("completion_tokens", 0) <= max_new_tokens:
        raise ValueError(f"completion_tokens {final.get('completion_tokens')} out of range")
