"""The networks the network comparison serves: defined once here, built into folders every system loads.

    python -m loadtests.networks [--out build/networks] [NAME ...]     # `make network-measure-models`

- ``resnet50-size``: a ResNet-50 (bottleneck blocks 3-4-6-3, 64-2048 channels, ~25.6 M parameters, ~4.1 GFLOPs an
  image) with random weights: ``images`` float32 [rows, 3, 224, 224] -> ``logits`` float32 [rows, 1000].
- ``ranking``: a small recommendation ranker: ``user_id`` int64 [rows] and ``item_ids`` int64 [rows, 8] through
  embedding tables (10,000 users, 50,000 items, 32 wide), ``features`` float32 [rows, 16] (the request's context)
  through a linear layer, each of the 8 candidates scored by an MLP over [user, item, context] ->
  ``scores`` float32 [rows, 8].

Each folder (build/networks/<name>/) holds ``model.pt2`` (``torch.export`` of the network returning
``{output: tensor}``, dimension 0 dynamic as ``Dim("batch")``: what a team hands over, and what LitServe, PyTriton
and this project's network engine load), ``model.ts.pt`` (a TorchScript trace returning the tensor, for
TorchServe's handler) and ``network.json`` (what it was built from). The weights are drawn from a fixed seed, so the
module built in process (:func:`build_module`) is the reference every served answer is checked against. A folder is
rebuilt only when this file changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build" / "networks"
SEED = 0
MAX_EXPORTED_ROWS = 1024
PROGRAM = "model.pt2"
TORCHSCRIPT = "model.ts.pt"
RECORD = "network.json"


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here, as torchvision's v1.5), 1x1 expand by 4, plus the shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000, depths: tuple[int, ...] = (3, 4, 6, 3)):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        channels = 64
        for stage, depth in enumerate(depths):
            width = 64 * 2**stage
            for index in range(depth):
                blocks.append(Bottleneck(channels, width, 2 if index == 0 and stage > 0 else 1))
                channels = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(images))), 1))


class Ranker(nn.Module):
    """Embedding tables and an MLP: one score per (request, candidate item)."""

    def __init__(self, users: int = 10_000, items: int = 50_000, width: int = 32, features: int = 16):
        super().__init__()
        self.users = nn.Embedding(users, width)
        self.items = nn.Embedding(items, width)
        self.context = nn.Linear(features, width)
        self.mlp = nn.Sequential(nn.Linear(3 * width, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, user_id: torch.Tensor, item_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        candidates = item_ids.shape[1]
        user = self.users(user_id).unsqueeze(1).expand(-1, candidates, -1)
        context = torch.relu(self.context(features)).unsqueeze(1).expand(-1, candidates, -1)
        joined = torch.cat([user, self.items(item_ids), context], dim=2)
        return self.mlp(joined).squeeze(2)


class NamedLogits(nn.Module):
    """The CNN as exported: its argument named as the input, its tensor under the output's name, so that every
    OIP server (and this project's engine, which reads names from the program) names them alike."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.module(images)}


class NamedScores(nn.Module):
    """The ranker as exported (see NamedLogits)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, user_id: torch.Tensor, item_ids: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"scores": self.module(user_id, item_ids, features)}


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
    make: Callable[[], nn.Module]
    named: Callable[[nn.Module], nn.Module]  # the wrapper that is exported (NamedLogits, NamedScores)
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


def calibrate_batch_norms(module: nn.Module, example: tuple[torch.Tensor, ...]) -> None:
    """Running statistics from one pass over random input (cumulative average), so that a randomly initialised deep
    network keeps activations of unit scale in eval mode instead of growing by orders of magnitude per stage."""
    norms = [layer for layer in module.modules() if isinstance(layer, nn.BatchNorm2d)]
    for layer in norms:
        layer.reset_running_stats()
        layer.momentum = None
    module.train()
    with torch.no_grad():
        module(*example)
    module.eval()


def make_resnet() -> nn.Module:
    torch.manual_seed(SEED)
    module = ResNet50()
    calibrate_batch_norms(module, (torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(SEED)),))
    return module.eval()


def make_ranker() -> nn.Module:
    torch.manual_seed(SEED)
    return Ranker().eval()


NETWORKS: dict[str, Network] = {
    "resnet50-size": Network(
        "resnet50-size",
        "ResNet-50-size CNN, random weights: images [rows,3,224,224] fp32 -> logits [rows,1000]",
        make_resnet,
        NamedLogits,
        (TensorInput("images", "float32", (3, 224, 224)),),
        "logits",
        (1000,),
        max_batch=8,
        batch_delay_ms=10.0,
        moderate_rate=3.0,
    ),
    "ranking": Network(
        "ranking",
        "ranker: user_id [rows] + item_ids [rows,8] (embeddings) + features [rows,16] -> MLP -> scores [rows,8]",
        make_ranker,
        NamedScores,
        (
            TensorInput("user_id", "int64", (), ids=10_000),
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


def build_module(name: str) -> nn.Module:
    """The network in eval mode with its seeded weights: the same numbers on every call and in every process."""
    return network(name).make()


def source_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def as_tensors(arrays: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(array)) for array in arrays.values())


def export_program(module: nn.Module, spec: Network) -> torch.export.ExportedProgram:
    example = as_tensors(spec.random_inputs(2, np.random.default_rng(SEED)))
    batch = torch.export.Dim("batch", max=MAX_EXPORTED_ROWS)
    return torch.export.export(spec.named(module), example, dynamic_shapes={i.name: {0: batch} for i in spec.inputs})


def build_folder(name: str, out: Path = BUILD, log=print) -> Path:
    """build/networks/<name>/ with model.pt2, model.ts.pt and network.json; reused while this file is unchanged."""
    spec = network(name)
    folder = Path(out) / name
    record = folder / RECORD
    digest = source_digest()
    if record.exists() and json.loads(record.read_text()).get("source") == digest:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
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
    parser = argparse.ArgumentParser(prog="python -m loadtests.networks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
