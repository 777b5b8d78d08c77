"""An image-text embedder's folder and towers (the "image-text" kind, handlers/image/kinds/image_text.py): what the
folder is, and the two towers that put texts and images into one vector space.

Folders served:

- transformers ``CLIPModel`` and ``SiglipModel`` folders (``save_pretrained`` of the model and its processor). SigLIP 2
  checkpoints of fixed resolution are saved as ``SiglipModel`` and are served the same way; the NaFlex ones load in
  transformers 5.24 as ``Siglip2Model`` with a patch-sequence image processor (``pixel_attention_mask``,
  ``spatial_shapes``), which the image preprocessing does not reproduce, so they are refused by name.
- sentence-transformers CLIP folders: ``modules.json`` whose first module is the CLIP model (``CLIPModel`` in
  sentence-transformers < 5.4, ``Transformer`` since), its transformers files in that module's folder (the folder's
  root where sentence-transformers 6 saved it), and a ``Normalize`` module after it or not.

The vectors are what the reference library gives (handlers/image/kinds/image_text_reference.py): for a transformers
folder the projected features made unit length, as the model's own forward does before its logits; for a
sentence-transformers folder the projected features as ``encode`` returns them (unit length only where the folder
has a Normalize module). Zero-shot scores are the model's ``logits_per_image`` (the cosine of the two, times
``exp(logit_scale)``, plus ``logit_bias`` for SigLIP) through a softmax (CLIP) or a sigmoid (SigLIP), as transformers'
pipeline scores them.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handlers.text.folder import FolderError, optional_json
from handlers.text.modules import module_name

# model_type -> the transformers class the folder's model loads as (what the worker builds from config.json).
ARCHITECTURES = {"clip": "CLIPModel", "siglip": "SiglipModel"}
REFUSED = {
    "siglip2": "SigLIP 2 NaFlex (Siglip2Model) feeds its vision tower patch sequences with pixel_attention_mask and "
    "spatial_shapes, which this server's image preprocessing does not reproduce; the fixed-resolution SigLIP 2 "
    "checkpoints (SiglipModel) are served"
}
ST_MODULES = {"CLIPModel", "Transformer"}  # what sentence-transformers calls the CLIP module (before and since 5.4)


@dataclass(frozen=True)
class ImageTextFolder:
    """What an image-text folder says: where the transformers model is, what it is, how its vectors are finished."""

    model_type: str  # config.json model_type: clip | siglip
    architecture: str  # the transformers class: CLIPModel | SiglipModel
    model_dir: str  # folder (relative to the model folder) with config.json, weights, tokenizer, image processor
    sentence_transformers: bool  # a sentence-transformers folder: vectors as encode() returns them
    normalize: bool  # answered vectors are unit length
    dimension: int  # floats per vector (the shared space's width)

    @property
    def sigmoid(self) -> bool:
        """SigLIP scores each label alone (a sigmoid); CLIP over the labels (a softmax), as the pipeline does."""
        return "siglip" in self.model_type

    def describe(self) -> dict[str, Any]:
        return {
            "layout": "sentence-transformers" if self.sentence_transformers else "transformers",
            "normalized": self.normalize,
            "zero_shot_scores": "sigmoid" if self.sigmoid else "softmax",
        }


def _dimension(config: dict[str, Any]) -> int:
    """The shared space's width: CLIP projects both towers to projection_dim (default 512); SigLIP's vision head
    keeps the vision width (default 768), which its text head projects to."""
    if config.get("model_type") == "clip":
        return int(config.get("projection_dim") or 512)
    return int((config.get("vision_config") or {}).get("hidden_size") or 768)


def _architecture(config: dict[str, Any], where: str) -> tuple[str, str]:
    model_type = str(config.get("model_type", ""))
    if model_type in REFUSED:
        raise FolderError(f"{where}config.json", REFUSED[model_type], "serve a CLIP or SigLIP folder")
    if model_type not in ARCHITECTURES:
        raise FolderError(
            f"{where}config.json",
            f"model_type {model_type!r} is not an image-text model this server runs ({sorted(ARCHITECTURES)})",
            "save a transformers CLIPModel or SiglipModel (or a sentence-transformers CLIP model)",
        )
    return model_type, ARCHITECTURES[model_type]


def is_image_text_folder(folder: Path) -> bool:
    """Whether FOLDER holds an image-text model (what detect_kind asks), without refusing anything yet."""
    config = optional_json(folder, "config.json")
    if config.get("model_type") in ARCHITECTURES or config.get("model_type") in REFUSED:
        return True
    modules = _modules(folder)
    if modules and module_name(modules[0]) in ST_MODULES:
        sub = optional_json(folder / str(modules[0].get("path", "")), "config.json")
        return sub.get("model_type") in ARCHITECTURES or sub.get("model_type") in REFUSED
    return False


def _modules(folder: Path) -> list[dict[str, Any]]:
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []


def read_image_text_folder(folder: Path) -> ImageTextFolder:
    """The folder as an image-text model, or a FolderError naming the file, the problem and the fix."""
    modules = _modules(folder)
    if modules:
        first = modules[0]
        if module_name(first) not in ST_MODULES:
            raise FolderError(
                "modules.json",
                f"its first module is {module_name(first)!r}, not sentence-transformers' CLIP model module",
                "save the CLIP model with sentence-transformers (SentenceTransformer('clip-...').save(folder))",
            )
        rest = [module_name(m) for m in modules[1:]]
        unknown = [name for name in rest if name != "Normalize"]
        if unknown:
            raise FolderError(
                "modules.json",
                f"modules {unknown} after the CLIP model are not served (only Normalize is)",
                "save the model without them",
            )
        model_dir = str(first.get("path", "")).strip("/")
        where = f"{model_dir}/" if model_dir else ""
        config = optional_json(folder / model_dir, "config.json")
        model_type, architecture = _architecture(config, where)
        return ImageTextFolder(model_type, architecture, model_dir, True, "Normalize" in rest, _dimension(config))
    config = optional_json(folder, "config.json")
    model_type, architecture = _architecture(config, "")
    return ImageTextFolder(model_type, architecture, "", False, True, _dimension(config))


class ImageTower(torch.nn.Module):
    """The vision tower and its projection: pixel values [batch, 3, H, W] -> vectors [batch, dimension]. What the
    engine gates, converts and compiles (the costly half of the model)."""

    model: Any  # the transformers CLIPModel / SiglipModel

    def __init__(self, model: torch.nn.Module, normalize: bool) -> None:
        super().__init__()
        self.model = model
        self.normalize = normalize

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = next(self.model.vision_model.parameters()).dtype  # a bf16 candidate takes bf16 pixels
        features = self.model.get_image_features(pixel_values=pixel_values.to(dtype)).pooler_output.float()
        return torch.nn.functional.normalize(features, dim=-1) if self.normalize else features


class TextTower(torch.nn.Module):
    """The text tower and its projection: token ids (and the attention mask, where the tokenizer makes one: SigLIP's
    does not) -> vectors [batch, dimension]."""

    model: Any  # the transformers CLIPModel / SiglipModel

    def __init__(self, model: torch.nn.Module, normalize: bool) -> None:
        super().__init__()
        self.model = model
        self.normalize = normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        features = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        return torch.nn.functional.normalize(features, dim=-1) if self.normalize else features


@dataclass(frozen=True)
class ZeroShotScores:
    """A model's zero-shot scores as transformers' pipeline computes them from ``logits_per_image``: the cosine of an
    image and a label's text, times ``exp(logit_scale)``, plus ``logit_bias`` (SigLIP's; 0 for CLIP), then a softmax
    over the labels (CLIP) or a sigmoid per label (SigLIP)."""

    scale: float
    bias: float
    sigmoid: bool

    @classmethod
    def of(cls, model: Any, sigmoid: bool) -> ZeroShotScores:
        bias = float(model.logit_bias.detach().float()) if hasattr(model, "logit_bias") else 0.0
        return cls(float(model.logit_scale.detach().float().exp()), bias, sigmoid)

    def __call__(self, image_vectors: torch.Tensor, label_vectors: torch.Tensor) -> torch.Tensor:
        """[images, labels] scores."""
        images = torch.nn.functional.normalize(image_vectors.float(), dim=-1)
        labels = torch.nn.functional.normalize(label_vectors.float(), dim=-1)
        logits = images @ labels.T * self.scale + self.bias
        return torch.sigmoid(logits) if self.sigmoid else logits.softmax(dim=-1)


@dataclass
class ImageTextModel:
    """Both towers of one model (sharing its weights) and its zero-shot scores."""

    image: ImageTower
    text: TextTower
    scores: ZeroShotScores


def load_image_text_model(model_dir: str | Path, folder: ImageTextFolder) -> ImageTextModel:
    """The folder's transformers model (fp32, eval mode, offline) as its two towers."""
    from handlers.text.model import hf_load_options, transformers_class

    where = Path(model_dir) / folder.model_dir
    model = transformers_class(folder.architecture).from_pretrained(str(where), **hf_load_options()).eval()
    return ImageTextModel(
        ImageTower(model, folder.normalize),
        TextTower(model, folder.normalize),
        ZeroShotScores.of(model, folder.sigmoid),
    )


