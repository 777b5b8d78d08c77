"""What every image model's requests share: what a request module may read of the served model
(:class:`ImageRequestContext`), the payload batch assembly reads (:class:`ImageRequest`: each image's raw bytes and
the name its refusal uses), and the options a body or the URL's query may carry.

How a request carries its images (a raw ``image/*`` body, JSON with base64 or ``data:`` URIs, refused remote URLs)
is handlers/image/inputs.py's; decoding them (limits, formats, orientation) handlers/image/decode.py's, which the
engine calls only for images its cache does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.core.errors import RequestError, shown
from handlers.image.decode import ImageLimits
from handlers.image.folder import ImageModelFolder


@dataclass(frozen=True)
class ImageRequestContext:
    """What parsing a request and shaping its answer may read of the served model."""

    info: ImageModelFolder
    limits: ImageLimits
    max_images: int  # images one request may carry
    model_name: str  # the archive's model name
    served_name: str  # the name it is registered under
    allowed_hosts: tuple[str, ...] = ()  # hosts remote image URLs may name (handler.image_url_hosts); none: refused
    companion: Any = None  # what the kind loaded beside the module (ImageKind.load_companion: a text encoder)


@dataclass(frozen=True)
class ImageRequest:
    """One request's images, as batch assembly reads them, and how its answer is shaped."""

    images: tuple[bytes, ...]
    names: tuple[str, ...]  # what a refusal calls each image ("image", "images[2]")
    single: bool  # one image sent as one (a raw body, a lone value): its answer is not wrapped in a list
    options: dict[str, Any]  # the kind's per-request options (a classifier's top_k)


def image_names(count: int, single: bool, field: str = "images") -> tuple[str, ...]:
    return ("image",) if single else tuple(f"{field}[{index}]" for index in range(count))


def check_count(api: ImageRequestContext, images: Sequence[bytes]) -> None:
    if not images:
        raise RequestError("the request carries no image")
    if len(images) > api.max_images:
        raise RequestError(
            f"the request carries {len(images)} images; handler.max_images is {api.max_images}",
            code=413,
            error_type="RequestTooLarge",
        )


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
    """What a request's body carries: its images' encoded bytes, whether it sent one image as one, and the body's
    other fields (the kind's options)."""

    images: tuple[bytes, ...]
    single: bool
    options: dict[str, Any]


def carried_images(body: Any, content_type: str, allowed_hosts: Sequence[str] = ()) -> CarriedImages:
    """The images of one request's body: a raw ``image/*`` body (one image), or a JSON object with ``image`` (one)
    or ``images`` (a list), each base64 or a ``data:`` URI.

    Temporary: replaced by handlers/image/inputs.py's images_from_request once that lands (remote URLs, the
    other dialects' fields)."""
    import base64
    import binascii

    from handlers.core.http import decode_json

    if isinstance(body, (bytes, bytearray)) and content_type.startswith("image/"):
        return CarriedImages((bytes(body),), True, {})
    if isinstance(body, (bytes, bytearray)):
        body = decode_json(body)
    if not isinstance(body, dict):
        raise RequestError(
            "send an image as the raw body with its image/* Content-Type, or a JSON object with 'image' or 'images'",
            code=415,
            error_type="UnsupportedMediaType",
        )
    fields = dict(body)
    if "image" in fields:
        values, single = [fields.pop("image")], True
    elif "images" in fields:
        values, single = fields.pop("images"), False
        if not isinstance(values, list):
            raise RequestError(f"'images' must be a list, got {type(values).__name__}")
    else:
        raise RequestError("the JSON body has no 'image' or 'images'")
    images = []
    for index, value in enumerate(values):
        name = "image" if single else f"images[{index}]"
        if not isinstance(value, str):
            raise RequestError(f"{name} must be a base64 string or a data: URI, got {type(value).__name__}")
        text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
        try:
            images.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise RequestError(f"{name} is not valid base64") from None
    return CarriedImages(tuple(images), single, fields)
