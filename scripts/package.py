"""Build model archives (.mar) from the declarative specs in models/<name>/model.yaml.

For each model: run its `prepare` step when an output is missing or one of its inputs changed (training, export),
validate its model-config.yaml (TorchServe's keys and our `handler:` section), stage the whole handlers package (its
subpackages included) and the listed files, and run torch-model-archiver. An archive whose inputs (spec, config, every
file of the handlers package, files, pinned requirements) did not change is not rebuilt: model_store/manifest.json
records each archive's version and input hash. A model-config.yaml may hold `per_cpu_kind:`, TorchServe keys per kind
of CPU (the tuner's values differ between AVX2 and native-bf16 machines): the archive is packed with the overrides of
the kind it is built for (this machine's, or --cpu-kind) and without the section.

config/metrics.yaml (the metrics TorchServe exports) is generated from handlers/core/metrics.py: every build rewrites
it when it is out of step, `--metrics` only does that.

Examples:
    python -m scripts.package                      # every model into model_store/
    python -m scripts.package classifier --force   # rebuild one
    python -m scripts.package classifier --version 2.0 --var seed=1   # a retrained 2.0 -> classifier-2.0.mar
    python -m scripts.package --list
    python -m scripts.package minilm --cpu-kind avx2   # per_cpu_kind values of another CPU kind (for an image)
    python -m scripts.package text-model --name my-model --var model_dir=/path --config maxWorkers=4
    python -m scripts.package --metrics            # regenerate config/metrics.yaml only
Exit codes: 0 built or up to date, 1 a build or validation failed, 2 bad arguments.
"""

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from handlers.core import identity
from scripts.ops import machine

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO / "models"
HANDLERS_DIR = REPO / "handlers"
MANIFEST_NAME = "manifest.json"
METRICS_CONFIG = REPO / "config" / "metrics.yaml"

# TorchServe's own model-config.yaml keys and their types (anything else must live under `handler:`).
TORCHSERVE_KEYS = {
    "minWorkers": int,
    "maxWorkers": int,
    "batchSize": int,
    "maxBatchDelay": int,
    "responseTimeout": int,
    "startupTimeout": int,
    "deviceType": str,
    "deviceIds": list,
    "parallelType": str,
    "parallelLevel": int,
    "maxRetryTimeoutInSec": int,
    "clientTimeoutInMills": int,
    "jobQueueSize": int,
    "useJobTicket": bool,
    "continuousBatching": bool,
    "sequenceMaxIdleMSec": int,
    "maxSequenceJobQueueSize": int,
    "maxNumSequence": int,
}
# `per_cpu_kind:` holds the tuner's TorchServe keys per kind of CPU (scripts/ops/machine.py CPU_KINDS): the archive is
# packed with the base keys plus the overrides of the kind it is built for, and without the section (packed_config).
OUR_SECTIONS = {"handler", "per_cpu_kind"}
# Seconds of startupTimeout a worker needs at least, by backend (load + accuracy gate + warm-up on 2 cores). auto may
# load and gate more than one candidate before one serves (each prebuilt one takes seconds), then falls back to eager.
MIN_STARTUP_SECONDS = {"eager": 30, "jit": 240, "aot": 60, "openvino": 60, "auto": 60}


class PackagingError(Exception):
    """A model that cannot be built; the message says which file and key."""


def load_spec(name):
    path = MODELS_DIR / name / "model.yaml"
    if not path.is_file():
        known = ", ".join(all_model_names()) or "none"
        raise PackagingError(f"no model named {name!r} (looked for {path.relative_to(REPO)}; known: {known})")
    spec = yaml.safe_load(path.read_text()) or {}
    for key in ("name", "version", "handler", "config"):
        if key not in spec:
            raise PackagingError(f"{path.relative_to(REPO)}: missing key {key!r}")
    spec["dir"] = path.parent
    spec["spec_path"] = path
    return spec


