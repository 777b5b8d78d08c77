"""The image-text kind's requests (handlers/image/kinds/image_text.py): texts and images into one vector space, and
zero-shot image classification, in the project's own body and in Cohere's and Jina's shapes.

At the model's own URL (``/predictions/<model>``), designed like the text embedding body (docs/embeddings.md):

- a raw image body (``image/jpeg``, ``image/png``, ``image/webp``, ...) or ``{"image": <base64 or data: URI>}`` ->
  ``{"embedding": [...]}``; ``{"text": "..."}`` -> ``{"embedding": [...], "truncated": bool}``;
- ``{"texts": [...], "images": [...]}`` (either or both) -> ``{"text_embeddings": [[...], ...], "truncated":
  [bool, ...], "image_embeddings": [[...], ...]}``, each list in the order sent;
- ``{"input": [...]}``: OpenAI's and Jina's list, each item a text, ``{"text": ...}`` or ``{"image": ...}`` ->
  ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}``, one entry per
  item in its order, each ``float`` or (``encoding_format: "base64"``) little-endian float32 bytes in base64 (also at
  ``/v1/embeddings``, where the OpenAI and Jina clients post);
- ``{"image" | "images", "candidate_labels": [...], "hypothesis_template": "This is a photo of {}."}`` -> per image
  transformers' zero-shot-image-classification pipeline's answer, ``[{"score", "label"}, ...]`` best first (a list of
  those for ``images``).

At ``/v2/embed``, Cohere's embed v2 body with ``texts``, ``images`` (``data:`` URIs) or ``inputs`` (each one
content part: ``{"type": "text", "text"}`` or ``{"type": "image_url", "image_url": {"url": "data:..."}}``).

A text over the text tower's limit (CLIP 77 tokens, SigLIP 64) is cut there and answered as cut (Cohere
``truncate: NONE`` refuses it). The images are the engine's rows (decoded, preprocessed, batched and cached by their
bytes' digest with every other request's); the texts go through the text tower when the answer is written
(handlers/image/image_text_model.py TextEncoder: the text models' tokenizer, padding and row caches; zero-shot
labels repeat, so most are cache hits)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from handlers.core.errors import RequestError, ServerError, shown, too_large
from handlers.core.http import Float32, float32_list
from handlers.text.cache import CachedRow
from handlers.text.quantization import float32_base64
from handlers.text.requests.common import check_fields, check_text, default_if_none
from handlers.text.requests.embedding import NON_FINITE, VectorSpace, encoded
from handlers.text.requests.zero_shot import candidate_labels, hypothesis_template

DEFAULT_TEMPLATE = "This is a photo of {}."  # the zero-shot-image-classification pipeline's
MAX_TEXTS = 64  # texts (or labels) one request may carry
MAX_TEXT_CHARS = 4000  # per text: far past what the 77- or 64-token towers read, still cheap to tokenize
OWN_FIELDS = {"text", "texts", "image", "images", "input", "candidate_labels", "hypothesis_template", "model"}
INPUT_FIELDS = {"input", "model", "encoding_format", "user"}  # OpenAI's embeddings fields that fit a fixed space
INPUT_ENCODINGS = ("float", "base64")  # OpenAI's; its Python client asks for base64 by default
COHERE_FIELDS = {"model", "input_type", "embedding_types", "texts", "images", "inputs", "truncate", "priority"}
COHERE_TYPES = ("float", "base64", "binary", "ubinary")  # int8/uint8 need a calibration image models lack
COHERE_INPUT_TYPES = ("search_query", "search_document", "classification", "clustering", "image")


@dataclass
class ImageTextRequest:
    """One request: its images (raw bytes, as batch assembly reads them) and texts, and how its answer is shaped."""

    images: tuple[bytes, ...]
    names: tuple[str, ...]  # what a refusal calls each image
    texts: list[str] = field(default_factory=list)
    shape: str = "own"  # own | own-single-text | own-single-image | input | zero-shot | cohere
    single: bool = False  # zero-shot: one image sent as one (its answer is not wrapped in a list)
    order: list[tuple[str, int]] = field(default_factory=list)  # input / cohere inputs: (text|image, index) per item
    labels: list[str] = field(default_factory=list)  # zero-shot
    truncate: bool = True  # Cohere truncate NONE: a text over the limit is refused
    encodings: tuple[str, ...] = ("float",)  # Cohere embedding_types
    options: dict[str, Any] = field(default_factory=dict)


def check_texts(values: Any, name: str) -> list[str]:
    if isinstance(values, str) or not isinstance(values, list) or not values:
        raise RequestError(f"'{name}' must be a non-empty list of strings, got {shown(values)}")
    if len(values) > MAX_TEXTS:
        raise too_large(f"'{name}' has {len(values)} texts; at most {MAX_TEXTS} are allowed per request")
    return [check_text(value, f"'{name}'[{index}]", MAX_TEXT_CHARS) for index, value in enumerate(values)]


def image_list(values: Any, name: str) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise RequestError(f"'{name}' must be a non-empty list of images (base64 or data: URIs), got {shown(values)}")
    return values


def images_field(body: dict[str, Any], decode: Any) -> tuple[list[bytes], list[str]]:
    """The images of 'image' (one) or 'images' (a list), as bytes, with what a refusal calls each."""
    if "image" in body:
        return [decode(body["image"], "'image'")], ["'image'"]
    if "images" not in body:
        return [], []
    values = image_list(body["images"], "images")
    names = [f"'images'[{index}]" for index in range(len(values))]
    return [decode(value, name) for value, name in zip(values, names, strict=True)], names


def parse_own(body: dict[str, Any], decode: Any) -> ImageTextRequest:
    """The project's own JSON body (a raw image body is handled by the caller). ``decode(value, name)`` turns one
    image value (base64, a data: URI) into its bytes, or refuses it."""
    if "input" in body:
        check_fields(body, INPUT_FIELDS, "'input'")
        return parse_input(body, decode)
    check_fields(body, OWN_FIELDS)
    for single, many in (("text", "texts"), ("image", "images")):
        if single in body and many in body:
            raise RequestError(f"send either '{single}' or '{many}', not both")
    if "candidate_labels" in body or "hypothesis_template" in body:
        return parse_zero_shot(body, decode)
    if not any(name in body for name in ("text", "texts", "image", "images")):
        raise RequestError("missing field: send 'text', 'texts', 'image', 'images' or 'input'")
    texts = [check_text(body["text"], "'text'", MAX_TEXT_CHARS)] if "text" in body else []
    if "texts" in body:
        texts = check_texts(body["texts"], "texts")
    images, names = images_field(body, decode)
    content = set(body) - {"model"}
    shape = {"text": "own-single-text", "image": "own-single-image"}.get(next(iter(content)), "own")
    return ImageTextRequest(tuple(images), tuple(names), texts, shape if len(content) == 1 else "own")


def single_image(data: bytes) -> ImageTextRequest:
    """A raw image body: one image, answered as one embedding."""
    return ImageTextRequest((data,), ("body",), shape="own-single-image")


def parse_zero_shot(body: dict[str, Any], decode: Any) -> ImageTextRequest:
    if "text" in body or "texts" in body:
        raise RequestError("zero-shot image classification takes 'image' or 'images', not texts")
    check_fields(body, {"image", "images", "candidate_labels", "hypothesis_template", "model"}, "'candidate_labels'")
    if "candidate_labels" not in body:
        raise RequestError("missing field 'candidate_labels'")
    labels = candidate_labels(body["candidate_labels"])
    if len(labels) > MAX_TEXTS:
        raise too_large(f"'candidate_labels' has {len(labels)} labels; at most {MAX_TEXTS} are allowed")
    template = hypothesis_template(default_if_none(body.get("hypothesis_template"), DEFAULT_TEMPLATE))
    if "image" not in body and "images" not in body:
        raise RequestError("zero-shot image classification needs 'image' (or 'images')")
    images, names = images_field(body, decode)
    hypotheses = [template.replace("{}", label, 1) for label in labels]
    return ImageTextRequest(tuple(images), tuple(names), hypotheses, "zero-shot", "image" in body, labels=labels)


def parse_input(body: dict[str, Any], decode: Any) -> ImageTextRequest:
    """OpenAI's and Jina's ``input``: a text, or a list of texts, ``{"text"}`` and ``{"image"}`` items."""
    encoding = default_if_none(body.get("encoding_format"), "float")
    if encoding not in INPUT_ENCODINGS:
        raise RequestError(f"'encoding_format' {shown(encoding)} is not served; use one of {list(INPUT_ENCODINGS)}")
    items = body["input"]
    items = [items] if isinstance(items, str) else items
    if not isinstance(items, list) or not items:
        raise RequestError("'input' must be a text or a non-empty list of texts, {'text'} and {'image'} items")
    if len(items) > MAX_TEXTS:
        raise too_large(f"'input' has {len(items)} items; at most {MAX_TEXTS} are allowed per request")
    texts: list[str] = []
    images: list[bytes] = []
    names: list[str] = []
    order: list[tuple[str, int]] = []
    for index, item in enumerate(items):
        where = f"'input'[{index}]"
        if isinstance(item, dict):
            if set(item) not in ({"text"}, {"image"}):
                raise RequestError(f"{where} must be a text, {{'text': ...}} or {{'image': ...}}, got {shown(item)}")
            if "image" in item:
                order.append(("image", len(images)))
                names.append(where)
                images.append(decode(item["image"], where))
                continue
            item = item["text"]
        order.append(("text", len(texts)))
        texts.append(check_text(item, where, MAX_TEXT_CHARS))
    return ImageTextRequest(tuple(images), tuple(names), texts, "input", order=order, encodings=(encoding,))


def cohere_options(body: dict[str, Any]) -> ImageTextRequest:
    """Cohere's options (input_type, truncate, embedding_types) as an empty request to fill."""
    input_type = body.get("input_type")
    if input_type is not None and input_type not in COHERE_INPUT_TYPES:
        raise RequestError(f"'input_type' must be one of {list(COHERE_INPUT_TYPES)}, got {shown(input_type)}")
    truncate = default_if_none(body.get("truncate"), "END")
    if truncate not in ("NONE", "END"):
        raise RequestError(f"'truncate' must be 'END' or 'NONE' (texts are cut at their end), got {shown(truncate)}")
    types = default_if_none(body.get("embedding_types"), ["float"])
    if not isinstance(types, list) or not types or any(kind not in COHERE_TYPES for kind in types):
        raise RequestError(f"'embedding_types' must be a list of {list(COHERE_TYPES)}, got {shown(types)}")
    encodings = tuple(dict.fromkeys(types))
    return ImageTextRequest((), (), shape="cohere", truncate=truncate == "END", encodings=encodings)


