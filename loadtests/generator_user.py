"""Locust users for ``generator``: generations timed to the first token, between tokens, and to the last.

    PYTHONPATH=. locust -f loadtests/generator_user.py --headless -H http://127.0.0.1:8080 -u 4 -t 60s GeneratorUser

Both users run a closed loop with a mix of lengths (``max_new_tokens`` drawn from 8 ... 256) and stream 3 requests out
of 4; they differ in the API they speak:

- ``GeneratorUser``: the native API (``POST /predictions/generator``, NDJSON stream);
- ``CompletionsUser``: OpenAI's completions (``POST .../v1/completions``, server-sent events), which every server in
  the comparison speaks (loadtests/generator_compare.py sets its path and model name through
  ``$GENERATOR_COMPLETIONS_PATH`` and ``$GENERATOR_MODEL``).

A streamed request is reported as two Locust entries, ``generator stream: first token`` (to the first piece of text)
and ``generator stream: total`` (to the end); a plain one as ``generator plain``. Every answer is checked (status,
framing, the last piece, the token count) and a wrong one is a failure. With ``$GENERATOR_SAMPLES`` set to a file,
each finished request also appends one JSON line there: its exact times (first token, every gap between two pieces,
total), its token count and whether it succeeded; the comparison computes its percentiles from these, not from
Locust's rounded buckets. With ``$GENERATOR_SCHEMA_SHARE`` set (0 ... 1, e.g. 0.2) that share of the requests asks
for a JSON document by ``response_format`` (loadtests/generator_schema.py: a bounded schema, ``max_tokens`` 256 to
close it); each such answer is parsed and validated against the schema with ``jsonschema``, and its sample says
whether it was valid (an invalid one is counted, not a Locust failure, so the report can say valid / total).
Importing this module registers nothing: settings are class attributes (subclass to change them). Against a server
with token authorization set ``$TS_INFERENCE_TOKEN`` to the inference key, or ``$TS_KEY_FILE`` to TorchServe's key file
(re-read when it changes: keys rotated during the run are followed): every request then carries
``Authorization: Bearer <key>``.
"""

import json
import os
import random
import time

import requests
from locust import HttpUser, constant, task

from loadtests.generator_schema import CONSTRAINED_MAX_TOKENS, REVIEW_FORMAT, schema_error
from scripts.ops import auth

FIRST_TOKEN = "generator stream: first token"
TOTAL = "generator stream: total"
PLAIN = "generator plain"
SAMPLES_ENV = "GENERATOR_SAMPLES"
MAX_NEW_TOKENS = (8, 16, 32, 64, 128, 256)  # drawn uniformly: half the requests are short, a third long
SCHEMA_SHARE_ENV = "GENERATOR_SCHEMA_SHARE"


class Generation:
    """What one request received: pieces of text with their arrival times, the end, the token count."""

    def __init__(self, started, stream, max_new_tokens, constrained=False):
        self.started = started
        self.stream = stream
        self.max_new_tokens = max_new_tokens
        self.constrained = constrained  # asked for REVIEW_FORMAT
        self.piece_times = []
        self.pieces = []  # the text, kept only when it is to be validated
        self.text = None  # a plain answer's text
        self.tokens = None
        self.bytes = 0

    def piece(self, text):
        if text:
            self.piece_times.append(time.perf_counter())
            if self.constrained:
                self.pieces.append(text)

    def sample(self, ended, error):
        times = self.piece_times
        return {
            "started": self.started,
            "ended": ended,
            "stream": self.stream,
            "max_new_tokens": self.max_new_tokens,
            "tokens": self.tokens,
            "first_token_s": times[0] - self.started if self.stream and times else None,
            "gaps_s": [times[i + 1] - times[i] for i in range(len(times) - 1)] if self.stream else [],
            "total_s": ended - self.started,
            "error": None if error is None else str(error)[:300],
            "constrained": self.constrained,
            # a constrained answer that arrived: None when valid against the schema, else why not
            "schema_error": schema_error(self.text_received()) if self.constrained and error is None else None,
        }

    def text_received(self):
        return "".join(self.pieces) if self.stream else (self.text or "")