def check_model_name(name):
    """A model name TorchServe routes and a file name: letters, digits, '-', '_' and '.', not starting with '.'."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise PackagingError(
            f"--name {name!r}: use 1-64 letters, digits, '-', '_' or '.', starting with a letter or digit "
            f"(it becomes the archive's file name and the /predictions/<name> path)"
        )


def all_model_names(include_optional=False):
    """Model specs under models/; a spec with `optional: true` (slow to build, e.g. an AOT variant) is built only
    when named, so `make mar` and the test session stay fast."""
    names = sorted(p.parent.name for p in MODELS_DIR.glob("*/model.yaml"))
    if include_optional:
        return names
    specs = {n: yaml.safe_load((MODELS_DIR / n / "model.yaml").read_text()) or {} for n in names}
    return [n for n in names if not specs[n].get("optional") and not specs[n].get("template")]


def template_for(model_dir):
    """The template `make package` builds a user's folder with: network-model for a PyTorch network's folder (model.pt2,
    TorchScript or model code, no transformers config.json: scripts/prepare_network_model.py), image-model for an
    image model's folder (what handlers/image/kinds reads from it), generator for a causal LM's (a transformers
    folder whose config.json names a causal-LM architecture and that is not a sentence-transformers model: a decoder
    trained as an embedding model is a text model), else text-model (which reads the text kinds, and refuses what is
    neither)."""
    from handlers.image.kinds import is_image_folder
    from scripts.prepare_network_model import is_network_folder

    if is_network_folder(model_dir):
        return "network-model"
    if is_image_folder(model_dir):
        return "image-model"
    return "generator" if is_causal_lm_folder(model_dir) else "text-model"


def is_causal_lm_folder(model_dir):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    folder = Path(model_dir)
    if (folder / "modules.json").exists():
        return False
    try:
        architectures = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    causal = {name for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
              for name in ((names,) if isinstance(names, str) else names)}  # fmt: skip
    return any(name in causal for name in architectures)


def handler_class(handler_path):
    """Import the handler module named by the spec and return the one handler class it defines."""
    from scripts.ops.registry import entry_class

    try:
        return entry_class(handler_path)
    except ValueError as error:
        raise PackagingError(str(error)) from None


def validate_model_config(spec, cpu_kind=None, overrides=None):
    """Check the model-config.yaml that will be packed (for ``cpu_kind``, default this machine's; with ``overrides``
    of --config): TorchServe keys, types, our handler section, timeouts. Returns the config as packed."""
    from handlers.core.config import ConfigError, validate

    path = spec["dir"] / spec["config"]
    where = path.relative_to(REPO)
    config = yaml.safe_load(path.read_text()) or {}
    if not isinstance(config, dict):
        raise PackagingError(f"{where}: must be a mapping")
    config = with_overrides(config, overrides or {}, where)
    config = packed_config(config, cpu_kind or machine.cpu_kind(), where)
    try:
        handler_config = validate(config.get("handler"), handler_class(spec["handler"]).options)
    except ConfigError as error:
        raise PackagingError(f"{where}: {error}") from None
    needed = MIN_STARTUP_SECONDS[handler_config["backend"]]
    if config["startupTimeout"] < needed:
        raise PackagingError(
            f"{where}: startupTimeout {config['startupTimeout']}s is too short for load and warm-up "
            f"with backend={handler_config['backend']} (needs >= {needed}s)"
        )
    return config


def with_overrides(config, overrides, where):
    """The config with --config KEY=VALUE values set: a TorchServe key (minWorkers=1) or a handler option
    (handler.max_inputs=32); values are YAML (numbers, true/false, lists). Unknown keys are refused by the checks."""
    config = {**config, "handler": dict(config.get("handler") or {})}
    for key, value in overrides.items():
        if key.startswith("handler."):
            config["handler"][key.removeprefix("handler.")] = value
        elif key in OUR_SECTIONS:
            raise PackagingError(f"--config {key}: set one of its keys (handler.KEY=VALUE), not the whole section")
        else:
            config[key] = value
    return config


def parse_overrides(items):
    """--config KEY=VALUE items -> {key: value parsed as YAML}."""
    overrides = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise PackagingError(f"--config wants KEY=VALUE, got {item!r}")
        try:
            overrides[key] = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise PackagingError(f"--config {key}: {text!r} is not a value ({error})") from None
    return overrides


def packed_config(config, cpu_kind, where):
    """The config with the ``per_cpu_kind`` overrides of ``cpu_kind`` merged in and the section removed, checked."""
    per_kind = config.get("per_cpu_kind") or {}
    if not isinstance(per_kind, dict):
        raise PackagingError(f"{where}: per_cpu_kind must map a CPU kind to TorchServe keys")
    unknown = sorted(set(per_kind) - set(machine.CPU_KINDS))
    if unknown or cpu_kind not in machine.CPU_KINDS:
        raise PackagingError(
            f"{where}: unknown CPU kind(s) {unknown or [cpu_kind]}; kinds are {list(machine.CPU_KINDS)}"
        )
    packed = {key: value for key, value in config.items() if key != "per_cpu_kind"}
    for kind, overrides in per_kind.items():
        if not isinstance(overrides, dict) or set(overrides) & OUR_SECTIONS:
            raise PackagingError(f"{where}: per_cpu_kind.{kind} must map TorchServe keys to values")
        check_torchserve_keys({**packed, **overrides}, f"{where} (per_cpu_kind.{kind})")
    packed.update(per_kind.get(cpu_kind) or {})
    check_torchserve_keys(packed, where)
    return packed


def check_torchserve_keys(config, where):
    """TorchServe's own keys: known, of their type, the ones the archive must pin present and consistent."""
    for key, value in config.items():
        if key in OUR_SECTIONS:
            continue
        if key not in TORCHSERVE_KEYS:
            raise PackagingError(
                f"{where}: unknown key {key!r} (TorchServe keys: {sorted(TORCHSERVE_KEYS)}; "
                f"handler options go under 'handler:')"
            )
        wanted = TORCHSERVE_KEYS[key]
        if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            raise PackagingError(f"{where}: {key} must be {wanted.__name__}, got {value!r}")
        if wanted is int and value < 0:
            raise PackagingError(f"{where}: {key} must not be negative, got {value}")
    for key in ("batchSize", "maxBatchDelay", "responseTimeout", "startupTimeout", "minWorkers", "maxWorkers"):
        if key not in config:
            raise PackagingError(f"{where}: missing {key} (set it explicitly: the archive's config wins at run time)")
    check_batching(config, where)