def parse_cohere(body: dict[str, Any], decode: Any) -> ImageTextRequest:
    """Cohere's embed v2 body: ``texts``, ``images`` or ``inputs`` (one of them)."""
    check_fields(body, COHERE_FIELDS)
    given = [name for name in ("texts", "images", "inputs") if body.get(name) is not None]
    if len(given) != 1:
        raise RequestError(f"send one of 'texts', 'images' or 'inputs', got {given or 'none'}")
    request = cohere_options(body)
    if "texts" in given:
        request.texts = check_texts(body["texts"], "texts")
        request.order = [("text", index) for index in range(len(request.texts))]
    elif "images" in given:
        images, names = images_field({"images": body["images"]}, decode)
        request.images, request.names = tuple(images), tuple(names)
        request.order = [("image", index) for index in range(len(images))]
    else:
        cohere_inputs(request, body["inputs"], decode)
    return request


def cohere_inputs(request: ImageTextRequest, inputs: Any, decode: Any) -> None:
    """Cohere's ``inputs``: each one content part, a text or an image_url (a data: URI)."""
    if not isinstance(inputs, list) or not inputs or len(inputs) > MAX_TEXTS:
        raise RequestError(f"'inputs' must be a list of 1 to {MAX_TEXTS} inputs, each {{'content': [one part]}}")
    images: list[bytes] = []
    names: list[str] = []
    for index, entry in enumerate(inputs):
        where = f"'inputs'[{index}]"
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], dict):
            raise RequestError(
                f"{where} must be {{'content': [one part]}}: this model puts a text or an image into the vector "
                f"space, not both into one vector; send them as separate inputs"
            )
        part = content[0]
        if part.get("type") == "text":
            request.order.append(("text", len(request.texts)))
            request.texts.append(check_text(part.get("text"), f"{where}.content[0].text", MAX_TEXT_CHARS))
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            request.order.append(("image", len(images)))
            names.append(where)
            images.append(decode(url, where))
        else:
            kind = shown(part.get("type"))
            raise RequestError(f"{where}.content[0].type must be 'text' or 'image_url', got {kind}")
    request.images, request.names = tuple(images), tuple(names)


