"""Random-weight image model folders of real sizes, for the image load tests and comparisons (docs/performance.md).

    python -m scripts.measurement_image_models vit-base build/measure/vit-base
    python -m scripts.measurement_image_models clip-b32 build/measure/clip-b32

The weights are random (seeded): speed depends on a model's shape, not its weights, and the hub is out of reach
here. The shapes are the real ones:

- ``vit-base``: google/vit-base-patch16-224's ViTForImageClassification (12 layers, hidden 768, 12 heads, MLP 3072,
  patch 16, 224 pixels, 1,000 labels) with its ViTImageProcessor (resize to 224x224, mean and std 0.5); 86 M
  parameters.
- ``clip-b32``: openai/clip-vit-base-patch32's CLIPModel (vision 12x768 patch 32 at 224 pixels, text 12x512 over 77
  positions and 49,408 token ids, projection 512) with OpenAI CLIP's image processor (shortest edge 224, centre crop
  224, CLIP's mean and std) and a CLIP tokenizer built offline (scripts/tiny_image_models.py's byte-level one: the
  real merges are not at hand; texts tokenize longer, images are unaffected); 151 M parameters.

Their answers mean nothing. Package each with the one command as a user would (``make package NAME=vit-base
MODEL_DIR=build/measure/vit-base``); ``make image-measure-models`` does both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from scripts.tiny_image_models import SEED, clip_tokenizer

VIT_LABELS = 1000
CLIP_VOCABULARY = 49408  # openai/clip-vit-base-patch32's token ids (the embedding table's real size)


def make_vit_base(folder: Path) -> Path:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(SEED)
    labels = {i: f"label_{i}" for i in range(VIT_LABELS)}
    config = ViTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        id2label=labels,
        label2id={label: i for i, label in labels.items()},
    )
    folder.mkdir(parents=True, exist_ok=True)
    ViTForImageClassification(config).eval().save_pretrained(str(folder))
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(str(folder))
    return folder


def make_clip_b32(folder: Path) -> Path:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tokenizer = clip_tokenizer()
    text = {
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "max_position_embeddings": 77,
        "vocab_size": CLIP_VOCABULARY,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "image_size": 224,
        "patch_size": 32,
    }
    torch.manual_seed(SEED)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=512)).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    CLIPImageProcessor(
        size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}, do_center_crop=True
    ).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


BUILDERS = {"vit-base": make_vit_base, "clip-b32": make_clip_b32}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.measurement_image_models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", choices=sorted(BUILDERS))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if (args.folder / "config.json").exists():
        print(f"{args.folder}: already built")
        return 0
    BUILDERS[args.model](args.folder)
    print(f"{args.model} (random weights) -> {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