def check_batching(config, where):
    """Values TorchServe would take but serve otherwise than they read."""
    if config["batchSize"] < 1:
        raise PackagingError(f"{where}: batchSize must be at least 1")
    if config["maxBatchDelay"] == 0:
        # Seen with TorchServe 0.12: an archive's maxBatchDelay 0 is read back as its default, 100 ms of waiting.
        raise PackagingError(
            f"{where}: maxBatchDelay 0 in an archive's config is served as TorchServe's default 100 ms; use 1 "
            f"(or batchSize 1, which never waits), or pass max_batch_delay=0 when registering"
        )
    if config["minWorkers"] > config["maxWorkers"]:
        raise PackagingError(f"{where}: minWorkers ({config['minWorkers']}) > maxWorkers ({config['maxWorkers']})")


# TorchServe's own metrics, declared beside ours because the frontend reads one file (as in its default metrics.yaml).
TORCHSERVE_METRICS = {
    "counter": [
        ("Requests2XX", "Count", ["Level", "Hostname"]),
        ("Requests4XX", "Count", ["Level", "Hostname"]),
        ("Requests5XX", "Count", ["Level", "Hostname"]),
        ("ts_inference_requests_total", "Count", ["model_name", "model_version", "hostname"]),
        ("ts_inference_latency_microseconds", "Microseconds", ["model_name", "model_version", "hostname"]),
        ("ts_queue_latency_microseconds", "Microseconds", ["model_name", "model_version", "hostname"]),
    ],
    "gauge": [
        ("QueueTime", "Milliseconds", ["Level", "Hostname"]),
        ("WorkerThreadTime", "Milliseconds", ["Level", "Hostname"]),
        ("WorkerLoadTime", "Milliseconds", ["WorkerName", "Level", "Hostname"]),
        ("CPUUtilization", "Percent", ["Level", "Hostname"]),
        ("MemoryUsed", "Megabytes", ["Level", "Hostname"]),
    ],
}
# Model-level metrics TorchServe's Python worker records itself for every handler (ts/service.py).
TORCHSERVE_MODEL_METRICS = [("HandlerTime", "ms"), ("PredictionTime", "ms")]


