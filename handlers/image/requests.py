"""What every image model's requests share: what a request module may read of the served model
(:class:`ImageRequestContext`), the payload batch assembly reads (:class:`ImageRequest`: each image's raw bytes and
the name its refusal uses), and the options a body may carry.

Reading a request's images out of its body (a raw ``image/*`` body, ``image``/``images`` as base64 or ``data:``
URIs, remote URLs only from allowed hosts) is handlers/image/inputs.py's ``images_from_request``; decoding each
(limits, formats, orientation) handlers/image/decode.py's, which the engine calls only for images its cache does not
hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handlers.core.errors import RequestError, shown
from handlers.image.folder import ImageModelFolder
from handlers.image.inputs import ImageSources


@dataclass(frozen=True)
class ImageRequestContext:
    """What parsing a request and shaping its answer may read of the served model."""

    info: ImageModelFolder
    sources: ImageSources  # where images may come from (the URL hosts) and what each may cost (limits, count)
    model_name: str  # the archive's model name
    served_name: str  # the name it is registered under
    companion: Any = None  # what the kind loaded beside the module (ImageKind.load_companion: a text encoder)


@dataclass(frozen=True)
class ImageRequest:
    """One request's images, as batch assembly reads them, and how its answer is shaped."""

    images: tuple[bytes, ...]
    names: tuple[str, ...]  # what a refusal calls each image ("body", "'image'", "'images'[2]")
    single: bool  # one image sent as one (a raw body, a lone value): its answer is not wrapped in a list
    options: dict[str, Any]  # the kind's per-request options (a classifier's top_k)


def int_option(value: Any, name: str, minimum: int) -> int:
    """An integer option of a JSON body."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {shown(value)}")
    if value < minimum:
        raise RequestError(f"'{name}' must be at least {minimum}, got {value}")
    return value
