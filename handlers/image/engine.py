"""The image engine: every image model computed in process, with no TorchServe in it.

:meth:`ImageEngine.load` loads a model folder (or an unpacked archive) as a worker does: the kind its
``image_model.json`` records, the fp32 module, the backend walk with the accuracy gate on generated reference images
(handlers/image/reference.py), warm-up, and the worker's LRU cache of rows (the text side's classes,
handlers/text/cache.py), keyed by the digest of an image's bytes and the model's identity. Then requests of images
go through one path (:meth:`ImageEngine.prepare` -> :meth:`compute` -> :meth:`finish`): look each image up in the
LRU, decode only the misses (handlers/image/decode.py: an image that cannot be decoded is its request's error, and the
rest of the batch goes on), make each image's pixels as the folder's image processor does
(handlers/image/preprocess.py), stack same-shaped images into one tensor and run one forward pass per shape (at most
``max_forward_images`` rows each). What differs between kinds is the kind's (handlers/image/kinds/).

Backends: as for text models (handlers/text/backends.py), ``backend: auto`` walks the compiled candidates the packaging
step built, gated and ranked by ms/image into ``backends/`` (scripts/build_backends.py: OpenVINO fp32/bf16 and
AOTInductor of the kind's module: a classifier's logits, or the image-text kind's vision tower with its projection),
each gated again here on the reference images, then eager; or eager, torch.compile (``jit``), ``openvino``, ``aot``.
Reduced precision (bf16) serves behind the accuracy gate.

Cache: the worker's LRU, then the shared tier where ``shared_cache`` names one (the text models' Valkey/Redis tier,
handlers/text/shared_cache.py, docs/cache.md), both keyed by the image bytes' digest and the model's identity.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from handlers.core.config import COMMON_OPTIONS, ConfigError, Option
from handlers.core.engine import Candidate, Engine, EngineSettings, Loaded
from handlers.core.errors import RequestError
from handlers.image.decode import LIMIT_OPTIONS, decode_image, image_digest, image_limits
from handlers.image.folder import FolderError, ImageModelFolder, read_served
from handlers.image.inputs import SOURCE_OPTIONS, image_sources
from handlers.image.kinds import inspect_folder, kind_named
from handlers.image.kinds.base import CompanionContext, ImageKind
from handlers.image.preprocess import Preprocessing, group_by_shape
from handlers.image.reference import reference_images
from handlers.text import backends
from handlers.text.batch import ask_shared_tier
from handlers.text.cache import CachedRow, CacheKey, RowCache
from handlers.text.shared_cache import SHARED_CACHE_OPTION, Namespace, SharedCache, open_shared_cache

logger = logging.getLogger(__name__)

IMAGE_MODEL_OPTIONS: dict[str, Option] = {
    **COMMON_OPTIONS,
    "backend": backends.BACKEND_OPTION,
    "shared_cache": SHARED_CACHE_OPTION,
    **LIMIT_OPTIONS,
    **SOURCE_OPTIONS,
    "max_forward_images": Option(
        int, 32, minimum=1, help="images one forward pass may hold (a larger batch of one shape is split)"
    ),
    "cache_size": Option(int, 1024, minimum=0, help="images' rows kept in the worker's LRU cache; 0 disables it"),
    "text_cache_size": Option(
        int,
        1024,
        minimum=0,
        help="an image-text model's texts kept in the worker's LRU cache (labels and queries repeat); 0 disables it",
    ),
}


def kind_options(kind: ImageKind) -> dict[str, Option]:
    """The image engine's options with the kind's own defaults (a classifier's gate bound differs)."""
    options = dict(IMAGE_MODEL_OPTIONS)
    for key, default in kind.options_defaults().items():
        options[key] = replace(options[key], default=default)
    return options


def served_kind(model_dir: str, pinned: str | None = None, pinned_by: str = "") -> ImageKind:
    """The kind a model folder holds (its image_model.json), which a ``pinned`` kind must match."""
    try:
        recorded = read_served(Path(model_dir)).get("kind")
    except FolderError as error:
        raise ConfigError(f"model folder: {error}") from None
    name = recorded or pinned
    if name is None:
        raise ConfigError(
            "model folder: image_model.json is missing, so the model's kind is unknown; package the model with "
            "python -m scripts.package"
        )
    if pinned is not None and name != pinned:
        raise ConfigError(f"model folder: the archive holds a {name} model, which {pinned_by} does not serve")
    return kind_named(name)


# What an image row counts as in the shared tier's value format (handlers/text/shared_cache.py), which checks a
# stored row's token count against its namespace's limit: one image.
IMAGE_ROW_TOKENS = 1


def image_cache_key(digest: str, identity: str, version: str, precision: str) -> CacheKey:
    """The text cache's key shape for an image: a digest of its bytes' digest behind a leading 0xff byte, which no
    UTF-8 text (a text row's key) can start with, so an image and a text of one model never share a key."""
    row = hashlib.blake2b(b"\xffimage" + digest.encode(), digest_size=16).digest()
    return (row, identity, version, precision, 0)


@dataclass
class LoadedImageModel(Loaded):
    """An image model and what serving it needs, as loaded from its folder."""

    info: ImageModelFolder
    preprocessing: Preprocessing
    companion: Any = None  # what the kind loaded beside the module (ImageKind.load_companion)


class ImagesRequest(Protocol):
    """What batch assembly needs of a request: each image's raw bytes, and what its refusal calls each."""

    @property
    def images(self) -> Sequence[bytes]: ...

    @property
    def names(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class ImagePass:
    rows: list[int]  # positions among the batch's computed rows
    pixels: torch.Tensor  # (rows, 3, height, width) float32


@dataclass(frozen=True)
class ImageStats:
    rows: int  # images of accepted requests (cached or computed)
    hits: int  # distinct images answered from the worker's cache
    shared_hits: int  # distinct images answered from the shared tier (not counted in hits)
    misses: int  # distinct images computed
    decode_seconds: float
    preprocess_seconds: float


@dataclass
class ImageBatch:
    """What prepare hands on: cached rows, images to compute (as same-shaped groups) and per-request errors."""

    keys: list[list[CacheKey]]
    known: dict[CacheKey, CachedRow]
    errors: list[RequestError | None]
    compute_keys: list[CacheKey] = field(default_factory=list)
    passes: list[ImagePass] = field(default_factory=list)
    stats: ImageStats | None = None

    @property
    def rows(self) -> int:
        return self.stats.rows if self.stats is not None else 0


@dataclass(frozen=True)
class ComputedImages:
    batch: ImageBatch
    values: list[Any]  # one per computed row, the kind's row_value


@dataclass(frozen=True)
class ImageRow:
    """One image as a request of its own (:meth:`ImageEngine.encode`)."""

    images: tuple[bytes]
    names: tuple[str]


class ImageEngine(Engine):
    """An image model loaded for computing rows; :meth:`load` makes one from a folder."""

    loaded: LoadedImageModel

    def __init__(self, settings: EngineSettings, kind: ImageKind) -> None:
        self.kind = kind
        super().__init__(settings, kind_options(kind))
        self.limits = image_limits(self.config)
        self.sources = image_sources(self.config, self.limits)

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        config: Mapping[str, Any] | None = None,
        kind: str | None = None,
        threads: int | None = None,
        name: str = "image-model",
        version: str = "1",
    ) -> ImageEngine:
        """The model in ``model_dir`` loaded and warmed up: ``config`` is its ``handler:`` section (what differs from
        the defaults), ``kind`` the kind it must be (None: what its image_model.json says)."""
        handler_config = dict(config or {})
        if threads is not None:
            handler_config["threads"] = threads
        settings = EngineSettings(str(model_dir), handler_config, name, version)
        engine = cls(settings, served_kind(settings.model_dir, kind, f"the {kind} engine"))
        engine.start()
        return engine

    def start(self) -> None:
        super().start()
        self.cache = RowCache(self.config["cache_size"])
        info = self.loaded.info
        # As for text (handlers/text/engine.py): the shared tier's keys name everything that decides a row, the
        # model's content (identity) included, so another version or re-packaged model never reads these entries.
        # An image is one row of output_size floats, its "tokens" 1 (IMAGE_ROW_TOKENS).
        namespace = Namespace(
            self.model_name,
            self.model_version,
            self.backend,
            self.precision,
            IMAGE_ROW_TOKENS,
            info.output_size,
            identity=self.identity,
        )
        self.shared_cache: SharedCache | None = open_shared_cache(
            self.config["shared_cache"], namespace, lambda value: self.kind.check_value(info, value)
        )

    # ----------------------------------------------------------------------------------------------- load time
    def load_model(self, model_dir: str) -> LoadedImageModel:
        try:
            info = inspect_folder(model_dir, self.kind.name)
        except FolderError as error:
            raise ConfigError(f"model folder: {error}") from None
        if info.preprocessing is None:
            raise ConfigError(
                "model folder: image_model.json is missing (the image processor's steps are recorded there); "
                "package the model with python -m scripts.package"
            )
        module = self.kind.build_module(Path(model_dir), info)
        # The companion's caches are keyed like the images' (identity, version) and share their tier, which start()
        # opens once the served backend is chosen: the companion reads it when it uses it.
        context = CompanionContext(
            self.model_name,
            self.model_version,
            self.identity,
            self.config,
            lambda: getattr(self, "shared_cache", None),
        )
        try:
            companion = self.kind.load_companion(Path(model_dir), info, module, context)
        except FolderError as error:
            raise ConfigError(f"model folder: {error}") from None
        return LoadedImageModel(model=module, info=info, preprocessing=info.preprocessing, companion=companion)

    def reference_batch(self, loaded: LoadedImageModel) -> list[torch.Tensor]:
        """The reference images as served: one tensor per pixel shape."""
        return self.pixel_groups(loaded.preprocessing, [loaded.preprocessing.pixels(im) for im in reference_images()])

    def pixel_groups(self, preprocessing: Preprocessing, pixels: Sequence[np.ndarray]) -> list[torch.Tensor]:
        return [preprocessing.tensor([pixels[i] for i in group]) for group in group_by_shape(pixels)]

    def reference_output(self, model: Any, reference: list[torch.Tensor]) -> Any:
        return [self.forward(model, pixels).to("cpu", torch.float32) for pixels in reference]

    def gate_similarity(self, loaded: LoadedImageModel, expected: Any, got: Any) -> float:
        """The kind's measure, the worst over the reference groups."""
        return min(self.kind.similarity(loaded.info, want, have) for want, have in zip(expected, got, strict=True))

    def warmup_batches(self, loaded: LoadedImageModel) -> list[torch.Tensor]:
        """eager: one image warms the kernels; jit: one and two images of each reference shape (dynamic shapes
        specialise size 1)."""
        reference = self.reference_batch(loaded)
        if self.backend == "eager":
            return [reference[0][:1]]
        return [group[:count] for group in reference for count in (1, 2) if len(group) >= count]

    def forward(self, model: Any, batch: torch.Tensor) -> torch.Tensor:
        return model(batch.to(self.device))

    def backend_candidates(self, loaded: LoadedImageModel, precision: str) -> list[Candidate]:
        """auto: the archive's prebuilt candidates best first, then eager (as for text models)."""
        if self.config["backend"] != "auto":
            return super().backend_candidates(loaded, precision)
        return backends.auto_candidates(self.model_dir, precision)

    def load_backend(self, backend: str, precision: str, fp32_model: torch.nn.Module, loaded: LoadedImageModel) -> Any:
        if backend not in ("aot", "openvino"):
            return super().load_backend(backend, precision, fp32_model, loaded)
        if self.config["backend"] == "auto":
            backends.check_prebuilt(precision, self.device, self.config["precision"])
        return backends.load_backend(
            backend,
            precision,
            self.model_dir,
            fp32_model,
            self.threads,
            self.device,
            max_rows=self.config["max_forward_images"],
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "model": self.kind.describe(self.loaded.info),
            "cache_size": self.config["cache_size"],
            "cached": len(self.cache),
            "shared_cache": self.shared_cache.describe() if self.shared_cache is not None else None,
            "companion": describe() if callable(describe := getattr(self.loaded.companion, "describe", None)) else None,
            "dimension": self.loaded.info.output_size,
            "limits": {key: self.config[key] for key in (*LIMIT_OPTIONS, *SOURCE_OPTIONS)},
        }

    # ----------------------------------------------------------------------------------------------- rows
    def cache_key(self, digest: str) -> CacheKey:
        return image_cache_key(digest, self.identity, self.model_version, self.precision)

    def prepare(self, requests: Sequence[ImagesRequest]) -> ImageBatch:
        """Cache lookups by the images' digests; decode and preprocess the misses (an image that fails is its
        request's error); same-shaped pixels stacked into forward passes. Call it outside inference mode."""
        import time

        batch = ImageBatch(keys=[], known={}, errors=[None] * len(requests))
        misses: dict[CacheKey, tuple[bytes, str]] = {}  # key -> (bytes, name) of a distinct image to compute
        for request in requests:
            keys = [self.cache_key(image_digest(data)) for data in request.images]
            batch.keys.append(keys)
            for key, data, name in zip(keys, request.images, request.names, strict=True):
                if key in batch.known or key in misses:
                    continue
                cached = self.cache.get(key)
                if cached is not None:
                    batch.known[key] = cached
                else:
                    misses[key] = (data, name)
        hits = len(batch.known)
        if self.shared_cache is not None and misses:
            # One round trip for the LRU's misses; what it finds joins the LRU and is neither decoded nor computed.
            for key in ask_shared_tier(self.shared_cache, self.cache, batch.known, list(misses)):
                del misses[key]
        started = time.perf_counter()
        decoded = self.decode_misses(batch, misses)
        decode_seconds = time.perf_counter() - started
        # Only the images some accepted request needs are computed, in arrival order.
        needed = {key for keys, error in zip(batch.keys, batch.errors, strict=True) if error is None for key in keys}
        batch.compute_keys = [key for key in decoded if key in needed]
        started = time.perf_counter()
        preprocessing = self.loaded.preprocessing
        pixels = [preprocessing.pixels(decoded[key]) for key in batch.compute_keys]
        limit = self.config["max_forward_images"]
        for group in group_by_shape(pixels):
            for start in range(0, len(group), limit):
                rows = group[start : start + limit]
                batch.passes.append(ImagePass(rows, preprocessing.tensor([pixels[row] for row in rows])))
        batch.stats = ImageStats(
            rows=sum(len(keys) for keys, error in zip(batch.keys, batch.errors, strict=True) if error is None),
            hits=hits,
            shared_hits=len(batch.known) - hits,
            misses=len(batch.compute_keys),
            decode_seconds=decode_seconds,
            preprocess_seconds=time.perf_counter() - started,
        )
        return batch

    def decode_misses(self, batch: ImageBatch, misses: dict[CacheKey, tuple[bytes, str]]) -> dict[CacheKey, Any]:
        """Decode each image the cache missed, once, request by request: the first image of a request that cannot
        be decoded is that request's error (its later images are decoded only where another request needs them)."""
        decoded: dict[CacheKey, Any] = {}
        failed: dict[CacheKey, RequestError] = {}
        for number, keys in enumerate(batch.keys):
            for key in keys:
                if key in batch.known or key in decoded:
                    continue
                if key not in failed:
                    data, name = misses[key]
                    try:
                        decoded[key] = decode_image(data, self.limits, name=name)
                        continue
                    except RequestError as error:
                        failed[key] = error
                batch.errors[number] = failed[key]
                break
        return decoded

    def compute(self, batch: ImageBatch) -> ComputedImages:
        """One forward pass per pixel group (call it in inference mode); each row's value at its own position."""
        values: list[Any] = [None] * len(batch.compute_keys)
        for forward_pass in batch.passes:
            output = self.forward(self.loaded.model, forward_pass.pixels).to("cpu", torch.float32)
            for position, row in enumerate(forward_pass.rows):
                values[row] = self.kind.row_value(self.loaded.info, output, position)
        return ComputedImages(batch, values)

    def finish(
        self,
        computed: ComputedImages,
        requests: Sequence[ImagesRequest],
        format_answer: Callable[[Any, list[CachedRow]], Any],
    ) -> list[Any]:
        """Each request's answer, ``format_answer(request, its rows)``, or its error; computed rows join the LRU."""
        batch = computed.batch
        known = dict(batch.known)
        for key, value in zip(batch.compute_keys, computed.values, strict=True):
            known[key] = CachedRow(value, tokens=IMAGE_ROW_TOKENS, truncated=False)
        results = [
            error if error is not None else format_answer(request, [known[key] for key in keys])
            for request, keys, error in zip(requests, batch.keys, batch.errors, strict=True)
        ]
        for key in batch.compute_keys:
            self.cache.put(key, known[key])
        if self.shared_cache is not None and batch.compute_keys:
            self.shared_cache.put_many([(key, known[key]) for key in batch.compute_keys])
        return results

    def run(self, requests: Sequence[ImagesRequest], format_answer: Callable[[Any, list[CachedRow]], Any]) -> list[Any]:
        """prepare -> compute -> finish: per request its answer or its own error."""
        batch = self.prepare(requests)
        with torch.inference_mode():
            computed = self.compute(batch)
        return self.finish(computed, requests, format_answer)

    def encode(self, images: Sequence[bytes]) -> list[CachedRow | RequestError]:
        """Per image (its encoded bytes): what the model computes for it (its kind's value: a classifier's logits, an
        embedder's vector), or why that image alone cannot be computed. The images are computed together."""
        requests = [ImageRow((data,), ("image",)) for data in images]
        return self.run(requests, lambda _request, rows: rows[0])
