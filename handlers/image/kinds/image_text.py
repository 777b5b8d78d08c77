"""Image-text embedders: transformers ``CLIPModel`` and ``SiglipModel`` folders and sentence-transformers CLIP folders
(handlers/image/image_text_model.py says which folders and why), texts and images into one vector space.

The engine's rows are the images (the vision tower: decoded, preprocessed as the folder's image processor does,
batched, cached by digest, gated and converted like any image model's); the texts go through the text tower on the
text models' path when a request's answer is written (the kind's companion, a TextEncoder loaded beside the served
module: the tokenizer the packaging step exported and proved, :meth:`ImageTextKind.stage`, the text path's padding
rule and row caches, the model's shared tier). Requests and answers: handlers/image/image_text_requests.py. The
parity check compares the image vectors with the reference library's (handlers/image/kinds/image_text_reference.py),
and :meth:`ImageTextKind.companion_parity` the text vectors and the zero-shot scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn

from handlers.core.errors import COHERE, RequestError, too_large
from handlers.core.http import RequestView
from handlers.core.routes import Route
from handlers.image.folder import ImageModelFolder
from handlers.image.image_text_model import (
    ImageTextFolder,
    ImageTower,
    TextEncoder,
    TextTower,
    is_image_text_folder,
    load_image_text_model,
    load_text_encoder,
    read_image_text_folder,
    stage_text_path,
)
from handlers.image.image_text_requests import (
    ImageTextRequest,
    answer_cohere,
    answer_own,
    parse_cohere,
    parse_own,
    single_image,
    sorted_scores,
)
from handlers.image.inputs import image_from_body, image_from_string, is_image_content_type
from handlers.image.kinds.base import CompanionContext, ImageKind, ImageReference
from handlers.image.requests import ImageRequestContext
from handlers.text.cache import CachedRow
from handlers.text.folder import FolderError
from handlers.text.requests.common import check_model_name, decoded_body
from handlers.text.requests.embedding import VectorSpace


class ImageTextImageReference(ImageReference):
    """The reference library's image vectors, one image at a time (what the image parity check compares)."""

    def __init__(self, folder: Path) -> None:
        from handlers.image.kinds.image_text_reference import load_reference

        self.reference = load_reference(folder)
        self.processor = self.reference.image_processor

    def answer(self, image: Image.Image) -> torch.Tensor:
        return self.reference.image_embeddings([image])[0]

    def served_pixels(self, image: Image.Image) -> torch.Tensor:
        """The image as the folder's processor makes it (the zero-shot check compares scores, not preprocessing,
        which the image parity check has proved)."""
        return torch.as_tensor(self.processor(images=[image], return_tensors="pt")["pixel_values"])


def folder_of(info: ImageModelFolder) -> ImageTextFolder:
    """The image-text folder description recorded in ``info.extra`` by :meth:`ImageTextKind.read_folder`."""
    return ImageTextFolder(**info.extra["image_text"])


