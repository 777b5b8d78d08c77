"""What every image model's requests share: what a request module may read of the served model
(:class:`ImageRequestContext`), the payload batch assembly reads (:class:`ImageRequest`: each image's raw bytes and
the name its refusal uses), the model's own body (:func:`carried_images`) and the options a body or the URL's query
may carry.

Reading one image out of a body or a JSON string (a raw ``image/*`` body, base64 or ``data:`` URIs, remote URLs only
from allowed hosts) is handlers/image/inputs.py's; decoding it (limits, formats, orientation) handlers/image/
decode.py's, which the engine calls only for images its cache does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handlers.core.errors import RequestError, shown
from handlers.core.http import decode_json
from handlers.image.folder import ImageModelFolder
from handlers.image.inputs import (
    ImageSources,
    image_from_body,
    images_from_json,
    is_image_content_type,
    served_media_types,
)


@dataclass(frozen=True)
class ImageRequestContext:
    """What parsing a request and shaping its answer may read of the served model."""

    info: ImageModelFolder
    sources: ImageSources  # where images may come from (the URL hosts) and what each may cost (limits, count)
    model_name: str  # the archive's model name
    served_name: str  # the name it is registered under


@dataclass(frozen=True)
class ImageRequest:
    """One request's images, as batch assembly reads them, and how its answer is shaped."""

    images: tuple[bytes, ...]
    names: tuple[str, ...]  # what a refusal calls each image ("image", "'images'[2]")
    single: bool  # one image sent as one (a raw body, a lone value): its answer is not wrapped in a list
    options: dict[str, Any]  # the kind's per-request options (a classifier's top_k)


def int_option(value: Any, name: str, minimum: int) -> int:
    """An integer option from a JSON body or the URL's query (where it arrives as text)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {shown(value)}")
    if value < minimum:
        raise RequestError(f"'{name}' must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class CarriedImages:
    """What a request's body carries: its images' encoded bytes, what a refusal calls each, whether it sent one image
    as one, and the body's other fields (the kind's options)."""

    images: tuple[bytes, ...]
    names: tuple[str, ...]
    single: bool
    options: dict[str, Any]


IMAGE_FIELDS = ("image", "images")


def carried_images(body: Any, content_type: str, sources: ImageSources) -> CarriedImages:
    """The images of one request's body (handlers/image/inputs.py reads each): the raw body with an image
    Content-Type (one image), or a JSON object with ``image`` or ``images``, one image or a list (base64, data: URIs,
    http(s) URLs from allowed hosts only). The object's other fields are returned as the kind's options."""
    if is_image_content_type(content_type):
        return CarriedImages((image_from_body(body, content_type, sources.limits),), ("image",), True, {})
    if isinstance(body, (bytes, bytearray)):
        body = decode_json(body)
    if not isinstance(body, dict):
        raise RequestError(
            f"body must be an image (Content-Type {', '.join(served_media_types(sources.limits))}) or a JSON object "
            f"with 'image' or 'images', got {type(body).__name__}",
            code=415 if isinstance(body, str) else 400,
            error_type="UnsupportedMediaType" if isinstance(body, str) else "InvalidRequest",
        )
    fields = dict(body)
    present = [name for name in IMAGE_FIELDS if name in fields]
    if len(present) != 1:
        raise RequestError(
            "the JSON body must have exactly one of 'image' (one image) and 'images' (a list), each base64, a "
            "data:image/...;base64, URI or an allowed http(s) URL"
        )
    field = present[0]
    value = fields.pop(field)
    images = images_from_json(value, field, sources)
    single = isinstance(value, str)
    names = (f"'{field}'",) if single else tuple(f"'{field}'[{index}]" for index in range(len(images)))
    return CarriedImages(tuple(images), names, single, fields)
