"""Small random-weight image models, built offline in seconds, for the tests that package a user's own image model
folder (the sibling of scripts/tiny_text_models.py).

Tests cannot download real models (no hub here) and real ones are slow on 2 cores, so this module writes folders with
the same files and layout as the real thing (config.json with id2label, model.safetensors, preprocessor_config.json
from the model's own image processor class), only tiny (32x32 inputs, 8-pixel patches, 32 wide, 2 layers) with
seeded random weights. Nothing in a test should expect meaningful labels from them: the expected answers come from
transformers loading the same folder inside the test.

Every builder takes the target folder, writes into it (creating it) and returns it; the same call writes the same
weights.

    python -m scripts.tiny_image_models vit /tmp/tiny-vit
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

SEED = 0
LABELS = ("cat", "dog", "bird")
# transformers' default std of 0.02 leaves a tiny random ViT all but blind to its input (every image gets the same
# scores to 1e-3), so a test could not tell whose answer it got; 0.5 makes different images score differently.
INITIALIZER_RANGE = 0.5


def _label_maps(labels: Sequence[str]) -> dict[str, dict]:
    return {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}


def make_vit_classifier(folder: Path, labels: Sequence[str] = LABELS, image_size: int = 32) -> Path:
    """A ViT image classifier (ViTForImageClassification) with a ViTImageProcessor resizing to image_size x
    image_size, bilinear, normalized with mean and std 0.5 (the processor's defaults)."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(SEED)
    config = ViTConfig(
        image_size=image_size,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        initializer_range=INITIALIZER_RANGE,
        **_label_maps(labels),
    )
    model = ViTForImageClassification(config).eval()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    ViTImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(str(folder))
    return folder


def make_convnext_classifier(folder: Path, labels: Sequence[str] = LABELS, shortest_edge: int = 32) -> Path:
    """A ConvNeXt image classifier whose processor uses the crop_pct rule (shortest edge / crop_pct, then a square
    crop), bicubic."""
    from transformers import ConvNextConfig, ConvNextForImageClassification, ConvNextImageProcessor

    torch.manual_seed(SEED)
    config = ConvNextConfig(
        num_channels=3,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        num_stages=2,
        initializer_range=INITIALIZER_RANGE,
        **_label_maps(labels),
    )
    model = ConvNextForImageClassification(config).eval()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    ConvNextImageProcessor(size={"shortest_edge": shortest_edge}).save_pretrained(str(folder))
    return folder


BUILDERS = {"vit": make_vit_classifier, "convnext": make_convnext_classifier}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.tiny_image_models", description=__doc__)
    parser.add_argument("model", choices=sorted(BUILDERS))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    print(BUILDERS[args.model](args.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
