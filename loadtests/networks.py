"""The networks the network comparison serves: defined once here, built into folders every system loads.

    python -m loadtests.networks [--out build/networks] [NAME ...]     # `make network-measure-models`

- ``resnet50-size``: a ResNet-50 (bottleneck blocks 3-4-6-3, 64-2048 channels, ~25.6 M parameters, ~4.1 GFLOPs an
  image) with random weights: ``images`` float32 [rows, 3, 224, 224] -> ``logits`` float32 [rows, 1000].
- ``ranking``: a small recommendation ranker: ``user_id`` int64 [rows, 1] and ``item_ids`` int64 [rows, 8] through
  embedding tables (10,000 users, 50,000 items, 32 wide), ``features`` float32 [rows, 16] (the request's context)
  through a linear layer, each of the 8 candidates scored by an MLP over [user, item, context] ->
  ``scores`` float32 [rows, 8].

Each folder (build/networks/<name>/) holds ``model.pt2`` (``torch.export`` of the network returning
``{output: tensor}``, dimension 0 dynamic as ``Dim("batch")``: what a team hands over, and what LitServe, PyTriton
and this project's network engine load), ``model.ts.pt`` (a TorchScript trace returning the tensor, for
TorchServe's handler) and ``network.json`` (what it was built from). The weights are drawn from a fixed seed, so the
module built in process (:func:`build_module`) is the reference every served answer is checked against. A folder is
rebuilt only when this file or the definitions change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build" / "networks"
SEED = 0  # the weights' and the example inputs' seed (loadtests/network_modules.py)
MAX_EXPORTED_ROWS = 1024
PROGRAM = "model.pt2"
TORCHSCRIPT = "model.ts.pt"
RECORD = "network.json"


@dataclass(frozen=True)
class TensorInput:
    """One input of one row: its name, numpy dtype, shape without the rows and, for ids, how many exist."""

    name: str
    dtype: str  # numpy's name: float32, int64
    shape: tuple[int, ...]
    ids: int = 0  # an id input: drawn uniformly from [0, ids)


@dataclass(frozen=True)
class Network:
    name: str
    title: str
    inputs: tuple[TensorInput, ...]
    output: str
    output_shape: tuple[int, ...]  # one row's
    # The batching every peer is given for this network (TorchServe batchSize / maxBatchDelay, LitServe
    # max_batch_size / batch_timeout, Triton's max_batch_size / max_queue_delay): the same for all, so the servers
    # differ, not their settings.
    max_batch: int
    batch_delay_ms: float
    # fp32 tolerance of a served answer against the module in process (relative to the largest reference value).
    tolerance: float = 1e-4
    moderate_rate: float = 5.0

    def random_inputs(self, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``rows`` rows of every input, drawn from ``rng``: standard normal floats, uniform ids."""
        drawn = {}
        for spec in self.inputs:
            shape = (rows, *spec.shape)
            if spec.ids:
                drawn[spec.name] = rng.integers(0, spec.ids, size=shape, dtype=np.int64)
            else:
                drawn[spec.name] = rng.standard_normal(shape, dtype=np.float32)
        return drawn


NETWORKS: dict[str, Network] = {
    "resnet50-size": Network(
        "resnet50-size",
        "ResNet-50-size CNN, random weights: images [rows,3,224,224] fp32 -> logits [rows,1000]",
        (TensorInput("images", "float32", (3, 224, 224)),),
        "logits",
        (1000,),
        max_batch=8,
        batch_delay_ms=10.0,
        moderate_rate=3.0,
    ),
    "ranking": Network(
        "ranking",
        "ranker: user_id [rows,1] + item_ids [rows,8] (embeddings) + features [rows,16] -> MLP -> scores [rows,8]",
        (
            # [rows, 1], not [rows]: Triton's batching models need at least one dimension besides the rows.
            TensorInput("user_id", "int64", (1,), ids=10_000),
            TensorInput("item_ids", "int64", (8,), ids=50_000),
            TensorInput("features", "float32", (16,)),
        ),
        "scores",
        (8,),
        max_batch=64,
        batch_delay_ms=5.0,
        moderate_rate=50.0,
    ),
}


def network(name: str) -> Network:
    if name not in NETWORKS:
        raise ValueError(f"no network {name!r}; the networks are {', '.join(NETWORKS)}")
    return NETWORKS[name]


def build_module(name: str):
    """The network (an nn.Module in eval mode) with its seeded weights: the same numbers on every call and in every
    process (loadtests/network_modules.py; torch is imported only here, so load generators need none)."""
    from loadtests import network_modules

    network(name)
    return network_modules.MAKERS[name]()


def source_digest() -> str:
    """What the folders are built from: this file and the definitions' (a change to either rebuilds them)."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update((Path(__file__).parent / "network_modules.py").read_bytes())
    return digest.hexdigest()[:16]


def as_tensors(arrays: dict[str, np.ndarray]):
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(array)) for array in arrays.values())


def export_program(module, spec: Network):
    """``torch.export`` of the network with named inputs and a named output, dimension 0 dynamic ("batch")."""
    import torch

    from loadtests import network_modules

    example = as_tensors(spec.random_inputs(2, np.random.default_rng(SEED)))
    batch = torch.export.Dim("batch", max=MAX_EXPORTED_ROWS)
    return torch.export.export(
        network_modules.NAMED[spec.name](module), example, dynamic_shapes={i.name: {0: batch} for i in spec.inputs}
    )


def build_folder(name: str, out: Path = BUILD, log=print) -> Path:
    """build/networks/<name>/ with model.pt2, model.ts.pt and network.json; reused while this file is unchanged."""
    spec = network(name)
    folder = Path(out) / name
    record = folder / RECORD
    digest = source_digest()
    if record.exists() and json.loads(record.read_text()).get("source") == digest:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    import torch

    module = build_module(name)
    with torch.no_grad():
        torch.export.save(export_program(module, spec), str(folder / PROGRAM))
        example = as_tensors(spec.random_inputs(2, np.random.default_rng(SEED)))
        torch.jit.trace(module, example, check_trace=False).save(str(folder / TORCHSCRIPT))
    described = {
        "name": name,
        "title": spec.title,
        "seed": SEED,
        "source": digest,
        "inputs": [{"name": i.name, "datatype": i.dtype, "shape": ["rows", *i.shape]} for i in spec.inputs],
        "outputs": [{"name": spec.output, "datatype": "float32", "shape": ["rows", *spec.output_shape]}],
        "parameters": sum(p.numel() for p in module.parameters()),
    }
    record.write_text(json.dumps(described, indent=2) + "\n")
    log(f"built {folder} ({described['parameters']:,} parameters)")
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.networks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"networks to build (default: all of {', '.join(NETWORKS)})")
    parser.add_argument("--out", default=str(BUILD), help="parent folder of the network folders")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(NETWORKS))
    if unknown:
        parser.error(f"unknown network(s) {unknown}; choose from {list(NETWORKS)}")
    for name in args.names or NETWORKS:
        print(build_folder(name, Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
