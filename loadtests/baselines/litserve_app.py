"""LitServe serving a network of the network comparison: its exported program (model.pt2) behind a LitAPI with
LitServe's batching on. Runs in build/litserve-venv (baseline_env.py); needs only torch, numpy and litserve.

    python loadtests/baselines/litserve_app.py --folder build/networks/ranking --port 8000 \
        --max-batch-size 64 --batch-timeout-ms 5

POST /predict with JSON ``{input: nested rows, ...}``; the answer is ``{output: nested rows}``. The program is loaded
with ``torch.export.load(...).module()`` and called as a module, as a LitServe user of a handed-over program would.
"""

import argparse
import json
from pathlib import Path

import litserve as ls
import numpy as np
import torch

DTYPES = {"float32": np.float32, "int64": np.int64}


class NetworkAPI(ls.LitAPI):
    def __init__(self, folder, threads, **batching):
        super().__init__(**batching)
        self.folder = Path(folder)
        self.threads = threads

    def setup(self, device):
        torch.set_num_threads(self.threads)
        network = json.loads((self.folder / "network.json").read_text(encoding="utf-8"))
        self.input_specs = [(spec["name"], DTYPES[spec["datatype"]]) for spec in network["inputs"]]
        self.output_name = network["outputs"][0]["name"]
        self.program = torch.export.load(str(self.folder / "model.pt2")).module()
        self.rows = []

    def decode_request(self, request):
        # Through numpy: torch.as_tensor walks a nested list element by element (seconds for one 224x224 image).
        return [torch.from_numpy(np.asarray(request[name], dtype=dtype)) for name, dtype in self.input_specs]

    def batch(self, inputs):
        self.rows = [len(tensors[0]) for tensors in inputs]
        return [torch.cat(column) for column in zip(*inputs, strict=True)]

    def predict(self, x):
        with torch.inference_mode():
            return self.program(*x)[self.output_name]

    def unbatch(self, output):
        return list(torch.split(output, self.rows))

    def encode_response(self, output):
        return {self.output_name: output.tolist()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", required=True, help="a network folder (model.pt2, network.json)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, required=True)
    parser.add_argument("--batch-timeout-ms", type=float, required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    api = NetworkAPI(
        args.folder, args.threads, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout_ms / 1000.0
    )
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False)


if __name__ == "__main__":
    main()