class GenerationUser(HttpUser):
    """The shared loop: a request, its checks, its Locust entries and its sample; subclasses frame the API."""

    abstract = True
    wait_time = constant(0)
    prompts = (
        "Hello world",
        "Once upon a time there was a small model",
        "The quick brown fox jumps over the lazy dog.",
        "What is the answer? It is",
    )
    max_new_tokens_choices = MAX_NEW_TOKENS
    schema_share = float(os.environ.get(SCHEMA_SHARE_ENV) or 0.0)  # share of requests with REVIEW_FORMAT
    temperature = 0.8
    top_k = 50

    def on_start(self):
        self.rng = random.Random()
        # Streamed requests use their own session: Locust's client would record one entry per request (at the
        # response headers), where we want the first-token and total times as two entries of our own.
        self.stream_session = requests.Session()
        self.keys = auth.KeySource.from_environment(os.environ.get(auth.TOKEN_ENV))
        self.samples_path = os.environ.get(SAMPLES_ENV)

    def on_stop(self):
        self.stream_session.close()

    def report(self, name, started, length, error):
        self.environment.events.request.fire(
            request_type="POST",
            name=name,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=length,
            exception=error,
            context={},
        )

    def record(self, generation, error):
        if self.samples_path:
            with open(self.samples_path, "a", encoding="utf-8") as samples:
                samples.write(json.dumps(generation.sample(time.perf_counter(), error)) + "\n")

    def new_generation(self, stream):
        """The next request's plan: constrained (REVIEW_FORMAT, room to close it) for schema_share of them."""
        if self.rng.random() < self.schema_share:
            return Generation(time.perf_counter(), stream, CONSTRAINED_MAX_TOKENS, constrained=True)
        return Generation(time.perf_counter(), stream, self.rng.choice(self.max_new_tokens_choices))

    @task(3)
    def streamed(self):
        generation = self.new_generation(True)
        first_reported, error = False, None
        try:
            with self.stream_session.post(
                self.host + self.path, json=self.body(generation), headers=self.keys.headers(), stream=True, timeout=600
            ) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
                for line in response.iter_lines():
                    if not line:
                        continue
                    generation.bytes += len(line) + 1
                    self.read_line(line, generation)
                    if generation.piece_times and not first_reported:
                        self.report(FIRST_TOKEN, generation.started, generation.bytes, None)
                        first_reported = True
            self.check_end(generation)
        except Exception as failure:  # any failure is reported under both names, never silently dropped
            error = failure
        if not first_reported:  # no text at all (an immediate stop, or a failure): the end is the first token
            self.report(FIRST_TOKEN, generation.started, generation.bytes, error)
        self.report(TOTAL, generation.started, generation.bytes, error)
        self.record(generation, error)

    @task(1)
    def plain(self):
        generation = self.new_generation(False)
        error = None
        with self.client.post(
            self.path, json=self.body(generation), headers=self.keys.headers(), name=PLAIN, catch_response=True
        ) as response:
            try:
                if response.status_code != 200:
                    raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
                self.read_answer(response.json(), generation)
                check_tokens(generation)
            except (ValueError, KeyError, TypeError) as failure:
                error = failure
                response.failure(str(failure))
        self.record(generation, error)


def check_tokens(generation):
    if generation.tokens is None or not 1 <= generation.tokens <= generation.max_new_tokens:
        raise ValueError(f"completion tokens {generation.tokens} out of range 1..{generation.max_new_tokens}")


class GeneratorUser(GenerationUser):
    """The native API: a JSON body with ``prompt``; a streamed answer is NDJSON (``done`` on the last line)."""

    path = "/predictions/generator"

    def body(self, generation):
        return {
            "prompt": self.rng.choice(self.prompts),
            "max_new_tokens": generation.max_new_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "seed": self.rng.randrange(2**31),
            "stream": generation.stream,
            **({"response_format": REVIEW_FORMAT} if generation.constrained else {}),
        }

    def read_line(self, line, generation):
        parsed = json.loads(line)
        if getattr(generation, "final", None) is not None:
            raise ValueError("a line after the one that says done")
        if parsed.get("done") is not False:
            generation.final = parsed
        generation.piece(parsed.get("text"))

    def check_end(self, generation):
        final = getattr(generation, "final", None)
        if final is None or final.get("done") is not True:
            raise ValueError("stream ended without a final line (done: true)")
        if "code" in final:
            raise ValueError(f"stream ended with an error: {final.get('message')}")
        generation.tokens = final.get("completion_tokens")
        check_tokens(generation)

    def read_answer(self, answer, generation):
        if not isinstance(answer.get("text"), str):
            raise ValueError(f"no text in the answer: {str(answer)[:200]}")
        generation.text = answer["text"]
        generation.tokens = answer["completion_tokens"]


class CompletionsUser(GenerationUser):
    """OpenAI's completions: ``{"model", "prompt", "max_tokens", ...}``; a streamed answer is server-sent events, the
    last of them with a ``finish_reason`` (then ``data: [DONE]``, which OpenAI sends and transformers serve does not).
    The token count is the usage chunk's when the server sends one (``stream_options.include_usage``), else the
    pieces received."""

    path = os.environ.get("GENERATOR_COMPLETIONS_PATH", "/predictions/generator/1.0/v1/completions")
    model = os.environ.get("GENERATOR_MODEL", "generator")

    def body(self, generation):
        body = {
            "model": self.model,
            "prompt": self.rng.choice(self.prompts),
            "max_tokens": generation.max_new_tokens,
            "temperature": self.temperature,
            "seed": self.rng.randrange(2**31),
            "stream": generation.stream,
        }
        if generation.stream:
            body["stream_options"] = {"include_usage": True}
        if generation.constrained:
            body["response_format"] = REVIEW_FORMAT
        return body

    def read_line(self, line, generation):
        if not line.startswith(b"data: "):
            return
        data = line[len(b"data: ") :]
        if data == b"[DONE]":
            generation.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise ValueError(f"stream ended with an error: {str(chunk['error'])[:200]}")
        if chunk.get("usage"):
            generation.tokens = chunk["usage"].get("completion_tokens")
        for choice in chunk.get("choices") or []:
            generation.piece(choice.get("text"))
            if choice.get("finish_reason"):
                generation.finish_reason = choice["finish_reason"]

    def check_end(self, generation):
        if not getattr(generation, "done", False) and not getattr(generation, "finish_reason", None):
            raise ValueError("stream ended without a finish_reason or data: [DONE]")
        if generation.tokens is None:
            generation.tokens = len(generation.piece_times)
        check_tokens(generation)

    def read_answer(self, answer, generation):
        choices = answer.get("choices") or []
        if not choices or not isinstance(choices[0].get("text"), str):
            raise ValueError(f"no choices[0].text in the answer: {str(answer)[:200]}")
        generation.text = choices[0]["text"]
        generation.tokens = (answer.get("usage") or {}).get("completion_tokens")
