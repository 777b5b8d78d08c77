"""The network comparison's systems (loadtests/compare.py --model <network>): each a context manager that builds what
it needs, starts the server on free loopback ports, checks that it answers as the module in process does (parity),
yields (inference URL, metrics URL or None, what it runs) and stops it afterwards.

  torchserve-network  TorchServe 0.12 with its BaseHandler on the TorchScript trace (network_torchserve_handler.py:
             the stock handler with preprocess / inference / postprocess for JSON tensors), TorchServe's batching
  litserve   LitServe (build/litserve-venv) running model.pt2 in a LitAPI (litserve_app.py), its batching on
  pytriton   Triton Inference Server through PyTriton (build/pytriton-venv) running model.pt2 (pytriton_app.py),
             its dynamic batcher on; sent tritonclient.http's binary-extension requests
  ours       this project's network engine on model.pt2, packaged as a user would (gated, ranked backends)
  ours-fp32  the same pinned to fp32: the same precision as the peers
  ours-json  ours' archive as packaged, sent the project's short JSON form to /predictions/<network> instead of OIP
             binary: what the client pays per request differs (Locust shares the cores), the server is the same
  inprocess  the ceiling: model.pt2 called in a loop in this process at the best batch size (:func:`ceiling`)
  ideal      ours' archive in the ideal batcher (loadtests/baselines/ideal.py): no HTTP, no frontend

Every peer gets the network's batching (loadtests/networks.py: max batch and delay, the same for all) and the
machine's cores as torch threads (TorchServe: cores / workers per worker, as TorchServe spreads them).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import requests

from loadtests import network_traffic, networks
from loadtests.baselines import baseline_env
from loadtests.baselines.systems import describe_torchserve, subprocess_server
from scripts import package
from scripts.ops import machine
from scripts.ops.server import free_ports, private_server

REPO = Path(__file__).resolve().parents[2]
BASELINES = REPO / "loadtests" / "baselines"
TORCHSERVE_WORKERS = 2  # TorchServe's default, one per core on this 2-core machine; threads split between them
NETWORK_SYSTEMS = ("ours", "ours-fp32", "ours-json", "torchserve-network", "litserve", "pytriton", "inprocess", "ideal")
# The request format each system is sent (loadtests/network_traffic.py); ours speaks OIP, measured with Triton's client,
# and its native JSON form (what curl users send; a body as cheap to build as the stock handler's).
FORMATS = {
    "ours": "oip",
    "ours-fp32": "oip",
    "ours-json": "native",
    "pytriton": "oip",
    "litserve": "litserve",
    "torchserve-network": "torchserve",
}
PARITY_REQUESTS = 3
MAX_JSON_BYTES = 64 * 1024 * 1024
_REFERENCE_MODULES: dict[str, object] = {}


def traffic_for(system: str, network_name: str) -> str:
    """The traffic name (loadtests/payloads.py) system ``system`` is sent for the network."""
    return network_traffic.traffic_name(network_name, FORMATS[system])


def reference_module(name: str):
    if name not in _REFERENCE_MODULES:
        _REFERENCE_MODULES[name] = networks.build_module(name)
    return _REFERENCE_MODULES[name]


def served_answer(url: str, spec: networks.Network, form: str, tensors) -> dict[str, np.ndarray]:
    """One request through the system's real client: tritonclient.http (defaults: binary tensors) for OIP, an HTTP
    POST of the form's JSON body otherwise, its answer read by the form's reader."""
    if form == "oip":
        import tritonclient.http as triton_http
        from tritonclient.utils import np_to_triton_dtype

        inputs = []
        for name, array in tensors.items():
            tensor = triton_http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        client = triton_http.InferenceServerClient(url.removeprefix("http://"), network_timeout=120.0)
        try:
            result = client.infer(spec.name, inputs)
        finally:
            client.close()
        return {spec.output: result.as_numpy(spec.output)}
    response = requests.post(
        f"{url}{network_traffic.path_of(spec, form)}", json=network_traffic.encode(tensors, form), timeout=120
    )
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
    return network_traffic.decode(form)(response.content, response.headers)


def check_parity(system: str, url: str, spec: networks.Network, log) -> dict:
    """A few random requests (not the load test's) through the system against the module in process; raises
    RuntimeError naming the first difference, so a system that computes something else is never measured."""
    requests_sent = network_traffic.parity_requests(spec.name, PARITY_REQUESTS)
    expected = network_traffic.reference_answers(spec, reference_module(spec.name), requests_sent)
    for number, (tensors, reference) in enumerate(zip(requests_sent, expected, strict=True), 1):
        reason = network_traffic.judge(
            reference, served_answer(url, spec, FORMATS[system], tensors), tolerance=spec.tolerance
        )
        if reason:
            raise RuntimeError(f"{system} fails parity on request {number}: {reason}")
    log(f"  parity: {len(requests_sent)} requests answered as the module in process (within {spec.tolerance:g})")
    return {"parity": f"{len(requests_sent)} requests within {spec.tolerance:g} of the module in process"}


def http_ready(path: str, seconds: float = 5.0):
    """subprocess_server's readiness probe: GET ``path`` answers 200 within ``seconds``, else RuntimeError."""

    def ready(url):
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                if requests.get(f"{url}{path}", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{url}{path} not ready")

    return ready


def batching(spec: networks.Network) -> dict:
    return {"batch_size": spec.max_batch, "max_batch_delay_ms": spec.batch_delay_ms}


def build_torchserve_archive(spec: networks.Network, folder: Path, store: Path, log) -> Path:
    """store/<network>.mar: the handler, the TorchScript trace, network.json and the batching; reused while the
    folder's build and the handler are unchanged."""
    digest = json.loads((folder / networks.RECORD).read_text())["source"]
    digest += (BASELINES / "network_torchserve_handler.py").read_text()
    stamp = store / f".{spec.name}.built"
    if (store / f"{spec.name}.mar").exists() and stamp.exists() and stamp.read_text() == digest:
        return store
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="network-torchserve-") as staging:
        files = Path(staging) / "files"
        files.mkdir()
        shutil.copy2(folder / networks.RECORD, files / networks.RECORD)
        config = Path(staging) / "model-config.yaml"
        config.write_text(
            f"minWorkers: {TORCHSERVE_WORKERS}\nmaxWorkers: {TORCHSERVE_WORKERS}\nbatchSize: {spec.max_batch}\n"
            f"maxBatchDelay: {spec.batch_delay_ms:g}\nresponseTimeout: 120\nstartupTimeout: 300\n"
        )
        try:
            package.run_archiver(
                spec.name,
                "1.0",
                BASELINES / "network_torchserve_handler.py",
                files,
                config,
                store,
                serialized_file=folder / networks.TORCHSCRIPT,
            )
        except package.PackagingError as error:
            raise RuntimeError(f"TorchServe network baseline: {error}") from None
    stamp.write_text(digest)
    log(f"  built {store / (spec.name + '.mar')} (BaseHandler, TorchScript, batch {spec.max_batch})")
    return store


@contextlib.contextmanager
def torchserve_network(spec, folder, log_dir, log):
    store = build_torchserve_archive(spec, folder, REPO / "build" / "compare" / "network-store", log)
    threads = max(1, machine.cores() // TORCHSERVE_WORKERS)
    env = {"OMP_NUM_THREADS": str(threads)}
    # One image as JSON is ~3 MB, over the project's 1 MiB request limit: raised as a TorchServe user serving such
    # tensors raises it.
    sizes = {"max_request_size": str(MAX_JSON_BYTES), "max_response_size": str(MAX_JSON_BYTES)}
    name = f"compare-network-{spec.name}"
    with private_server(name, store, [spec.name], overrides=sizes, env=env, keep_logs_in=log_dir) as server:
        info = {**describe_torchserve(server, spec.name), "backend": "torchscript", "threads": threads}
        info.update(check_parity("torchserve-network", server.inference_url, spec, log))
        yield server.inference_url, server.metrics_url, {**info, "precision": "fp32"}


@contextlib.contextmanager
def litserve(spec, folder, log_dir, log):
    python = baseline_env.ENVS["litserve"].ensure(log=log)
    command = [str(python), str(BASELINES / "litserve_app.py"), "--folder", str(folder), "--port", "{port}"]
    command += ["--max-batch-size", str(spec.max_batch), "--batch-timeout-ms", str(spec.batch_delay_ms)]
    command += ["--threads", str(machine.cores())]
    with subprocess_server(command, "litserve", log_dir, None, ready=http_ready("/health")) as url:
        info = {"precision": "fp32", "backend": "litserve, torch.export module", "threads": machine.cores()}
        info.update(check_parity("litserve", url, spec, log))
        yield url, None, {**info, **batching(spec), "workers": 1}


def library_dir(python: Path) -> str:
    """The library folder of a venv's Python (sysconfig's LIBDIR: where its own libpython3.11.so lies)."""
    command = [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@contextlib.contextmanager
def pytriton(spec, folder, log_dir, log):
    python = baseline_env.ENVS["pytriton"].ensure(log=log)
    grpc_port, metrics_port = free_ports(2)
    command = [str(python), str(BASELINES / "pytriton_app.py"), "--folder", str(folder), "--http-port", "{port}"]
    command += ["--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    command += ["--max-batch-size", str(spec.max_batch), "--max-queue-delay-ms", str(spec.batch_delay_ms)]
    command += ["--threads", str(machine.cores())]
    # Triton's Python backend stub links libpython3.11; the system's copy (another 3.11 patch release) on the path
    # fails the model's load with "'_thread.RLock' object has no attribute '_recursion_count'".
    env = {"LD_LIBRARY_PATH": library_dir(python)}
    ready = http_ready(f"/v2/models/{spec.name}/ready")
    with subprocess_server(command, "pytriton", log_dir, None, python_env=env, ready=ready) as url:
        info = {
            "precision": "fp32",
            "backend": "triton python backend, torch.export module",
            "threads": machine.cores(),
        }
        info.update(check_parity("pytriton", url, spec, log))
        yield url, f"http://127.0.0.1:{metrics_port}/metrics", {**info, **batching(spec), "workers": 1}


OURS_STORES = {None: "network-ours-store", "fp32": "network-ours-fp32-store"}


def package_ours(spec, folder, log, precision=None) -> Path:
    """``folder`` (model.pt2) packaged as a user would (`make package`: the network template, its compiled backends
    built, gated and ranked on this machine) with the network's batching; ``precision`` pins the handler's precision
    (fp32: the same-precision comparison) instead of the gated winner. Returns the store holding <network>.mar (the
    packaging step reuses an archive whose inputs did not change)."""
    store = REPO / "build" / "compare" / OURS_STORES[precision]
    overrides = {"batchSize": spec.max_batch, "maxBatchDelay": max(1, round(spec.batch_delay_ms))}
    if precision:
        overrides["handler.precision"] = precision
    try:
        package.build(
            "network-model",
            store,
            variables={"model_dir": str(folder)},
            log=log,
            model_name=spec.name,
            overrides=overrides,
        )
    except package.PackagingError as error:
        raise RuntimeError(f"packaging {spec.name} for ours: {error}") from None
    return store


@contextlib.contextmanager
def serve_ours(spec, folder, log_dir, log, precision=None, system="ours"):
    """This project's network path on ``folder``, served by the project's own config (request size raised as for
    the stock handler), asked in ``system``'s format (FORMATS: OIP with tritonclient's binary tensors, or the native
    JSON form)."""
    store = package_ours(spec, folder, log, precision)
    sizes = {"max_request_size": str(MAX_JSON_BYTES), "max_response_size": str(MAX_JSON_BYTES)}
    name = f"compare-ours-{spec.name}" + (f"-{precision}" if precision else "")
    with private_server(name, store, [spec.name], overrides=sizes, keep_logs_in=log_dir) as server:
        info = {**describe_torchserve(server, spec.name), **server.management().handler_choices(spec.name)}
        info.update(check_parity(system, server.inference_url, spec, log))
        yield server.inference_url, server.metrics_url, {**info, **batching(spec)}


def ours(spec, folder, log_dir, log):
    """Ours as packaged: the backend and precision its gate and ranking chose on this machine."""
    return serve_ours(spec, folder, log_dir, log)


def ours_fp32(spec, folder, log_dir, log):
    """Ours pinned to fp32 (its fastest fp32 backend that passes the gate): the same precision as every peer."""
    return serve_ours(spec, folder, log_dir, log, precision="fp32")


def ours_json(spec, folder, log_dir, log):
    """Ours as packaged, sent the native JSON form: the same server, a body as cheap for the client as JSON is."""
    return serve_ours(spec, folder, log_dir, log, system="ours-json")


def ideal(network_name: str, slo_ms: float, search: dict, out_dir: Path, log) -> dict:
    """The ideal batcher (ideal.py) on ours' archive: the same handler, workers and batching, the same OIP binary
    bodies, no HTTP and no frontend."""
    from loadtests.baselines import ideal as ideal_batcher

    spec = networks.network(network_name)
    store = package_ours(spec, networks.build_folder(network_name, log=log), log)
    traffic = traffic_for("ours", network_name)
    return ideal_batcher.ideal_capacity(store / f"{spec.name}.mar", traffic, slo_ms, out_dir, log=log, **search)


STARTERS = {
    "ours": ours,
    "ours-fp32": ours_fp32,
    "ours-json": ours_json,
    "torchserve-network": torchserve_network,
    "litserve": litserve,
    "pytriton": pytriton,
}


def start(system: str, network_name: str, out_dir: Path, log):
    """The context manager running ``system`` on the network's folder (built first when missing)."""
    spec = networks.network(network_name)
    folder = networks.build_folder(network_name, log=log)
    return STARTERS[system](spec, folder, Path(out_dir) / system, log)


def ceiling(network_name: str, seconds: float, batch_sizes, log) -> dict:
    """The in-process ceiling: model.pt2's module called back to back at each batch size for ``seconds``; rows per
    second at the best, and one row's forward time (no HTTP, no queue, no batching delay)."""
    import torch

    spec = networks.network(network_name)
    folder = networks.build_folder(network_name, log=log)
    module = torch.export.load(str(folder / networks.PROGRAM)).module()
    rng = np.random.default_rng(networks.SEED)
    results = []
    for rows in batch_sizes:
        inputs = networks.as_tensors(network_traffic.draw_request(spec, rng, rows))
        with torch.inference_mode():
            module(*inputs)  # warm-up
            started, calls = time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                module(*inputs)
                calls += 1
        elapsed = time.perf_counter() - started
        results.append(
            {
                "batch_size": rows,
                "requests_per_s": round(rows * calls / elapsed, 2),
                "forward_ms": round(1000 * elapsed / calls, 3),
            }
        )
        log(f"  in process, batch {rows}: {results[-1]['requests_per_s']} rows/s")
    best = max(results, key=lambda result: result["requests_per_s"])
    single = next((result for result in results if result["batch_size"] == 1), None)
    return {
        "best": best,
        "results": results,
        "precision": "fp32",
        "backend": "torch.export module",
        "threads": torch.get_num_threads(),
        "raw_forward_ms": single["forward_ms"] if single else None,
    }
