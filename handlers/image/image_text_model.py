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

Texts take the text models' one path (handlers/text/): the tokenizer exported and proved at package time
(:func:`stage_text_path`, handlers/text/tokenization.py), padded by the text path's rule (handlers/text/buckets.py:
SigLIP's fixed 64 tokens, CLIP's length buckets), cached in its row caches (:class:`TextEncoder`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from handlers.text.buckets import PaddingRule, right_padded
from handlers.text.cache import CachedRow, CacheKey, RowCache, cache_key
from handlers.text.folder import NO_LIMIT, FolderError, optional_json
from handlers.text.modules import module_name
from handlers.text.shared_cache import Namespace

if TYPE_CHECKING:
    from handlers.image.kinds.base import CompanionContext
    from handlers.text.shared_cache import SharedCache
    from handlers.text.tokenization import ServedTokenizer

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
    def siglip(self) -> bool:
        """SigLIP or SigLIP 2 (transformers' pipeline decides its scores and text padding by this test)."""
        return "siglip" in self.model_type

    @property
    def sigmoid(self) -> bool:
        """SigLIP scores each label alone (a sigmoid); CLIP over the labels (a softmax), as the pipeline does."""
        return self.siglip

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


# transformers' zero-shot pipeline pads every SigLIP text to 64 tokens (what SigLIP was trained on; its text tower pools
# at the last position, so the padding is part of what it reads), and so does this server.
SIGLIP_TEXT_TOKENS = 64
# Padded tokens one forward pass of the text tower may hold (a request carries at most 64 short texts).
TEXT_FORWARD_TOKENS = 8192


@dataclass(frozen=True)
class TextTowerFolder:
    """The text tower's tokenizer as the text path's export reads it (handlers/text/tokenization.py
    TokenizerFolder): where it is and the token limit."""

    transformer_dir: str
    max_tokens: int
    remote_code: bool = False


def text_token_limit(model_dir: Path, folder: ImageTextFolder) -> int:
    """Tokens a text is cut at: SigLIP's 64 (the pipeline's fixed length); for CLIP the text tower's positions, or
    the tokenizer's model_max_length where that is smaller (CLIP's 77 both)."""
    where = f"{folder.model_dir}/" if folder.model_dir else ""
    config = optional_json(model_dir / folder.model_dir, "config.json")
    default = SIGLIP_TEXT_TOKENS if folder.siglip else 77
    positions = int((config.get("text_config") or {}).get("max_position_embeddings") or default)
    if folder.siglip:
        if positions < SIGLIP_TEXT_TOKENS:
            raise FolderError(
                f"{where}config.json",
                f"text_config.max_position_embeddings is {positions}, fewer than the {SIGLIP_TEXT_TOKENS} tokens "
                f"transformers pads every SigLIP text to",
                "save the model's own config.json",
            )
        return SIGLIP_TEXT_TOKENS
    limit = optional_json(model_dir / folder.model_dir, "tokenizer_config.json").get("model_max_length")
    if isinstance(limit, (int, float)) and 0 < limit < NO_LIMIT:
        return min(int(limit), positions)
    return positions


def stage_text_path(source: Path, model_dir: Path, folder: ImageTextFolder, texts: list[str]) -> dict[str, Any]:
    """Package time, in the staged ``model_dir`` (a copy of ``source``): the text tower's tokenizer exported by the
    text models' own steps (tokenizer.json checked, or converted from the folder's vocabulary files;
    served_tokenizer.json written, its ids proved equal to transformers' on ``texts``, long ones included, so
    truncation is proved too), and the padding transformers' zero-shot pipeline gives this model: every SigLIP text
    to 64 tokens, fed the attention mask only where its tokenizer makes one (as the pipeline feeds it); CLIP texts
    as long as the longest with a mask, which the text path's length buckets compute the same (CLIP's causal text
    tower pools at its end-of-text token, before any padding). What image_model.json records for
    :func:`load_text_encoder`."""
    from handlers.text.tokenization import ensure_tokenizer_file, export_tokenizer

    tower = TextTowerFolder(folder.model_dir, text_token_limit(model_dir, folder))
    ensure_tokenizer_file(source, model_dir, tower)
    tokenizer = export_tokenizer(model_dir, tower, {"input_ids", "attention_mask"}, texts)
    max_tokens = tower.max_tokens
    if folder.siglip:
        padding = PaddingRule(max_tokens, SIGLIP_TEXT_TOKENS, "attention_mask" in tokenizer["tokenizer_inputs"])
    else:
        padding = PaddingRule(max_tokens)
    return {"tokenizer": tokenizer, "padding": padding.record()}


class TextEncoder:
    """Texts -> the text tower's vectors, on the text models' one path: the packaged tokenizer
    (handlers/text/tokenization.py ServedTokenizer, ``tokenizers`` alone, the ids transformers gives), the padding
    rule recorded at package time (handlers/text/buckets.py PaddingRule: SigLIP's fixed 64 tokens, CLIP's length
    buckets), and the text rows' caches (handlers/text/cache.py: the worker's LRU keyed by the text, the model's
    identity, version, precision and token limit; then the model's shared tier, handlers/text/shared_cache.py, in a
    namespace of its texts beside its images). Zero-shot labels and their template repeat, so most are hits. Also
    the model's zero-shot scores. The image-text kind's companion: what a request's answer computes texts with."""

    def __init__(
        self,
        tokenizer: ServedTokenizer,
        padding: PaddingRule,
        tower: TextTower,
        scores: ZeroShotScores,
        cache: RowCache,
        identity: str = "",
        version: str = "0",
        shared: SharedTier | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.padding = padding
        self.tower = tower
        self.scores = scores
        self.cache = cache
        self.identity = identity
        self.version = version
        self.shared = shared

    @property
    def max_tokens(self) -> int:
        return self.padding.max_tokens

    def key(self, text: str) -> CacheKey:
        # The text tower always computes in fp32 (the engine converts and compiles only the image tower).
        return cache_key(text, self.version, "fp32", self.max_tokens, identity=self.identity)

    def encode(self, texts: list[str]) -> list[CachedRow]:
        """Each text's row (its fp32 vector, its tokens after the cut, whether it was cut): from the worker's LRU,
        then the shared tier (one round trip for the LRU's misses), the rest computed together."""
        keys = [self.key(text) for text in texts]
        found: dict[CacheKey, CachedRow] = {}
        missing: dict[CacheKey, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key in found or key in missing:
                continue
            cached = self.cache.get(key)
            if cached is not None:
                found[key] = cached
            else:
                missing[key] = text
        shared = self.shared
        if shared is not None and missing:
            for key, entry in shared.get_many(list(missing)).items():
                found[key] = entry
                self.cache.put(key, entry)
                del missing[key]
        if missing:
            computed = self.compute(list(missing.values()))
            for key, entry in zip(missing, computed, strict=True):
                found[key] = entry
                self.cache.put(key, entry)
            if shared is not None:
                shared.put_many(list(zip(missing, computed, strict=True)))
        return [found[key] for key in keys]

    def compute(self, texts: list[str]) -> list[CachedRow]:
        """The text tower on ``texts``: tokenized (cut at the limit), padded by the rule, one pass per group."""
        encodings = self.tokenizer.encode_batch(texts)
        lengths = [len(encoding.ids) for encoding in encodings]
        rows: list[CachedRow | None] = [None] * len(texts)
        for group in self.padding.groups(lengths, TEXT_FORWARD_TOKENS):
            ids, mask = right_padded(
                [encodings[row].ids for row in group.rows], self.tokenizer.pad_id, group.pad_length
            )
            attention = torch.tensor(mask, dtype=torch.long) if self.padding.mask else None
            with torch.inference_mode():
                vectors = self.tower(torch.tensor(ids, dtype=torch.long), attention).float()
            for row, vector in zip(group.rows, vectors, strict=True):
                rows[row] = CachedRow(vector.clone(), lengths[row], bool(encodings[row].overflowing))
        return [row for row in rows if row is not None]

    def describe(self) -> dict[str, Any]:
        return {
            "texts": {
                "tokenizer": "served_tokenizer.json (tokenizers)",
                "padding": self.padding.record(),
                "cache_size": self.cache.capacity,
                "cached": len(self.cache),
                "shared_cache": self.shared is not None and self.shared.client() is not None,
            }
        }


class SharedTier:
    """The image-text model's texts in its shared tier: the engine's one client (its connection, breaker and the
    events the handler records per batch), in a namespace of their own (the text limit as its token bound, the
    text tower's fp32), read when used because the engine opens its client after loading the model."""

    def __init__(self, client: Callable[[], SharedCache | None], namespace: Namespace, accepts: Callable[[Any], bool]):
        self.client = client
        self.namespace = namespace
        self.accepts = accepts

    def get_many(self, keys: list[CacheKey]) -> dict[CacheKey, CachedRow]:
        client = self.client()
        return client.get_many(keys, self.namespace, self.accepts) if client is not None else {}

    def put_many(self, entries: list[tuple[CacheKey, CachedRow]]) -> None:
        client = self.client()
        if client is not None:
            client.put_many(entries, self.namespace)


def load_text_encoder(
    model_dir: str | Path,
    folder: ImageTextFolder,
    tower: TextTower,
    staged: dict[str, Any] | None,
    context: CompanionContext | None = None,
    accepts: Callable[[Any], bool] = lambda value: True,
) -> TextEncoder:
    """The packaged tokenizer and padding rule (``staged``: what image_model.json records, :func:`stage_text_path`)
    with the text tower and the model's zero-shot scores; ``context``: the worker's caches' settings and keys
    (None: nothing cached, the package-time parity check). A folder staged before its texts were is refused."""
    from handlers.text.tokenization import served_tokenizer

    if not staged or "tokenizer" not in staged or "padding" not in staged:
        raise FolderError(
            "image_model.json",
            "records no text tokenizer (served_tokenizer.json): the folder was staged by an older version",
            "package the model again with python -m scripts.package",
        )
    padding = PaddingRule.from_record(staged["padding"])
    tokenizer = served_tokenizer(model_dir, staged["tokenizer"], padding.max_tokens)
    scores = ZeroShotScores.of(tower.model, folder.sigmoid)
    if context is None:
        return TextEncoder(tokenizer, padding, tower, scores, RowCache(0))
    cache = RowCache(int(context.config["text_cache_size"]))  # handler.text_cache_size (handlers/image/engine.py)
    namespace = Namespace(
        context.name, context.version, "eager", "fp32", padding.max_tokens, folder.dimension, identity=context.identity
    )
    shared = SharedTier(context.shared_tier, namespace, accepts)
    return TextEncoder(tokenizer, padding, tower, scores, cache, context.identity, context.version, shared)
