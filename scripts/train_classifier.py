"""Train the classifier MLP deterministically on a synthetic 10-class problem and export it as a network folder.

The data are Gaussian clusters around 10 random centroids in 128-d, generated from a fixed seed, so the same command
gives the same weights. The trained module is exported with ``torch.export`` (rows dynamic, ``Dim("batch")``) to
``model.pt2`` in --out, beside training.json (held-out accuracy; the script exits non-zero if it is below
--min-accuracy) and the classifier's own request hooks and signature file (models/classifier/handler.py,
signature.yaml): --out is then a network folder like any team's (docs/your-model.md, "Your own network"), and --stage
packs it with scripts/prepare_network_model.py as the network-model template does.

    python -m scripts.train_classifier --out build/classifier/source [--stage build/classifier/model] [--seed 0]
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from torch import nn

FEATURES, CLASSES = 128, 10
PROGRAM = "model.pt2"
# What the classifier's folder adds to the program: its request/answer hooks and the names of its input and output.
FOLDER = Path(__file__).resolve().parents[1] / "models" / "classifier"
FOLDER_FILES = ("handler.py", "signature.yaml")


class MLPClassifier(nn.Module):
    """The classifier: Linear(in, hidden) -> GELU -> Linear(hidden, classes), on rows of ``inputs``."""

    def __init__(self, in_features: int = FEATURES, hidden: int = 128, classes: int = CLASSES) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(in_features, hidden), nn.GELU(), nn.Linear(hidden, classes))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)

    @classmethod
    def from_state_dict(cls, state_dict):
        """Rebuild with the sizes the weights carry (an exported program's state_dict has the same keys)."""
        hidden, in_features = state_dict["layers.0.weight"].shape
        classes = state_dict["layers.2.weight"].shape[0]
        model = cls(in_features, hidden, classes)
        model.load_state_dict(state_dict)
        return model


def export(model):
    """The trained module as a torch.export program taking any number of rows."""
    example = torch.zeros(2, model.layers[0].in_features)  # two rows: torch would specialise one row to 1
    return torch.export.export(model, (example,), dynamic_shapes={"inputs": {0: torch.export.Dim("batch")}})


def make_dataset(seed, samples, noise):
    """Samples around fixed centroids: the centroids depend on the seed only, so train and test share them."""
    generator = torch.Generator().manual_seed(seed)
    centroids = torch.randn(CLASSES, FEATURES, generator=generator) * 0.35
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    inputs = centroids[labels] + noise * torch.randn(samples, FEATURES, generator=generator)
    return inputs, labels


def train(seed=0, epochs=20, train_samples=8000, test_samples=2000, noise=1.0):
    torch.manual_seed(seed)
    inputs, labels = make_dataset(seed, train_samples + test_samples, noise)
    train_x, train_y = inputs[:train_samples], labels[:train_samples]
    test_x, test_y = inputs[train_samples:], labels[train_samples:]
    model = MLPClassifier(FEATURES, 128, CLASSES)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    order_generator = torch.Generator().manual_seed(seed + 1)
    for _ in range(epochs):
        order = torch.randperm(train_samples, generator=order_generator)
        for start in range(0, train_samples, 128):
            batch = order[start : start + 128]
            loss = torch.nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    return model, {
        "seed": seed,
        "epochs": epochs,
        "train_samples": train_samples,
        "test_samples": test_samples,
        "noise": noise,
        "test_accuracy": round(accuracy, 4),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", type=Path, required=True, help="network folder to write: model.pt2, training.json, hooks, signature"
    )
    parser.add_argument("--stage", type=Path, help="then stage the folder for the archive here (prepare_network_model)")
    parser.add_argument(
        "--backends",
        default="none",
        help="compiled backends the staging builds (prepare_network_model --backends; default none: the classifier "
        "ships eager, which a 128x128 MLP gains nothing over)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of data, init and order (another seed = a retrained model)"
    )
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="fail below this held-out accuracy")
    args = parser.parse_args(argv)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: bit-identical weights on every machine
    model, report = train(args.seed, args.epochs)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.export.save(export(model), str(args.out / PROGRAM))
    # "kind" tells the tooling what this archive is (scripts/ops/registry.py KIND_RECORDS); "features" is the row
    # width the hooks check requests against.
    record = {"kind": "mlp", "features": model.layers[0].in_features, **report}
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    for name in FOLDER_FILES:
        shutil.copy2(FOLDER / name, args.out / name)
    print(f"classifier: held-out accuracy {report['test_accuracy']:.2%} (seed {args.seed}) -> {args.out}")
    if report["test_accuracy"] < args.min_accuracy:
        print(f"error: accuracy below {args.min_accuracy:.0%}", file=sys.stderr)
        return 1
    if args.stage is not None:
        from scripts.prepare_network_model import main as stage

        return stage(["--source", str(args.out), "--out", str(args.stage), "--backends", args.backends])
    return 0


if __name__ == "__main__":
    sys.exit(main())