class ImageTextKind(ImageKind):
    name = "image-text"
    reference_library = "transformers CLIPModel / SiglipModel (zero-shot-image-classification) or sentence-transformers"
    default_min_cosine = 0.999

    def read_folder(self, folder: Path) -> ImageModelFolder:
        found = read_image_text_folder(folder)
        return ImageModelFolder(
            kind=self.name,
            model_type=found.model_type,
            body_class=found.architecture,
            output_size=found.dimension,
            activation="sigmoid" if found.sigmoid else "softmax",
            extra={"image_text": vars(found).copy()},
        )

    @staticmethod
    def detects(folder: Path) -> bool:
        return is_image_text_folder(folder)

    def build_module(self, folder: Path, info: ImageModelFolder) -> nn.Module:
        return load_image_text_model(folder, folder_of(info)).image.eval()

    def stage(self, source: Path, out: Path, info: ImageModelFolder) -> dict[str, Any]:
        """The text tower's tokenizer through the text models' export (served_tokenizer.json, proved equal to
        transformers' on the reference texts and labels, long ones included) and its padding rule."""
        from handlers.image.kinds.image_text_reference import tokenizer_texts

        return {"text": stage_text_path(source, out, folder_of(info), tokenizer_texts())}

    def load_companion(
        self, folder: Path, info: ImageModelFolder, module: nn.Module, context: CompanionContext | None = None
    ) -> TextEncoder:
        """The text tower beside the served image tower: the same fp32 model (not the converted or compiled copy
        the engine serves images with), the packaged tokenizer and padding rule, and the text caches keyed by the
        engine's model (``context``; None: nothing cached)."""
        found = folder_of(info)
        if not isinstance(module, ImageTower):
            raise TypeError(f"the image-text companion is built on the fp32 ImageTower, got {type(module).__name__}")
        tower = TextTower(module.model, found.normalize)
        staged = info.extra.get("text")
        return load_text_encoder(folder, found, tower, staged, context, lambda value: self.check_value(info, value))

    def load_reference(self, folder: Path, info: ImageModelFolder) -> ImageReference:
        return ImageTextImageReference(folder)

    def companion_parity(self, folder: Path, info: ImageModelFolder, reference: ImageReference) -> dict[str, float]:
        """The text vectors (min cosine) on the reference sentences, and the zero-shot scores (1 - the largest
        difference, and the same label order) on the reference images, against the reference library."""
        from handlers.image.kinds.image_text_reference import parity_texts

        if not isinstance(reference, ImageTextImageReference):
            raise TypeError(f"an image-text parity check compares with its own reference, got {type(reference)}")
        library = reference.reference
        model = load_image_text_model(folder, folder_of(info))
        encoder = self.load_companion(folder, info, model.image)
        texts = parity_texts()
        ours = torch.stack([text.value for text in encoder.encode(texts)])
        text_agreement = float(torch.nn.functional.cosine_similarity(ours, library.text_embeddings(texts)).min())
        return {"text_vectors": text_agreement, "zero_shot_scores": zero_shot_parity(info, model, encoder, reference)}

    def check_value(self, info: ImageModelFolder, value: Any) -> bool:
        if not bool(torch.isfinite(value).all()):
            return False
        return not folder_of(info).normalize or abs(float(value.norm()) - 1.0) <= 1e-3

    # ------------------------------------------------------------------------------------------- requests
    def routes(self) -> tuple[Route, ...]:
        return (
            Route("", self.parse_request, self.answer, api="this project's own"),
            Route("v1/embeddings", self.parse_input, self.answer, api="OpenAI and Jina embeddings (input)"),
            Route("v2/embed", self.parse_cohere, self.answer_cohere, COHERE, "Cohere embed v2"),
        )

    def parse_request(self, api: ImageRequestContext, body: Any, request: RequestView) -> ImageTextRequest:
        if is_image_content_type(request.content_type):
            parsed = single_image(image_from_body(body, request.content_type, api.sources.limits))
        else:
            body = self.json_body(body, request)
            check_model_name(body, api.served_name)
            parsed = parse_own(body, image_decoder(api))
        return self.checked(api, parsed)

    def parse_input(self, api: ImageRequestContext, body: Any, request: RequestView) -> ImageTextRequest:
        body = self.json_body(body, request)
        check_model_name(body, api.served_name)
        if "input" not in body:
            raise RequestError("missing field 'input' (a text, or a list of texts, {'text'} and {'image'} items)")
        return self.checked(api, parse_own(body, image_decoder(api)))

    def parse_cohere(self, api: ImageRequestContext, body: Any, request: RequestView) -> ImageTextRequest:
        body = self.json_body(body, request)
        check_model_name(body, api.served_name)
        return self.checked(api, parse_cohere(body, image_decoder(api)))

    @staticmethod
    def json_body(body: Any, request: RequestView) -> dict[str, Any]:
        body = decoded_body(body, request.content_type, "'text', 'texts', 'image', 'images' or 'input'")
        if not isinstance(body, dict):
            raise RequestError(f"body must be a JSON object (or a raw image), got {type(body).__name__}")
        return body

    @staticmethod
    def checked(api: ImageRequestContext, request: ImageTextRequest) -> ImageTextRequest:
        if len(request.images) > api.sources.max_images:
            raise too_large(
                f"the request carries {len(request.images)} images; at most {api.sources.max_images} are allowed "
                f"per request (handler.max_images)"
            )
        return request

    def answer(self, api: ImageRequestContext, payload: ImageTextRequest, rows: list[CachedRow]) -> Any:
        encoder = companion(api)
        images = torch.stack([row.value for row in rows]).float() if rows else torch.zeros(0)
        texts = encoder.encode(payload.texts) if payload.texts else []
        return answer_own(payload, images, texts, encoder.scores, api.served_name)

    def answer_cohere(self, api: ImageRequestContext, payload: ImageTextRequest, rows: list[CachedRow]) -> Any:
        encoder = companion(api)
        images = torch.stack([row.value for row in rows]).float() if rows else torch.zeros(0)
        texts = encoder.encode(payload.texts) if payload.texts else []
        space = VectorSpace(api.info.output_size, (), folder_of(api.info).normalize, None)
        return answer_cohere(payload, images, texts, space)

    def describe(self, info: ImageModelFolder) -> dict[str, Any]:
        return {**super().describe(info), **folder_of(info).describe(), "dimension": info.output_size}