def render_metrics_config():
    """The text of config/metrics.yaml: TorchServe's own metrics, then every metric in handlers/core/metrics.py."""
    from handlers.core.metrics import MODEL_METRICS, dimension_names

    lines = [
        "# GENERATED by `python -m scripts.package --metrics` from handlers/core/metrics.py (ours) and",
        "# scripts/package.py (TorchServe's own): edit those, not this file. The frontend drops a metric this file",
        "# does not declare.",
        "# Only times are histograms: TorchServe's histograms have Prometheus' default buckets (5 ms .. 10 s).",
        "dimensions: [ModelName, Level, Hostname]",
        "ts_metrics:",
    ]

    def entry(name, unit, dimensions):
        return [f"    - name: {name}", f"      unit: {unit}", f"      dimensions: [{', '.join(dimensions)}]"]

    for kind, metrics in TORCHSERVE_METRICS.items():
        lines.append(f"  {kind}:")
        for name, unit, dimensions in metrics:
            lines += entry(name, unit, dimensions)
    lines.append("model_metrics:")
    for kind in ("histogram", "counter", "gauge"):
        lines.append(f"  {kind}:")
        for name, spec in MODEL_METRICS.items():
            if spec.kind == kind:
                lines.append(f"    # {spec.help}")
                lines += entry(name, spec.unit, dimension_names(name))
        if kind == "gauge":
            for name, unit in TORCHSERVE_MODEL_METRICS:
                lines += entry(name, unit, ["ModelName", "Level"])
    return "\n".join(lines) + "\n"


def write_metrics_config(log=print):
    """Rewrite config/metrics.yaml when it differs from what handlers/core/metrics.py declares."""
    text = render_metrics_config()
    if not METRICS_CONFIG.exists() or METRICS_CONFIG.read_text() != text:
        METRICS_CONFIG.write_text(text)
        log(f"{METRICS_CONFIG.relative_to(REPO)}: regenerated from handlers/core/metrics.py")


OPTIONAL = "?"  # a files entry ending in it is packed only when it exists
BUILDING = ".building-"  # a hidden folder in the store an archive is written in (same filesystem: renamed in one step)


def fill(text, values):
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def digest(paths, extra=""):
    """Hash of file names and contents (folders recursively) plus extra text."""
    hasher = hashlib.sha256(extra.encode())
    for path in paths:
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        else:
            files = [path]
        for file in files:
            hasher.update(str(file.relative_to(REPO) if file.is_relative_to(REPO) else file).encode())
            hasher.update(file.read_bytes() if file.exists() else b"<missing>")
    return hasher.hexdigest()


def run_prepare(spec, build_dir, values, force, log):
    """Run the spec's prepare step when needed; its outputs are the spec's files.

    Its inputs may name a --var (``{model_dir}``): a user's model folder is hashed too, so editing it rebuilds."""
    prepare = spec.get("prepare")
    if not prepare:
        return
    command = [fill(part, values) for part in prepare["command"]]
    filled = [fill(p, values) for p in prepare.get("inputs", [])]
    inputs = [REPO / p for p in filled if p.strip()]
    for folder in inputs:
        if folder.is_dir():
            check_links(folder)
    stamp = build_dir / ".prepare-hash"
    wanted = digest(inputs, extra=json.dumps(command))
    outputs = [build_dir / f for f in spec.get("files", []) if not f.endswith(OPTIONAL)]
    if not force and stamp.exists() and stamp.read_text() == wanted and all(p.exists() for p in outputs):
        log(f"{spec['name']}: prepare step up to date")
        return
    build_dir.mkdir(parents=True, exist_ok=True)
    log(f"{spec['name']}: running prepare step: {' '.join(command)}")
    result = subprocess.run(command, cwd=REPO)
    if result.returncode != 0:
        raise PackagingError(f"{spec['name']}: prepare step failed with exit code {result.returncode}")
    missing = [str(p.relative_to(REPO) if p.is_relative_to(REPO) else p) for p in outputs if not p.exists()]
    if missing:
        raise PackagingError(f"{spec['name']}: prepare step did not produce {missing}")
    stamp.write_text(wanted)


def check_links(folder):
    """Refuse a symbolic link in `folder` that leads outside it (a user's model folder, before anything reads it).

    The prepare step copies and the input hash reads through links, so a link to ~/.ssh/id_rsa named tokenizer.json
    would pack that file into an archive anyone with the store can read (and one to /dev/zero would never finish).
    A Hugging Face hub snapshot (models--org--name/snapshots/<revision>/) is links into its download's blobs/: kept."""
    root = folder.resolve()
    blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
    for directory, subfolders, names in os.walk(folder):  # links to folders are listed, not followed
        for name in sorted(subfolders + names):
            path = Path(directory) / name
            if not path.is_symlink():
                continue
            target = path.resolve()
            if target.is_relative_to(root) or (blobs is not None and target.parent == blobs):
                continue
            raise PackagingError(
                f"{path} is a symbolic link to {target}, outside the model folder {folder}: packaging reads what a "
                f"link points to, so it is refused. Copy the file itself into the folder (cp --dereference) if it "
                f"belongs to the model, or remove the link"
            )


