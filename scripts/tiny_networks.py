"""Tiny network folders as a team would hand them over, one per source the network-model template packages (for the
integration tests, tests/integration/test_network_models.py, the prepare step's tests and the docs' walkthroughs):

- ``mlp``: only ``model.pt2`` (an exported MLP, 6 floats -> 3 scores);
- ``ranker``: ``model.pt2`` with int64 item ids into an embedding and float features, plus ``signature.yaml`` (an id
  range, class labels);
- ``sequence``: ``model.pt2`` with tokens and a mask of one dynamic length;
- ``code``: ``model.py`` + ``weights.safetensors`` + ``signature.yaml`` with an example (exported at package time);
- ``torchscript``: a scripted ``model.pt`` + ``signature.yaml`` with an example (converted at package time);
- ``csv``: ``model.pt2`` + ``handler.py`` reading a raw CSV line (text/csv) and answering with a label.

    python -m scripts.tiny_networks /tmp/networks      # writes every folder under it
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim, export

LABELS = ["low", "mid", "high"]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Ranker(nn.Module):
    """Item ids into an embedding, features beside them: three class scores per row."""

    def __init__(self) -> None:
        super().__init__()
        self.items = nn.Embedding(50, 8)
        self.head = nn.Linear(8 + 4, 3)

    def forward(self, item_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.items(item_ids), features], dim=1))


class Sequence(nn.Module):
    """Tokens and a mask of one dynamic length: a pooled vector per row."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(30, 8)
        self.pool = nn.Linear(8, 4)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(tokens) * mask.unsqueeze(-1)
        return self.pool(hidden.sum(1) / mask.sum(1, keepdim=True).clamp(min=1))


MODEL_CODE = """\
import torch
from torch import nn


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(5, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        return self.out(torch.relu(self.body(x)))
"""

CSV_HOOKS = '''\
import torch

LABELS = ["low", "mid", "high"]


def preprocess(request):
    """One CSV line of 6 numbers (text/csv) -> the model's input x, one row."""
    values = [float(field) for field in request.text.strip().split(",")]  # ValueError -> 400 with its message
    if len(values) != 6:
        raise ValueError(f"expected 6 comma-separated numbers, got {len(values)}")
    return {"x": torch.tensor([values])}


def postprocess(outputs, request):
    scores = outputs["output0"][0]
    return {"label": LABELS[int(scores.argmax())], "scores": scores.tolist()}
'''


def seeded(module_class: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return module_class().eval()


def make_mlp(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    program = export(seeded(MLP), (torch.randn(3, 6),), dynamic_shapes={"x": {0: Dim("batch")}})
    torch.export.save(program, str(folder / "model.pt2"))
    return folder


def make_ranker(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    batch = Dim("batch")
    example = (torch.randint(0, 50, (3,)), torch.randn(3, 4))
    program = export(seeded(Ranker), example, dynamic_shapes={"item_ids": {0: batch}, "features": {0: batch}})
    torch.export.save(program, str(folder / "model.pt2"))
    (folder / "signature.yaml").write_text(
        textwrap.dedent(
            """\
            inputs:
              item_ids:
                range: [0, 39]         # ids 40..49 are reserved: refused by name
            outputs:
              output0:
                labels: [low, mid, high]
            example:
              item_ids: [1, 2]
              features: [[0.5, 0.1, 0.2, 0.3], [0.0, 1.0, 0.0, 1.0]]
            """
        )
    )
    return folder


def make_sequence(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    batch, length = Dim("batch"), Dim("length", min=2, max=64)
    example = (torch.randint(0, 30, (3, 7)), torch.ones(3, 7))
    shapes = {"tokens": {0: batch, 1: length}, "mask": {0: batch, 1: length}}
    torch.export.save(export(seeded(Sequence), example, dynamic_shapes=shapes), str(folder / "model.pt2"))
    return folder


def code_module() -> nn.Module:
    """The module model.py of the code folder defines, with the folder's weights (as packaging builds it)."""
    scope: dict[str, object] = {}
    exec(MODEL_CODE, scope)  # noqa: S102 -- our own constant
    torch.manual_seed(0)
    module = scope["Scorer"]()  # type: ignore[operator]
    assert isinstance(module, nn.Module)
    return module.eval()


def make_code(folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL_CODE)
    save_file(code_module().state_dict(), str(folder / "weights.safetensors"))
    (folder / "signature.yaml").write_text("example:\n  x: [[0.5, -1.0, 2.0, 0.0, 1.5]]\n")
    return folder


def make_torchscript(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch deprecates TorchScript; teams still hand such files over
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(seeded(Sequence)), str(folder / "model.pt"))
    (folder / "signature.yaml").write_text("example:\n  tokens: [[1, 2, 3, 4]]\n  mask: [[1.0, 1.0, 1.0, 0.0]]\n")
    return folder


def make_csv(folder: Path) -> Path:
    make_mlp(folder)
    (folder / "handler.py").write_text(CSV_HOOKS)
    return folder


FOLDERS = {
    "mlp": make_mlp,
    "ranker": make_ranker,
    "sequence": make_sequence,
    "code": make_code,
    "torchscript": make_torchscript,
    "csv": make_csv,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.tiny_networks", description=__doc__)
    parser.add_argument("root", type=Path, help="folder to write the network folders under")
    args = parser.parse_args(argv)
    for name, make in FOLDERS.items():
        print(make(args.root / name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
