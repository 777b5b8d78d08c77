"""Train the classifier MLP deterministically on a synthetic 10-class problem and save its weights.

The data are Gaussian clusters around 10 random centroids in 128-d, generated from a fixed seed, so the same command
gives the same weights. Held-out accuracy is printed and saved beside the weights (training.json); the script exits
non-zero if it is below --min-accuracy.

    python -m scripts.train_classifier --out build/classifier [--seed 0] [--epochs 20]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from handlers.mlp.nets import MLPClassifier

FEATURES, CLASSES = 128, 10


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
    parser.add_argument("--out", type=Path, required=True, help="folder for classifier.pt and training.json")
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
    torch.save(model.state_dict(), args.out / "classifier.pt")
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"classifier: held-out accuracy {report['test_accuracy']:.2%} (seed {args.seed}) -> {args.out}")
    if report["test_accuracy"] < args.min_accuracy:
        print(f"error: accuracy below {args.min_accuracy:.0%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
