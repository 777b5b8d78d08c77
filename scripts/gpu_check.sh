#!/usr/bin/env bash
# GPU check for minilm: runs the embedding handler in-process on CUDA with fp16 and the default `backend: auto` (the
# archive built on this machine packs an AOTInductor fp16 package for CUDA; auto serves it), compares its
# embeddings with the fp32 eager handler on the same GPU (min cosine must reach the bound) and prints throughput.
# CI never needs a GPU; run this by hand on a CUDA machine with a CUDA build of torch in .venv:
#
#   scripts/gpu_check.sh [--batch-sizes 1,32,128] [--min-cosine 0.999] [--backend auto|aot|jit|eager]
#
# GPU_CHECK_ON_CPU=1 runs the same steps on the CPU (a dry run of this script where there is no GPU).
# Exit codes: 0 parity ok, 1 parity below the bound or a load failed, 3 no usable CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
# The repository root on the import path of the in-line Python below (handlers, scripts, tests).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

[ "${GPU_CHECK_ON_CPU:-0}" = 1 ] || "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' || {
    echo "gpu_check: no CUDA device visible to torch ($("$PY" -c 'import torch; print(torch.__version__)')); nothing to check" >&2
    exit 3
}
"$PY" -m scripts.package minilm >/dev/null

exec "$PY" - "$@" <<'PYTHON'
import argparse, json, sys, time, zipfile
from pathlib import Path

import torch
from ts.context import Context

from handlers.embeddings import EmbeddingHandler
from scripts.bench_embeddings import make_texts
from scripts.ops.handler_loader import set_requests

parser = argparse.ArgumentParser(prog="scripts/gpu_check.sh")
parser.add_argument("--batch-sizes", default="1,32,128")
parser.add_argument("--min-cosine", type=float, default=0.999)
parser.add_argument("--backend", default="auto", choices=["auto", "aot", "jit", "eager"])
args = parser.parse_args()

model_dir = Path("build/gpu-check/minilm")
with zipfile.ZipFile("model_store/minilm.mar") as mar:
    mar.extractall(model_dir)
base_config = __import__("yaml").safe_load((model_dir / "model-config.yaml").read_text())


def load(precision, backend):
    handler = EmbeddingHandler()
    config = {**base_config, "handler": {**base_config["handler"], "precision": precision, "backend": backend,
                                         "cache_size": 0}}
    context = Context("minilm", str(model_dir), {"model": {"modelName": "minilm", "modelVersion": "1.0"}},
                      base_config["batchSize"], 0, "0.12.0", model_yaml_config=config)
    started = time.perf_counter()
    handler.initialize(context)
    device_name = torch.cuda.get_device_name(handler.device) if handler.device.type == "cuda" else "CPU dry run"
    print(f"loaded {precision}/{backend} on {handler.device} ({device_name}): serving {handler.backend} "
          f"{handler.precision} ({handler.backend_reason}), gate min cosine {handler.min_cosine:.6f}, "
          f"{time.perf_counter() - started:.1f}s")
    return handler, context


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def embed(handler, context, texts):
    set_requests(context, [{"Content-Type": "application/json"}] * len(texts))
    answers = handler.handle([{"body": {"text": t}} for t in texts], context)
    return torch.tensor([json.loads(a)["embedding"] for a in answers])


reference_handler, reference_context = load("fp32", "eager")
fast_handler, fast_context = load("auto", args.backend)  # auto = fp16 on CUDA
texts = make_texts("mixed", 256, seed=1)
expected = torch.cat([embed(reference_handler, reference_context, texts[i:i + 32]) for i in range(0, 256, 32)])
got = torch.cat([embed(fast_handler, fast_context, texts[i:i + 32]) for i in range(0, 256, 32)])
worst = torch.nn.functional.cosine_similarity(got, expected).min().item()
print(f"parity {fast_handler.precision}/{fast_handler.backend} vs fp32 eager: min cosine {worst:.6f} (bound {args.min_cosine})")

for handler, context, name in ((reference_handler, reference_context, "fp32/eager"),
                               (fast_handler, fast_context, f"{fast_handler.precision}/{fast_handler.backend}")):
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        batch = texts[:batch_size]
        embed(handler, context, batch)
        synchronize()
        runs = max(3, 64 // batch_size)
        started = time.perf_counter()
        for _ in range(runs):
            embed(handler, context, batch)
        synchronize()
        seconds = (time.perf_counter() - started) / runs
        print(f"{name:12} batch {batch_size:4}: {seconds * 1000:8.2f} ms/batch {batch_size / seconds:9.1f} seq/s")
sys.exit(0 if worst >= args.min_cosine else 1)
PYTHON
