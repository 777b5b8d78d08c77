"""Small random-weight image models, built offline in seconds, for the tests that package a user's own image model
folder (the sibling of scripts/tiny_text_models.py).

Tests cannot download real models (no hub here) and real ones are slow on 2 cores, so this module writes folders with
the same files and layout as the real thing (config.json with id2label, model.safetensors, preprocessor_config.json
from the model's own image processor class), only tiny (32x32 inputs, 8-pixel patches, 32 wide, 2 layers) with
seeded random weights. Nothing in a test should expect meaningful labels from them: the expected answers come from
transformers loading the same folder inside the test.

Every builder takes the target folder, writes into it (creating it) and returns it; the same call writes the same
weights. The image-text builders (CLIP, SigLIP, sentence-transformers CLIP) add the tokenizer and processor files
of the real thing (a tokenizer built from scripts/tiny_text_models.py's word lists).

    python -m scripts.tiny_image_models vit /tmp/tiny-vit
    python -m scripts.tiny_image_models clip /tmp/tiny-clip
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from scripts.tiny_text_models import HEADS, HIDDEN, INTERMEDIATE, LAYERS, _unigram_pieces

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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


# ---------------------------------------------------------------------------------------------------------------------
# Image-text embedders (the "image-text" kind): CLIP, SigLIP, sentence-transformers CLIP.

IMAGE_SIZE = 32
PATCH_SIZE = 8
# CLIP's text tower reads 77 positions, SigLIP's 64 (and its processor pads every text to 64): the real sizes.
CLIP_TEXT_POSITIONS = 77
SIGLIP_TEXT_POSITIONS = 64
PROJECTION = 16  # the shared vector space's width: not the towers' width, so a missed projection shows
# As for the tiny text models: transformers' default std leaves a 32-wide tower blind to its input (every image and
# text gets the same vector), which would let a test pass whatever the served path computes.
IMAGE_TEXT_INITIALIZER_RANGE = 0.5


def _tower_sizes() -> dict[str, int]:
    return {
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
    }


def clip_tokenizer(max_length: int = CLIP_TEXT_POSITIONS) -> PreTrainedTokenizerBase:
    """transformers' CLIPTokenizer (lower-casing byte-level BPE, "</w>" word ends) on a vocabulary of every byte,
    alone and as a word end, without merges: each word is its characters. <|startoftext|> and <|endoftext|> take the
    last two ids, as in the real vocabulary (CLIP's text tower pools at the end-of-text token). ``max_length``: its
    model_max_length."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    pieces = alphabet + [f"{char}</w>" for char in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def siglip_tokenizer() -> PreTrainedTokenizerBase:
    """A SentencePiece-style Unigram tokenizer shaped like SigLIP's: "</s>" ends every text and pads it, "<unk>",
    and only input_ids reach the model (SigLIP's text tower is fed no attention mask: the padding counts, which is
    why its processor pads every text to 64 tokens). SigLIP's own SiglipTokenizer needs the sentencepiece package;
    this is the fast equivalent transformers loads without it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    vocab = [(token, 0.0) for token in specials] + [p for p in _unigram_pieces() if p[0] not in specials]
    backend = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")]
    )
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=SIGLIP_TEXT_POSITIONS,
        pad_token="</s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_input_names=["input_ids"],
    )


def _clip_image_processor():
    from transformers import CLIPImageProcessor

    # OpenAI CLIP's recipe: resize the shortest edge, centre-crop, rescale, normalize with CLIP's own mean and std.
    return CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_center_crop=True
    )


def make_clip(folder: Path, text_positions: int = CLIP_TEXT_POSITIONS, tokenizer_max_length: int | None = None) -> Path:
    """A transformers CLIPModel with its processor's parts (CLIPImageProcessor + CLIPTokenizer), as the hub's CLIP
    folders hold them: config.json, model.safetensors, preprocessor_config.json, tokenizer files. ``text_positions``:
    the text tower's position embeddings (a small model's may hold fewer than 77, too few for a label in the default
    zero-shot template with this character-level tokenizer); ``tokenizer_max_length``: the tokenizer's
    model_max_length where it says other than the tower."""
    from transformers import CLIPConfig, CLIPModel

    tokenizer = clip_tokenizer(tokenizer_max_length or text_positions)
    text = {
        **_tower_sizes(),
        "vocab_size": len(tokenizer),
        "max_position_embeddings": text_positions,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {**_tower_sizes(), "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
    config = CLIPConfig(
        text_config=text,
        vision_config=vision,
        projection_dim=PROJECTION,
        initializer_range=IMAGE_TEXT_INITIALIZER_RANGE,
    )
    config.text_config.initializer_range = config.vision_config.initializer_range = IMAGE_TEXT_INITIALIZER_RANGE
    torch.manual_seed(SEED)
    model = CLIPModel(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    _save_parts(folder, _clip_image_processor(), tokenizer)
    return folder


def _save_parts(folder: Path, image_processor, tokenizer) -> None:
    """The processor's parts as the hub's CLIP and SigLIP folders hold them: preprocessor_config.json and the
    tokenizer files (transformers 5's Processor.save_pretrained would nest the image processor's settings in
    processor_config.json instead; AutoProcessor loads either)."""
    image_processor.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def make_siglip(folder: Path) -> Path:
    """A transformers SiglipModel with its processor's parts (SiglipImageProcessor: a plain resize to 32x32, mean and
    std 0.5; the fast SigLIP-style tokenizer). Its logit scale and bias are set away from transformers' zero init, so
    the zero-shot scores use both."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    tokenizer = siglip_tokenizer()
    text = {
        **_tower_sizes(),
        "vocab_size": len(tokenizer),
        "max_position_embeddings": SIGLIP_TEXT_POSITIONS,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.eos_token_id,
        "projection_size": HIDDEN,
    }
    vision = {**_tower_sizes(), "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
    config = SiglipConfig(text_config=text, vision_config=vision)
    torch.manual_seed(SEED)
    model = SiglipModel(config).eval()
    with torch.no_grad():
        # SigLIP's own init is small (xavier), but not blind: only the logit scale and bias start at zero.
        model.logit_scale.fill_(math.log(4.0))
        model.logit_bias.fill_(-1.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    _save_parts(folder, SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}), tokenizer)
    return folder