# ----------------------------------------------------------------------------------------------------------- answers
def sorted_scores(scores: Sequence[float], labels: Sequence[str]) -> list[dict[str, Any]]:
    """The pipeline's answer for one image: {"score", "label"}, best first (its stable sort: ties keep label order)."""
    order = sorted(range(len(labels)), key=lambda index: -scores[index])
    return [{"score": Float32(scores[index]), "label": labels[index]} for index in order]


def non_finite(*vectors: torch.Tensor) -> bool:
    return any(v.numel() and not bool(torch.isfinite(v).all()) for v in vectors)


def answer_own(
    request: ImageTextRequest, images: torch.Tensor, texts: list[CachedRow], scores: Any, served_name: str
) -> Any:
    """The answer at the model's own URL. ``scores(images, texts)``: the zero-shot [images, labels] scores."""
    text_vectors = stacked([text.value for text in texts])
    if non_finite(images, text_vectors):
        return ServerError(NON_FINITE)
    if request.shape == "input":
        return answer_input(request, images, texts, served_name)
    if request.shape == "zero-shot":
        answers = [sorted_scores(row, request.labels) for row in scores(images, text_vectors).tolist()]
        return answers[0] if request.single else answers
    if request.shape == "own-single-text":
        return {"embedding": float32_list(text_vectors[0]), "truncated": texts[0].truncated}
    if request.shape == "own-single-image":
        return {"embedding": float32_list(images[0])}
    out: dict[str, Any] = {}
    if request.texts:
        out["text_embeddings"] = [float32_list(v) for v in text_vectors]
        out["truncated"] = [text.truncated for text in texts]
    if request.images:
        out["image_embeddings"] = [float32_list(v) for v in images]
    return out