def resolve_file(spec, build_dir, name):
    for base in (build_dir, spec["dir"], REPO):
        if (base / name).exists():
            return base / name.rstrip("/")
    raise PackagingError(
        f"{spec['name']}: file {name!r} not found in {build_dir.relative_to(REPO)}, "
        f"{spec['dir'].relative_to(REPO)} or the repository root"
    )


def read_manifest(store):
    path = store / MANIFEST_NAME
    return json.loads(path.read_text()) if path.exists() else {}


def update_manifest(store, archive_name, entry):
    """Record one archive. Builds may run at once (CI jobs, test sessions): under a lock, re-read the manifest so
    another build's entry is not lost, and replace the file atomically so no reader sees half of it."""
    with open(store / ".manifest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = read_manifest(store)
        manifest[archive_name] = entry
        temporary = store / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.replace(temporary, store / MANIFEST_NAME)


@contextlib.contextmanager
def archive_lock(store, archive_name):
    """Hold the build lock of one archive (an flock on a hidden file in the store): two builds of one name, from two
    shells, CI jobs or test sessions, run one after the other (the second then finds the archive up to date), and
    neither stages over the other's files. Under the lock, what a killed build of this name left is removed."""
    store.mkdir(parents=True, exist_ok=True)
    with open(store / f".{archive_name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for leftover in store.glob(f"{BUILDING}{archive_name}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        yield


def archive_entries(spec, build_dir):
    """(source path, name at the archive's root) for each of the spec's files; an entry ending in '/' packs the
    folder's contents at the root (a staged model folder), one ending in '?' only when the prepare step made it
    (e.g. the generator's embedder/, staged with --var embedder=...), anything else goes in under its own name."""
    entries = []
    for name in spec.get("files", []):
        if name.endswith(OPTIONAL):
            name = name[: -len(OPTIONAL)]
            if not (build_dir / name).exists():
                continue
        source = resolve_file(spec, build_dir, name)
        if name.endswith("/"):
            entries += [(child, child.name) for child in sorted(source.iterdir())]
        else:
            entries.append((source, source.name))
    return entries


def make_archive(model_name, version, handler, files, config, destination):
    """Run torch-model-archiver on the handlers package plus `files` ((source, name) pairs); the .mar is written to
    `destination`.

    The archiver writes into a hidden folder beside `destination` (same filesystem) and the finished archive is
    renamed over it in one step: a server loading it, an interrupted build or a failed one never sees half an archive,
    and the previous one stays as it was until the new one is whole."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix=f"stage-{model_name}-") as staging,
        tempfile.TemporaryDirectory(prefix=f"{BUILDING}{destination.name}-", dir=destination.parent) as export,
    ):
        stage = Path(staging) / "files"
        # The folder that CONTAINS handlers/ goes in as --extra-files, so `import handlers.core.base` works in the
        # worker; copytree takes the subpackages along.
        shutil.copytree(HANDLERS_DIR, stage / "handlers", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for file, name in files:
            target = stage / name
            shutil.copytree(file, target) if Path(file).is_dir() else shutil.copy2(file, target)
        run_archiver(model_name, version, handler, stage, config, Path(export))
        os.replace(Path(export) / f"{model_name}.mar", destination)


def run_archiver(model_name, version, handler, extra_files, config, export_path, serialized_file=None):
    """torch-model-archiver: `handler` plus the folder `extra_files` (and a `serialized_file`, the model a stock
    handler loads) into export_path/<model_name>.mar."""
    command = [
        str(Path(sys.executable).parent / "torch-model-archiver"),
        "--model-name",
        model_name,
        "--version",
        str(version),
        "--handler",
        str(handler),
        "--extra-files",
        str(extra_files),
        "--config-file",
        str(config),
        "--export-path",
        str(export_path),
        "--force",
        *(["--serialized-file", str(serialized_file)] if serialized_file else []),
    ]
    # torch-model-archiver stages in $TMPDIR/<model name> and deletes that path before and after: with the user's
    # TMPDIR, packaging my-model from /tmp/my-model (where `unzip model.zip -d /tmp/my-model` puts it) deleted the
    # user's folder. A TMPDIR of its own, made for this run, holds nothing else.
    with tempfile.TemporaryDirectory(prefix="archiver-tmp-") as scratch:
        env = {**os.environ, "TMPDIR": scratch, "TEMP": scratch, "TMP": scratch}
        result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise PackagingError(f"{model_name}: torch-model-archiver failed:\n{result.stdout}{result.stderr}")


def build(
    name, store, version=None, variables=None, force=False, log=print, cpu_kind=None, model_name=None, overrides=None
):
    """Build one archive if its inputs changed; returns its manifest entry (with 'rebuilt': bool).

    ``overrides``: {key: value} of --config (TorchServe keys, handler.KEY options) set in the packed config.

    ``cpu_kind`` picks the model-config's ``per_cpu_kind`` overrides (default: $TS_CPU_KIND, else this machine's).
    ``model_name`` builds the spec under another name (a template spec such as ``embedding`` needs one): the archive
    is model_store/<model_name>.mar and serves at /predictions/<model_name>."""
    cpu_kind = cpu_kind or os.environ.get("TS_CPU_KIND") or machine.cpu_kind()
    spec = load_spec(name)
    if spec.get("template") and not model_name:
        raise PackagingError(
            f"{name} is a template for your own model: name it and point it at the folder, e.g. "
            f"python -m scripts.package {name} --name my-model --var model_dir=/path/to/folder (docs/your-model.md)"
        )
    if model_name:
        check_model_name(model_name)
        spec = {**spec, "name": model_name}
    version = str(version or spec["version"])
    values = {**{k: str(v) for k, v in (spec.get("vars") or {}).items()}, **(variables or {})}
    # A misspelt --var would be ignored and build a "new" version identical to the old one: refuse it.
    undeclared = sorted(set(variables or {}) - set(spec.get("vars") or {}))
    if undeclared:
        raise PackagingError(
            f"{spec['name']}: --var {undeclared} not declared under vars: in "
            f"models/{name}/model.yaml (declared: {sorted(spec.get('vars') or {})})"
        )
    # A spec built under its own name with other values gets a versioned archive beside the default one; a named
    # build (--name) is the user's own model: <name>.mar, versioned only when another version is asked for.
    same_version = version == str(spec["version"])
    suffix = "" if same_version and (model_name or not variables) else f"-{version}"
    archive_name = f"{spec['name']}{suffix}.mar"
    build_dir = REPO / "build" / f"{spec['name']}{suffix}"
    values.update(python=sys.executable, build=build_dir, repo=REPO, version=version)

    config = validate_model_config(spec, cpu_kind, overrides)
    with archive_lock(store, archive_name):
        return build_locked(
            spec, name, store, version, variables, force, log, cpu_kind, overrides, values, archive_name, config
        )


def build_locked(spec, name, store, version, variables, force, log, cpu_kind, overrides, values, archive_name, config):
    """build() under the archive's lock: prepare, hash the inputs, and pack when they changed."""
    build_dir = values["build"]
    run_prepare(spec, build_dir, values, force, log)
    files = archive_entries(spec, build_dir)
    # The whole package folder (every file of every subpackage, as make_archive packs it), not only its top level.
    inputs = [spec["spec_path"], spec["dir"] / spec["config"], REPO / "requirements.txt", HANDLERS_DIR]
    inputs += [source for source, _ in files]
    described = {"version": version, "vars": variables or {}, "cpu_kind": cpu_kind, "config": overrides or {}}
    input_hash = digest(inputs, extra=json.dumps(described, sort_keys=True, default=str))

    store.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(store)
    entry = manifest.get(archive_name)
    if not force and entry and entry.get("input_hash") == input_hash and (store / archive_name).exists():
        log(f"{spec['name']} {version}: {archive_name} up to date")
        return {**entry, "rebuilt": False}

    log(f"{spec['name']} {version}: building {archive_name}")
    config_file = spec["dir"] / spec["config"]
    if overrides or "per_cpu_kind" in (yaml.safe_load(config_file.read_text()) or {}):
        # The packed config is the resolved one; TorchServe reads no section it does not know anyway.
        config_file = build_dir / f"config-{cpu_kind}" / spec["config"]  # the same file name inside the archive
        config_file.parent.mkdir(parents=True, exist_ok=True)
        set_here = f", with --config {overrides}" if overrides else ""
        config_file.write_text(
            f"# models/{name}/{spec['config']} for CPU kind {cpu_kind}{set_here}, resolved by scripts/package.py\n"
            + yaml.safe_dump(config, sort_keys=False)
        )
        log(
            f"{spec['name']}: config for CPU kind {cpu_kind}: "
            + ", ".join(f"{key} {config[key]}" for key in ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay"))
        )
    # The content digest every worker keys its caches by and shows (handlers/core/identity.py).
    build_dir.mkdir(parents=True, exist_ok=True)
    record = identity.compute(files, config.get("handler"), code=HANDLERS_DIR)
    files = [*files, (identity.write(build_dir, record), identity.IDENTITY_FILE)]
    make_archive(spec["name"], version, REPO / spec["handler"], files, config_file, store / archive_name)

    entry = {
        "model": spec["name"],
        "version": version,
        "archive": archive_name,
        "input_hash": input_hash,
        "batchSize": config["batchSize"],
        "maxBatchDelay": config["maxBatchDelay"],
        "cpu_kind": cpu_kind,
        "identity": record["identity"],
        "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    update_manifest(store, archive_name, entry)
    return {**entry, "rebuilt": True}


def print_listing(args):
    """--template-for: the template of a folder; --list: the models and what the store holds."""
    if args.template_for is not None:
        print(template_for(args.template_for))
        return
    manifest = read_manifest(args.store)
    for name in all_model_names(include_optional=True):
        spec = load_spec(name)
        built = [f"{k} ({v['version']})" for k, v in sorted(manifest.items()) if v.get("model") == name]
        print(f"{name:12} spec version {spec['version']:6} built: {', '.join(built) or '-'}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.package", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", help="model names (default: all under models/)")
    parser.add_argument(
        "--store", type=Path, default=REPO / "model_store", help="where archives go (default model_store/)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if nothing changed (reruns prepare too)")
    parser.add_argument("--version", help="archive version (default: the spec's); another version -> NAME-VERSION.mar")
    parser.add_argument(
        "--name",
        help="build the spec under this model name: model_store/NAME.mar, served at /predictions/NAME (needed for "
        "the templates embedding and text-classifier, with --var model_dir=/path/to/your/folder)",
    )
    parser.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="value for a {KEY} in the prepare command, e.g. seed=1",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a value of the packed model-config.yaml: a TorchServe key (minWorkers=1, batchSize=16) or a handler "
        "option (handler.max_inputs=32); checked like the file's own values",
    )
    parser.add_argument(
        "--cpu-kind",
        choices=machine.CPU_KINDS,
        help="pack model-config's per_cpu_kind values for this kind of CPU (default $TS_CPU_KIND, else this machine's;"
        " set it when building an image for other machines)",
    )
    parser.add_argument("--list", action="store_true", help="list the models and what the store holds, then exit")
    parser.add_argument(
        "--template-for",
        metavar="FOLDER",
        help="print the template a model folder is packaged with (network-model for a PyTorch network, image-model "
        "for an image model, else text-model; what make package uses), then exit",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--metrics", action="store_true", help="regenerate config/metrics.yaml from handlers/core/metrics.py, then exit"
    )
    args = parser.parse_args(argv)

    if args.metrics:
        write_metrics_config(print)
        return 0
    if args.list or args.template_for is not None:
        print_listing(args)
        return 0
    variables = {}
    for item in args.var:
        if "=" not in item:
            parser.error(f"--var wants KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        variables[key] = value
    names = args.models or all_model_names()
    if args.name and len(names) != 1:
        parser.error("--name names one model: give exactly one spec, e.g. embedding --name my-model")
    log = (lambda *_: None) if args.json else print
    write_metrics_config(log)
    results = []
    try:
        overrides = parse_overrides(args.config)
        for name in names:
            results.append(
                build(
                    name,
                    args.store,
                    args.version,
                    variables,
                    args.force,
                    log=log,
                    cpu_kind=args.cpu_kind,
                    model_name=args.name,
                    overrides=overrides,
                )
            )
    except PackagingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
