"""What a kind of image model is, as one class: everything in which an image classifier and an image-text embedder
differ, and nothing in which they do not.

The engine (handlers/image/engine.py: the worker's LRU keyed by the image bytes' digest, decode, the folder's
preprocessing, one forward pass per pixel shape, the accuracy gate) calls these methods and never branches on a
kind's name. A kind:

- reads its folder (:meth:`ImageKind.read_folder`: which transformers class its weights load as, its labels or
  embedding width) and builds the torch module the engine serves (:meth:`build_module`: ``pixel_values`` in, fp32
  rows out: a classifier's logits, an embedder's image vectors),
- loads the reference library and answers a reference image with it, for the package-time parity check
  (:meth:`load_reference`, :meth:`parity`; scripts/prepare_image_model.py),
- measures how close a reduced-precision or compiled candidate computes to eager fp32 (:meth:`similarity`, the gate),
- turns one row of the model's output into what is cached and answered (:meth:`row_value`),
- describes itself (:meth:`describe`), parses its own body and shapes its answer, and lists the API surfaces it
  speaks (:meth:`routes`: rows of handlers/core/routes.py).

Adding a kind is one subclass plus its rows in handlers/image/kinds/__init__.py KINDS and ``detect_kind``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from PIL import Image
from torch import nn

from handlers.core import runtime
from handlers.core.routes import Route
from handlers.image.folder import ImageModelFolder

if TYPE_CHECKING:
    from handlers.core.http import RequestView
    from handlers.image.requests import ImageRequestContext
    from handlers.text.cache import CachedRow
    from handlers.text.shared_cache import SharedCache


@dataclass(frozen=True)
class CompanionContext:
    """What a kind's companion is keyed and configured by in a worker: the engine's model name, version and identity
    (every cache key names them), its validated ``handler:`` config (``text_cache_size`` among it), and the
    engine's shared cache tier, read when used (the engine opens it after loading the model; None: no tier)."""

    name: str
    version: str
    identity: str
    config: Mapping[str, Any]
    shared_tier: Callable[[], SharedCache | None] = field(default=lambda: None)


class ImageReference:
    """The reference library's model of a folder (package time): its own processor and model, one image at a time."""

    processor: Any  # the transformers image processor the folder loads (its settings are what is recorded)

    def answer(self, image: Image.Image) -> torch.Tensor:
        """The reference library's fp32 output for one image, in the shape :meth:`ImageKind.row_value` answers."""
        raise NotImplementedError


class ImageKind:
    name: ClassVar[str]
    reference_library: ClassVar[str]  # what the parity check compares with, for messages and model_source.json
    default_min_cosine: ClassVar[float] = 0.999  # the accuracy gate's bound unless handler.min_cosine says
    gate_measure: ClassVar[str] = "row cosine"

    # ------------------------------------------------------------------------------------------- the folder
    def read_folder(self, folder: Path) -> ImageModelFolder:
        """The folder as this kind reads it, or a FolderError naming the file and the fix."""
        raise NotImplementedError

    def build_module(self, folder: Path, info: ImageModelFolder) -> nn.Module:
        """The fp32 module the engine serves, in eval mode: ``pixel_values`` (n, 3, h, w) float32 -> fp32 rows."""
        raise NotImplementedError

    def stage(self, source: Path, out: Path, info: ImageModelFolder) -> dict[str, Any]:
        """Package time, in ``out`` (the staged copy of the ``source`` folder): files the kind's worker needs beyond
        the image steps, and what image_model.json records of them (read back into ``ImageModelFolder.extra``); a
        folder that cannot be staged is refused with a FolderError naming the file and the fix. The image-text
        kind: its text tokenizer."""
        return {}

    def load_companion(
        self, folder: Path, info: ImageModelFolder, module: nn.Module, context: CompanionContext | None = None
    ) -> Any:
        """What the kind answers with beside the served module, loaded once with it (None: nothing). The image-text
        kind's text tower on the text models' path: its requests carry texts as well as images. ``module`` is the
        fp32 module :meth:`build_module` made, before the engine converts or compiles it; ``context`` the worker's
        (None at package time: nothing cached)."""
        return None

    def load_reference(self, folder: Path, info: ImageModelFolder) -> ImageReference:
        """The reference library's processor and model of the folder (package time only; imports transformers)."""
        raise NotImplementedError

    def parity(self, info: ImageModelFolder, expected: list[torch.Tensor], ours: list[Any]) -> float:
        """How close the served values (one image at a time through the served preprocessing and module) are to the
        reference library's for the same images (1.0 = the same); the bound is scripts/prepare_image_model.py's."""
        return self.similarity(info, torch.stack([e.float() for e in expected]), torch.stack(ours).float())

    def companion_parity(self, folder: Path, info: ImageModelFolder, reference: ImageReference) -> dict[str, float]:
        """What the kind proves at package time beyond the image rows, each agreement (1.0 = the same) against the
        same bound as :meth:`parity` (the image-text kind: its text vectors and zero-shot scores); none by default."""
        return {}

    # ------------------------------------------------------------------------------------------- the gate
    def similarity(self, info: ImageModelFolder, expected: torch.Tensor, got: torch.Tensor) -> float:
        """The accuracy gate's measure between a candidate's output and eager fp32's (1.0 = identical)."""
        return runtime.min_cosine_similarity(expected, got)

    # ------------------------------------------------------------------------------------------- answers
    def row_value(self, info: ImageModelFolder, output: torch.Tensor, row: int) -> Any:
        """What one computed row caches and answers, from the forward pass's output."""
        return output[row].clone()

    def check_value(self, info: ImageModelFolder, value: Any) -> bool:
        """Whether a cached value is one this model could have computed (a shared tier's read-back)."""
        return bool(torch.isfinite(value).all())

    # ------------------------------------------------------------------------------------------- requests
    def routes(self) -> tuple[Route, ...]:
        """The API surfaces this kind serves: its own body at the model's URL; a kind adds the dialects whose
        clients it answers."""
        return (Route("", self.parse_request, self.answer, api="this project's own"),)

    def parse_request(self, api: ImageRequestContext, body: Any, request: RequestView) -> Any:
        """One request's body at the model's own URL validated into its payload (with ``images``: the raw bytes of
        each image, and ``names``: what a refusal calls each), or RequestError."""
        raise NotImplementedError

    def answer(self, api: ImageRequestContext, payload: Any, rows: list[CachedRow]) -> Any:
        """The answer to one request from its computed rows, in its own order."""
        raise NotImplementedError

    def describe(self, info: ImageModelFolder) -> dict[str, Any]:
        return {
            "kind": info.kind,
            "architecture": info.model_type,
            "body": info.body_class,
            "preprocessing": info.preprocessing.describe() if info.preprocessing is not None else None,
        }

    def options_defaults(self) -> dict[str, Any]:
        """handler: option defaults of this kind that differ from the image engine's."""
        return {"min_cosine": self.default_min_cosine}


def load_options() -> dict[str, Any]:
    """transformers' from_pretrained options for a packaged folder: offline, safetensors only, fp32, quiet (shared
    with the text side, handlers/text/model.py)."""
    from handlers.text.model import hf_load_options

    return hf_load_options(False)