def in_order(request: ImageTextRequest, images: torch.Tensor, texts: list[CachedRow]) -> list[torch.Tensor]:
    return [texts[index].value if kind == "text" else images[index] for kind, index in request.order]


def answer_input(request: ImageTextRequest, images: torch.Tensor, texts: list[CachedRow], served_name: str) -> Any:
    """OpenAI's and Jina's answer: one entry per input item, in its order."""
    rows = in_order(request, images, texts)
    if non_finite(stacked(rows)):
        return ServerError(NON_FINITE)
    encode = float32_base64 if request.encodings == ("base64",) else float32_list
    data = [{"object": "embedding", "index": i, "embedding": encode(row.numpy())} for i, row in enumerate(rows)]
    tokens = sum(text.tokens for text in texts)
    return {
        "object": "list",
        "data": data,
        "model": served_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def answer_cohere(request: ImageTextRequest, images: torch.Tensor, texts: list[CachedRow], space: VectorSpace) -> Any:
    """Cohere's embed v2 answer: the vectors in each type asked for, in the inputs' order."""
    if not request.truncate:
        cut = [name for name, text in zip(request.texts, texts, strict=True) if text.truncated]
        if cut:  # returned, not raised: this request's own refusal, the batch's other answers go on
            return RequestError(f"a text is over the model's token limit and 'truncate' is 'NONE': {shown(cut[0])}")
    array = stacked(in_order(request, images, texts)).numpy().astype(np.float32)
    if not np.isfinite(array).all():
        return ServerError(NON_FINITE)
    billed: dict[str, int] = {"input_tokens": sum(text.tokens for text in texts)}
    if request.images:
        billed["images"] = len(request.images)
    out: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "embeddings": {kind: encoded(array, kind, space, False) for kind in request.encodings},
        "meta": {"api_version": {"version": "2"}, "billed_units": billed},
        "response_type": "embeddings_by_type",
    }
    if request.texts:
        out["texts"] = request.texts
    return out


def stacked(vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack(list(vectors)).float() if vectors else torch.zeros(0)