# SigLIP's text tower was trained on texts padded to 64 tokens and reads no attention mask (the padding counts):
# transformers' zero-shot pipeline pads every SigLIP text to 64, and so does this server.
SIGLIP_TEXT_TOKENS = 64


def text_tokenizer_options(model_type: str, max_tokens: int) -> dict[str, Any]:
    """The tokenizer arguments transformers' zero-shot-image-classification pipeline uses for this model type, with
    truncation at the text tower's limit (a longer text is cut, and answered as cut)."""
    if "siglip" in model_type:
        return {"padding": "max_length", "max_length": SIGLIP_TEXT_TOKENS, "truncation": True}
    return {"padding": True, "truncation": True, "max_length": max_tokens}


@dataclass(frozen=True)
class EncodedText:
    vector: torch.Tensor  # fp32
    tokens: int  # tokens the tower read (after the cut), special tokens included, padding not
    truncated: bool  # the text was longer than the tower's limit and was cut


class TextEncoder:
    """Texts -> the text tower's vectors, with the folder's own tokenizer (transformers' AutoTokenizer, called as the
    pipeline calls it), and a small LRU of texts already computed (zero-shot labels and their template repeat); and
    the model's zero-shot scores. The image-text kind's companion: what a request's answer computes texts with.

    Why not the project's one text path (handlers/text/tokenization.py, buckets, caches): that path pads on the right
    per length bucket with an attention mask and never to a fixed length, and it is staged from a TextModelFolder
    (text_model.json). SigLIP's text tower reads no attention mask and pools at the last position, so it must see
    exactly the pipeline's padding to 64 tokens; a second padding mode in the shared path and a text-side staging of
    image-text folders were more than this change could carry. Texts here are short (queries, labels), one tokenizer
    call per request; moving them onto the shared path (and its shared cache tier) is the next step.
    """

    def __init__(
        self,
        tokenizer: Any,
        tower: TextTower,
        scores: ZeroShotScores,
        model_type: str,
        max_positions: int,
        cache_size: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.tower = tower
        self.scores = scores
        limit = int(getattr(tokenizer, "model_max_length", max_positions) or max_positions)
        self.max_tokens = min(limit, max_positions)
        self.options = text_tokenizer_options(model_type, self.max_tokens)
        self.cache_size = cache_size
        self.cache: OrderedDict[str, EncodedText] = OrderedDict()

    def encode(self, texts: list[str]) -> list[EncodedText]:
        """Each text's vector (the cached ones from the LRU, the others computed together)."""
        found: dict[str, EncodedText] = {}
        for text in texts:
            if text in self.cache:
                self.cache.move_to_end(text)
                found[text] = self.cache[text]
        missing = list(dict.fromkeys(text for text in texts if text not in found))
        if missing:
            lengths = [len(ids) for ids in self.tokenizer(missing, truncation=False)["input_ids"]]
            inputs = self.tokenizer(missing, return_tensors="pt", **self.options)
            with torch.inference_mode():
                vectors = self.tower(inputs["input_ids"], inputs.get("attention_mask")).float()
            for text, vector, length in zip(missing, vectors, lengths, strict=True):
                found[text] = EncodedText(vector.clone(), min(length, self.max_tokens), length > self.max_tokens)
                if self.cache_size:
                    self.cache[text] = found[text]
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return [found[text] for text in texts]


def load_text_encoder(
    model_dir: str | Path, folder: ImageTextFolder, tower: TextTower, cache_size: int = 1024
) -> TextEncoder:
    """The folder's tokenizer (offline) with the text tower and the model's zero-shot scores."""
    from transformers import AutoTokenizer

    from handlers.text.model import hf_load_options

    hf_load_options()  # offline, quiet
    where = Path(model_dir) / folder.model_dir
    tokenizer = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    positions = int(tower.model.config.text_config.max_position_embeddings)
    scores = ZeroShotScores.of(tower.model, folder.sigmoid)
    return TextEncoder(tokenizer, tower, scores, folder.model_type, positions, cache_size)