def make_sentence_transformers_clip(folder: Path, source: Path | None = None) -> Path:
    """A sentence-transformers CLIP folder, as SentenceTransformer(modules=[CLIPModel(folder)]).save writes it in
    sentence-transformers 6.2, from the tiny CLIP folder (SOURCE, else one built in a scratch folder): modules.json
    with the one CLIP module saved in the folder's root (path ""), its transformers files there, the processor as
    processor_config.json (the image processor's settings nested in it), no Normalize module (encode's vectors are
    not unit length)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import CLIPModel

    with tempfile.TemporaryDirectory() as scratch:
        clip_folder = source if source is not None else make_clip(Path(scratch) / "clip")
        model = SentenceTransformer(modules=[CLIPModel(str(clip_folder), _from_auto_load=True)], device="cpu")
        folder.mkdir(parents=True, exist_ok=True)
        model.save(str(folder))
    return folder


def make_old_sentence_transformers_clip(folder: Path, source: Path | None = None) -> Path:
    """A sentence-transformers CLIP folder in the layout saves before version 6 wrote (most hub copies): the CLIP
    model's transformers files in a ``0_CLIPModel/`` module folder, then an (empty) ``1_Normalize/``, named by
    modules.json with the old module type names; from the tiny CLIP folder (SOURCE, else one built in a scratch
    folder)."""
    with tempfile.TemporaryDirectory() as scratch:
        clip_folder = source if source is not None else make_clip(Path(scratch) / "clip")
        shutil.copytree(clip_folder, folder / "0_CLIPModel")
    (folder / "1_Normalize").mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"},
        {"idx": 1, "name": "1", "path": "1_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    versions = {"__version__": {"sentence_transformers": "2.2.2", "transformers": "4.30.2", "pytorch": "2.0.1"}}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(versions, indent=2))
    return folder


BUILDERS = {
    "vit": make_vit_classifier,
    "convnext": make_convnext_classifier,
    "clip": make_clip,
    "siglip": make_siglip,
    "st-clip": make_sentence_transformers_clip,
    "st-clip-old": make_old_sentence_transformers_clip,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.tiny_image_models", description=__doc__)
    parser.add_argument("model", choices=sorted(BUILDERS))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    print(BUILDERS[args.model](args.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
