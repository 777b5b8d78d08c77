"""Triton Inference Server through PyTriton serving a network of the network comparison: its exported program
(model.pt2) as a Python inference function, Triton's dynamic batcher on. Runs in build/pytriton-venv
(baseline_env.py); needs only torch, numpy and nvidia-pytriton.

    LD_LIBRARY_PATH=<that venv's python's LIBDIR> python loadtests/baselines/pytriton_app.py \
        --folder build/networks/ranking --http-port 8000 --grpc-port 8001 --metrics-port 8002 \
        --max-batch-size 64 --max-queue-delay-ms 5

Triton answers the Open Inference Protocol v2 (JSON and its binary tensor extension) at
``/v2/models/<network>/infer`` on 127.0.0.1. Its Python backend stub is linked against libpython3.11: started with
another libpython3.11 on the library path than this venv's own Python's, the model fails to load
(``'_thread.RLock' object has no attribute '_recursion_count'``), hence LD_LIBRARY_PATH (systems: network_peers.py).
"""

import argparse
import json
import signal
import sys
from pathlib import Path

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

DTYPES = {"float32": np.float32, "int64": np.int64}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", required=True, help="a network folder (model.pt2, network.json)")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, required=True)
    parser.add_argument("--max-queue-delay-ms", type=float, required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    folder = Path(args.folder)
    network = json.loads((folder / "network.json").read_text(encoding="utf-8"))
    torch.set_num_threads(args.threads)
    program = torch.export.load(str(folder / "model.pt2")).module()
    names = [spec["name"] for spec in network["inputs"]]
    output = network["outputs"][0]

    @batch
    def infer(**inputs):
        with torch.inference_mode():
            answer = program(*[torch.from_numpy(inputs[name]) for name in names])[output["name"]]
        return {output["name"]: answer.numpy()}

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
    )
    # Stopped with SIGTERM (systems.subprocess_server): leave through the `with`, whose exit stops tritonserver and its
    # Python stub; Python's default would end this process alone and leave them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with Triton(config=config) as triton:
        triton.bind(
            model_name=network["name"],
            infer_func=infer,
            inputs=[
                Tensor(name=spec["name"], dtype=DTYPES[spec["datatype"]], shape=tuple(spec["shape"][1:]))
                for spec in network["inputs"]
            ],
            outputs=[Tensor(name=output["name"], dtype=np.float32, shape=tuple(output["shape"][1:]))],
            config=ModelConfig(
                max_batch_size=args.max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=int(args.max_queue_delay_ms * 1000)),
            ),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