def zero_shot_parity(
    info: ImageModelFolder, model: Any, encoder: TextEncoder, reference: ImageTextImageReference
) -> float:
    """The served zero-shot scores against transformers' pipeline on the reference images: 1 - the largest score
    difference (0 where the labels' order differs), on the parity labels that the text tower reads whole. A tower
    too short for any two of them is refused: there is nothing to prove its zero-shot answers on."""
    from handlers.image.kinds.image_text_reference import fit_zero_shot_parity
    from handlers.image.reference import reference_images

    library = reference.reference
    fitted = fit_zero_shot_parity(library.token_count, encoder.max_tokens)
    if fitted is None:
        raise too_short_for_labels(info, library, encoder.max_tokens)
    labels = torch.stack([text.value for text in encoder.encode(fitted.hypotheses())])
    worst = 1.0
    for image in reference_images()[:3]:
        expected = library.zero_shot(image, fitted.labels, fitted.template)
        with torch.inference_mode():
            vector = model.image(reference.served_pixels(image))
        got = sorted_scores(encoder.scores(vector, labels)[0].tolist(), fitted.labels)
        if [g["label"] for g in got] != [e["label"] for e in expected]:
            worst = min(worst, 0.0)
        difference = max(abs(float(g["score"]) - e["score"]) for g, e in zip(got, expected, strict=True))
        worst = min(worst, 1.0 - difference)
    return worst


def too_short_for_labels(info: ImageModelFolder, library: Any, max_tokens: int) -> FolderError:
    """The refusal of a text tower that reads too few tokens for a zero-shot label: which files say so, and why."""
    from handlers.image.kinds.image_text_reference import MIN_PARITY_LABELS, PARITY_LABELS

    where = f"{folder_of(info).model_dir}/" if folder_of(info).model_dir else ""
    shortest = sorted(PARITY_LABELS, key=library.token_count)[:MIN_PARITY_LABELS]
    counts = ", ".join(f"{label!r} {library.token_count(label)}" for label in shortest)
    return FolderError(
        f"{where}config.json",
        f"the text tower reads at most {max_tokens} tokens (text_config.max_position_embeddings "
        f"{library.text_positions}, or {where}tokenizer_config.json's model_max_length where smaller), and the "
        f"folder's tokenizer makes even one-word labels longer (tokens with the start and end ones: {counts}), so "
        f"no zero-shot answer can be checked against transformers' pipeline",
        "package the model's own config.json and tokenizer files, saved together (save_pretrained): a CLIP text "
        "tower reads 77 tokens",
    )


def companion(api: ImageRequestContext) -> TextEncoder:
    encoder = api.companion
    if not isinstance(encoder, TextEncoder):
        raise TypeError("the image-text kind answers with its text encoder (ImageRequestContext.companion)")
    return encoder


def image_decoder(api: ImageRequestContext) -> Any:
    """One image value of a JSON body (base64, a data: URI, an http(s) URL from an allowed host) -> its bytes."""

    def decode(value: Any, name: str) -> bytes:
        return image_from_string(value, name, api.sources)

    return decode
