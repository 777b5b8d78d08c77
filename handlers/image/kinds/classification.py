"""Image classifiers: any folder transformers' ``AutoModelForImageClassification`` loads (ViT, DeiT, ConvNeXt,
ResNet, Swin, BiT, DINOv2 with a head, ...), answered as transformers' ``image-classification`` pipeline answers:
per image, the labels with their scores, best first, ``top_k`` of them (default 5, at most the number of labels).

Scores are what the pipeline applies by default: a softmax over labels for a single-label classifier, a sigmoid per
label for a multi-label or one-output one, the raw value for a regression head. The gate compares those scores
(1 - the largest difference), as the text classifiers' does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn

from handlers.core.errors import RequestError
from handlers.core.http import Float32, RequestView
from handlers.image.folder import ImageModelFolder
from handlers.image.inputs import images_from_request
from handlers.image.kinds.base import ImageKind, ImageReference, load_options
from handlers.image.requests import ImageRequest, ImageRequestContext, int_option
from handlers.text.cache import CachedRow
from handlers.text.folder import FolderError, optional_json
from handlers.text.labels import MULTI_LABEL, REGRESSION, SINGLE_LABEL, probabilities

DEFAULT_TOP_K = 5  # the pipeline's


class ImageClassifierModule(nn.Module):
    """The transformers classifier as the engine serves it: pixel_values in its own dtype, fp32 logits out."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = next(self.body.parameters()).dtype  # a bf16 candidate takes bf16 pixels
        return self.body(pixel_values=pixel_values.to(dtype)).logits.to(torch.float32)


class TransformersImageClassifierReference(ImageReference):
    """transformers' own image processor and model of the folder, one image at a time."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        self.processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
        self.body = AutoModelForImageClassification.from_pretrained(str(folder), **load_options()).eval()

    def answer(self, image: Image.Image) -> torch.Tensor:
        inputs = self.processor(images=image, return_tensors="pt")
        with torch.inference_mode():
            return self.body(**inputs).logits.float()[0]


class ImageClassificationKind(ImageKind):
    name = "image-classification"
    reference_library = "transformers AutoImageProcessor + AutoModelForImageClassification"
    default_min_cosine = 0.99
    gate_measure = "1 - largest score difference"

    def read_folder(self, folder: Path) -> ImageModelFolder:
        config = optional_json(folder, "config.json")
        architectures = [str(name) for name in config.get("architectures") or []]
        heads = [name for name in architectures if name.endswith("ForImageClassification")]
        if not heads:
            raise FolderError(
                "config.json",
                f"architectures {architectures} has no *ForImageClassification head",
                "save the fine-tuned AutoModelForImageClassification (save_pretrained), not the base model",
            )
        id2label = config.get("id2label") or {}
        try:
            keys = sorted(id2label, key=int)
        except (TypeError, ValueError):
            raise FolderError(
                "config.json", "id2label keys must be 0..n-1", "save the model with save_pretrained"
            ) from None
        if not keys or [int(key) for key in keys] != list(range(len(keys))):
            raise FolderError("config.json", "id2label must map 0..n-1 to label names", "set id2label before saving")
        labels = tuple(str(id2label[key]) for key in keys)
        problem_type = config.get("problem_type") or (SINGLE_LABEL if len(labels) > 1 else MULTI_LABEL)
        if problem_type not in (SINGLE_LABEL, MULTI_LABEL, REGRESSION):
            raise FolderError("config.json", f"problem_type {problem_type!r} is unknown", "use a transformers one")
        # The pipeline's default function_to_apply, read the same way.
        activation = {SINGLE_LABEL: "softmax", MULTI_LABEL: "sigmoid", REGRESSION: "identity"}[problem_type]
        return ImageModelFolder(
            kind=self.name,
            model_type=str(config.get("model_type") or ""),
            body_class=heads[0],
            output_size=len(labels),
            labels=labels,
            problem_type=problem_type,
            activation=activation,
        )

    def build_module(self, folder: Path, info: ImageModelFolder) -> nn.Module:
        from handlers.text.model import transformers_class

        body = transformers_class(info.body_class).from_pretrained(str(folder), **load_options())
        return ImageClassifierModule(body).eval()

    def load_reference(self, folder: Path, info: ImageModelFolder) -> ImageReference:
        return TransformersImageClassifierReference(folder)

    def similarity(self, info: ImageModelFolder, expected: torch.Tensor, got: torch.Tensor) -> float:
        difference = (probabilities(expected, info.activation) - probabilities(got, info.activation)).abs()
        if not torch.isfinite(difference).all():
            return 0.0
        return 1.0 - float(difference.max()) if difference.numel() else 1.0

    def parity(self, info: ImageModelFolder, expected: list[torch.Tensor], ours: list[Any]) -> float:
        # The same bound as text (0.9999) on the scores a client reads.
        return self.similarity(info, torch.stack([e.float() for e in expected]), torch.stack(ours).float())

    # ------------------------------------------------------------------------------------------- requests
    def parse_request(self, api: ImageRequestContext, body: Any, request: RequestView) -> ImageRequest:
        carried = images_from_request(body, request.content_type, api.sources)
        top_k = carried.options.get("top_k")
        options = {"top_k": DEFAULT_TOP_K if top_k is None else int_option(top_k, "top_k", 1)}
        unknown = sorted(set(carried.options) - {"top_k"})
        if unknown:
            raise RequestError(f"unknown field(s) {unknown}; an image classifier takes 'top_k'")
        return ImageRequest(carried.images, carried.names, carried.single, options)

    def answer(self, api: ImageRequestContext, payload: ImageRequest, rows: list[CachedRow]) -> Any:
        top_k = min(payload.options.get("top_k", DEFAULT_TOP_K), len(api.info.labels))
        answers = [self.scores(api.info, row.value, top_k) for row in rows]
        return answers[0] if payload.single else answers

    @staticmethod
    def scores(info: ImageModelFolder, logits: torch.Tensor, top_k: int) -> list[dict[str, Any]]:
        """The pipeline's answer for one image: label and score, best first (ties keep the label order, as its
        stable sort does)."""
        values = probabilities(logits, info.activation).tolist()
        order = sorted(range(len(values)), key=lambda index: -values[index])[:top_k]
        return [{"label": info.labels[index], "score": Float32(values[index])} for index in order]

    def describe(self, info: ImageModelFolder) -> dict[str, Any]:
        return {
            **super().describe(info),
            "labels": list(info.labels),
            "problem_type": info.problem_type,
            "activation": info.activation,
        }
