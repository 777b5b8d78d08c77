"""How a request carries images, whatever model serves them: the raw body (``image/jpeg``, ``image/png``,
``image/webp``, ... as TorchServe's stock ``image_classifier`` takes it), or JSON strings (base64, ``data:image/...;
base64,`` URIs, and ``http(s)`` URLs only from hosts an operator lists in ``handler.image_url_hosts``).

Every function here returns the image's encoded bytes, not pixels: the caller digests them (a cache hit needs no
decode) and decodes the rest with :func:`handlers.image.decode.decode_image`. Each refusal is a RequestError whose
message names the field (``'images'[2]``) or the body, and the problem.

Content types are read as clients send them: the declared type must be an image type this model serves (or
``application/octet-stream``), but the bytes decide the format, so a PNG sent as ``image/jpeg`` (a common client
slip, accepted by transformers and OpenAI's APIs alike) is decoded as the PNG it is. Bytes that are no image at all
are refused by what they are (JSON sent as ``image/png`` is told to use ``application/json``).
"""

from __future__ import annotations

import base64
import binascii
import http.client
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from handlers.core.config import Option
from handlers.core.errors import RequestError, shown, too_large
from handlers.core.http import decode_json
from handlers.image.decode import DECODABLE, DEFAULT_LIMITS, ImageLimits, sniff_format

# Media types of image bytes, to PIL's format name (a key of DECODABLE).
IMAGE_MEDIA_TYPES: dict[str, str] = {
    "image/jpeg": "JPEG",
    "image/jpg": "JPEG",
    "image/pjpeg": "JPEG",
    "image/png": "PNG",
    "image/apng": "PNG",
    "image/webp": "WEBP",
    "image/gif": "GIF",
    "image/bmp": "BMP",
    "image/x-ms-bmp": "BMP",
    "image/tiff": "TIFF",
}
# Media types recognised only to be refused by the format's name.
REFUSED_MEDIA_TYPES: dict[str, str] = {
    "image/svg+xml": "SVG",
    "application/pdf": "PDF",
    "image/heic": "HEIC",
    "image/heif": "HEIC",
    "image/avif": "AVIF",
    "image/jxl": "JPEG XL",
    "image/jp2": "JPEG 2000",
    "image/vnd.adobe.photoshop": "PSD",
    "image/x-icon": "ICO",
    "image/vnd.microsoft.icon": "ICO",
}
# Bytes of unnamed type: the format is read from them.
OCTET_STREAM = "application/octet-stream"


@dataclass(frozen=True)
class ImageSources:
    """Where a request's images may come from and what each may cost (``handler:`` keys in :data:`SOURCE_OPTIONS`)."""

    limits: ImageLimits = DEFAULT_LIMITS
    max_images: int = 16  # images one request may carry
    url_hosts: tuple[str, ...] = ()  # hosts (or "*.domain") whose http(s) URLs are fetched; empty: none
    url_timeout_s: float = 5.0  # a whole fetch, connecting to the last byte


DEFAULT_SOURCES = ImageSources()


def _check_hosts(option: Option, key: str, value: Any) -> tuple[str, ...]:
    hosts = []
    for item in value:
        host = item.strip().lower() if isinstance(item, str) else ""
        bare = host.removeprefix("*.")
        if not bare or not re.fullmatch(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:.]+\]", bare):
            option.refuse(key, f"{item!r} is not a host name (example.com, *.example.com, 10.0.0.5)")
        hosts.append(host)
    return tuple(hosts)


SOURCE_OPTIONS: dict[str, Option] = {
    "max_images": Option(int, DEFAULT_SOURCES.max_images, minimum=1, maximum=4096, help="images one request may carry"),
    "image_url_hosts": Option(
        list,
        [],
        validator=_check_hosts,
        help="hosts whose http(s) image URLs the worker fetches (*.example.com for its subdomains); "
        "empty = no server-side fetches, URLs are refused",
    ),
    "image_url_timeout_s": Option(
        float, DEFAULT_SOURCES.url_timeout_s, minimum=0.1, maximum=60.0, help="time for one image URL fetch, whole"
    ),
}


def image_sources(config: Mapping[str, Any], limits: ImageLimits = DEFAULT_LIMITS) -> ImageSources:
    """The sources from a validated ``handler:`` config (keys of :data:`SOURCE_OPTIONS`; absent keys keep
    defaults)."""
    return ImageSources(
        limits=limits,
        max_images=int(config.get("max_images", DEFAULT_SOURCES.max_images)),
        url_hosts=tuple(config.get("image_url_hosts", ())),
        url_timeout_s=float(config.get("image_url_timeout_s", DEFAULT_SOURCES.url_timeout_s)),
    )


def media_type_format(media_type: str, where: str, limits: ImageLimits) -> str | None:
    """The PIL format a declared media type names (None for application/octet-stream), or a 415 naming a type this
    model does not serve."""
    media_type = media_type.split(";")[0].strip().lower()
    if media_type == OCTET_STREAM:
        return None
    named = IMAGE_MEDIA_TYPES.get(media_type) or REFUSED_MEDIA_TYPES.get(media_type)
    if named is None:
        raise RequestError(
            f"{where} is {media_type or '(none)'!r}, not an image type; send one of "
            f"{', '.join(served_media_types(limits))} (or {OCTET_STREAM})",
            code=415,
            error_type="UnsupportedMediaType",
        )
    if named not in limits.formats:
        raise RequestError(
            f"{where} is {media_type!r}, which is {DECODABLE.get(named, named)}, not served; accepted formats: "
            f"{limits.accepted()}",
            code=415,
            error_type="UnsupportedMediaType",
        )
    return named


def served_media_types(limits: ImageLimits) -> list[str]:
    """One media type per served format (the first of its names), for messages and docs."""
    seen: dict[str, str] = {}
    for media_type, name in IMAGE_MEDIA_TYPES.items():
        if name in limits.formats:
            seen.setdefault(name, media_type)
    return list(seen.values())


def is_image_content_type(content_type: str) -> bool:
    """Whether a request's Content-Type says its body is an image's bytes (so it is read by :func:`image_from_body`,
    not as JSON or text)."""
    media_type = content_type.split(";")[0].strip().lower()
    # A refused document type (application/pdf) is read as one too, so that its refusal names it.
    return media_type.startswith("image/") or media_type in (OCTET_STREAM, *REFUSED_MEDIA_TYPES)


def image_from_body(body: Any, content_type: str, limits: ImageLimits = DEFAULT_LIMITS) -> bytes:
    """The image bytes of a request whose body is the image itself (Content-Type ``image/...`` or
    ``application/octet-stream``), as TorchServe hands the body over."""
    media_type_format(content_type, "Content-Type", limits)
    if isinstance(body, str):  # TorchServe decodes text/* only, but a client-side mix-up should still be named
        body = body.encode("utf-8")
    if not isinstance(body, (bytes, bytearray)):
        raise RequestError(
            f"body must be the image's bytes for Content-Type {content_type!r}, got {type(body).__name__}: send JSON "
            f"with Content-Type: application/json"
        )
    body = bytes(body)
    if not body:
        raise RequestError("body is empty: send the image's bytes", error_type="InvalidImage")
    if len(body) > limits.max_bytes:
        raise too_large(f"body has {len(body)} bytes; handler.max_image_bytes is {limits.max_bytes}")
    if sniff_format(body) == "JSON text":
        raise RequestError(
            f"body is JSON, not an image, but its Content-Type is {content_type!r}: send JSON with Content-Type: "
            f"application/json",
            code=415,
            error_type="UnsupportedMediaType",
        )
    return body


def images_from_json(value: Any, field: str = "images", sources: ImageSources = DEFAULT_SOURCES) -> list[bytes]:
    """The image bytes of a JSON field holding one image or a non-empty list of them, each a base64 string, a
    ``data:image/...;base64,`` URI, or an http(s) URL from an allowed host."""
    if isinstance(value, str):
        return [image_from_string(value, f"'{field}'", sources)]
    if not isinstance(value, list) or not value:
        raise RequestError(
            f"'{field}' must be an image (a base64 string or a data: URI) or a non-empty list of them, got "
            f"{shown(value)}"
        )
    if len(value) > sources.max_images:
        raise too_large(
            f"'{field}' has {len(value)} images; at most {sources.max_images} are allowed per request "
            f"(handler.max_images)"
        )
    return [image_from_string(item, f"'{field}'[{i}]", sources) for i, item in enumerate(value)]


@dataclass(frozen=True)
class RequestImages:
    """The images one request's body carries: their encoded bytes, the name each refusal uses, whether one image was
    sent as one (a raw body, ``image``, or ``images`` holding one string: its answer is not wrapped in a list), and
    the body's other fields (the kind's options, checked by the kind)."""

    images: tuple[bytes, ...]
    names: tuple[str, ...]
    single: bool
    options: dict[str, Any]  # named as the image requests module names them (the kind checks them)


def images_from_request(body: Any, content_type: str, sources: ImageSources = DEFAULT_SOURCES) -> RequestImages:
    """The images of one request's body, as TorchServe hands it over: the image's own bytes (an ``image/*`` or
    ``application/octet-stream`` Content-Type, or none at all), or a JSON object with ``image`` (one) or ``images``
    (one or a list), each base64, a ``data:`` URI or an allowed http(s) URL."""
    if is_image_content_type(content_type):
        return RequestImages((image_from_body(body, content_type, sources.limits),), ("body",), True, {})
    unlabelled = _unlabelled_image(body, content_type, sources.limits)
    if unlabelled is not None:
        return RequestImages((unlabelled,), ("body",), True, {})
    body = _json_object(body, content_type)
    present = [name for name in ("image", "images") if name in body]
    if len(present) != 1:
        raise RequestError("send exactly one of 'image' (one image) or 'images' (a list of images)")
    fields = dict(body)
    value = fields.pop(present[0])
    if present[0] == "image":
        if isinstance(value, list):
            raise RequestError("'image' holds one image: send a list as 'images'")
        return RequestImages((image_from_string(value, "'image'", sources),), ("'image'",), True, fields)
    images = images_from_json(value, "images", sources)
    if isinstance(value, str):  # one image as a lone value: answered as one, as 'image' is
        return RequestImages(tuple(images), ("'images'",), True, fields)
    return RequestImages(tuple(images), tuple(f"'images'[{i}]" for i in range(len(images))), False, fields)


def _unlabelled_image(body: Any, content_type: str, limits: ImageLimits) -> bytes | None:
    """The body's bytes when it is an image sent without a Content-Type (the bytes say what they are); a 415 when it
    is an image sent as something else (JSON, text), naming the type to send; else None (not an image)."""
    if not isinstance(body, (bytes, bytearray)) or not body:
        return None
    found = sniff_format(bytes(body[:1024]))
    if found not in DECODABLE:
        return None
    if not content_type:
        return image_from_body(body, OCTET_STREAM, limits)
    raise RequestError(
        f"body is a {DECODABLE[found]} image but its Content-Type is {content_type!r}: send it with Content-Type: "
        f"{served_media_types(ImageLimits(formats=(found,)))[0]}",
        code=415,
        error_type="UnsupportedMediaType",
    )


def _json_object(body: Any, content_type: str) -> dict[str, Any]:
    if isinstance(body, (bytes, bytearray)):  # TorchServe could not parse it, or it was not sent as JSON
        body = decode_json(body)
    elif isinstance(body, str) and content_type != "application/json":  # text/* arrives decoded
        body = decode_json(body.encode("utf-8"))
    if not isinstance(body, dict):
        raise RequestError(
            f"body must be a JSON object with 'image' or 'images' (or the image's bytes with an image/* "
            f"Content-Type), got {type(body).__name__}"
        )
    return body


_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]{0,15}):")
_BASE64_SPACE = str.maketrans("", "", " \t\r\n")
_BASE64_BAD = re.compile(r"[^A-Za-z0-9+/=_-]")


def image_from_string(value: Any, name: str, sources: ImageSources = DEFAULT_SOURCES) -> bytes:
    """One image given as a JSON string: base64, a base64 ``data:`` URI, or an http(s) URL (``name`` is the field,
    for messages)."""
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string (base64, a data: URI or an http(s) URL), got {shown(value)}")
    if not value.strip():
        raise RequestError(f"{name} is empty", error_type="InvalidImage")
    scheme = _SCHEME.match(value)
    if scheme is not None:
        kind = scheme.group(1).lower()
        if kind == "data":
            return _data_uri(value, name, sources.limits)
        if kind in ("http", "https"):
            return fetch_image(value, name, sources)
        raise RequestError(
            f"{name} is a {kind}: URL; send the image as base64, a data:image/...;base64, URI or an http(s) URL"
        )
    return base64_image(value, name, sources.limits)


def _data_uri(value: str, name: str, limits: ImageLimits) -> bytes:
    header, comma, payload = value.partition(",")
    if not comma:
        raise RequestError(f"{name} is a data: URI without a ',' before its data", error_type="InvalidImage")
    parts = [part.strip() for part in header[len("data:") :].split(";")]
    if "base64" not in (part.lower() for part in parts[1:]):
        raise RequestError(
            f"{name} is a data: URI that is not base64: send data:<type>;base64,<data>", error_type="InvalidImage"
        )
    media_type_format(parts[0] or OCTET_STREAM, f"the data: URI type of {name}", limits)
    return base64_image(payload, name, limits)


def base64_image(text: str, name: str, limits: ImageLimits = DEFAULT_LIMITS) -> bytes:
    """The bytes of a base64 string (standard or URL-safe alphabet, padding optional, line breaks ignored as MIME
    writes them), checked against the byte limit before decoding."""
    compact = text.translate(_BASE64_SPACE)
    digits = compact.rstrip("=")
    if len(digits) * 3 // 4 > limits.max_bytes:  # before decoding: the copy would cost as much as the image
        raise too_large(
            f"{name} holds {len(digits) * 3 // 4} bytes in base64; handler.max_image_bytes is {limits.max_bytes}"
        )
    bad = _BASE64_BAD.search(compact)
    if bad is not None:
        raise RequestError(
            f"{name} is not valid base64: {bad.group()!r} at character {text.index(bad.group())}",
            error_type="InvalidImage",
        )
    if "=" in digits:
        raise RequestError(f"{name} is not valid base64: '=' padding before its end", error_type="InvalidImage")
    if len(digits) % 4 == 1:
        raise RequestError(
            f"{name} is not valid base64: {len(digits)} digits cannot encode whole bytes (cut short?)",
            error_type="InvalidImage",
        )
    if "-" in digits or "_" in digits:
        if "+" in digits or "/" in digits:
            raise RequestError(
                f"{name} is not valid base64: it mixes the standard (+/) and URL-safe (-_) alphabets",
                error_type="InvalidImage",
            )
        digits = digits.translate(str.maketrans("-_", "+/"))
    try:
        data = base64.b64decode(digits + "=" * (-len(digits) % 4), validate=True)
    except binascii.Error as error:
        raise RequestError(f"{name} is not valid base64: {error}", error_type="InvalidImage") from None
    if not data:
        raise RequestError(f"{name} is empty", error_type="InvalidImage")
    return data


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``host`` is one of ``allowed`` (exact names; ``*.example.com`` for the subdomains of example.com)."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        if entry.startswith("*."):
            if host.endswith(entry[1:]):
                return True
        elif host == entry:
            return True
    return False


def fetch_image(url: str, name: str, sources: ImageSources = DEFAULT_SOURCES) -> bytes:
    """An image URL's bytes, fetched only from an allowed host: one deadline for the whole fetch, the byte limit
    enforced while reading, redirects followed only to the same host (a redirect elsewhere would let any allowed
    host's open redirect reach every other one)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not sources.url_hosts:
        raise RequestError(
            f"{name} is a URL, and this model fetches no images (handler.image_url_hosts is empty): send the image "
            f"as base64 or a data:image/...;base64, URI"
        )
    if parts.username is not None or parts.password is not None:
        raise RequestError(f"{name} is a URL with credentials in it; they are not sent")
    if not host_allowed(host, sources.url_hosts):
        raise RequestError(f"{name} is a URL on host {host!r}, which is not in handler.image_url_hosts")
    # The worker waits for the fetch (its batch with it): hence opt-in hosts, one deadline and the byte limit.
    deadline = time.monotonic() + sources.url_timeout_s
    opener = urllib.request.build_opener(_SameHostRedirects(host, name))
    request = urllib.request.Request(url, headers={"Accept": ", ".join(served_media_types(sources.limits))})
    try:
        with opener.open(request, timeout=sources.url_timeout_s) as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > sources.limits.max_bytes:
                raise too_large(
                    f"{name} is a URL whose image has {declared} bytes; handler.max_image_bytes is "
                    f"{sources.limits.max_bytes}"
                )
            return _read_bounded(response, name, sources, deadline)
    except RequestError:
        raise
    except urllib.error.HTTPError as error:
        raise RequestError(f"{name}: fetching the URL answered HTTP {error.code}") from None
    except (OSError, ValueError, http.client.HTTPException) as error:  # URLError, timeouts, resets, bad HTTP
        reason = getattr(error, "reason", None) or error
        raise RequestError(f"{name}: the URL could not be fetched: {reason}") from None


def _read_bounded(response: Any, name: str, sources: ImageSources, deadline: float) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        if time.monotonic() > deadline:
            raise RequestError(
                f"{name}: the URL did not deliver its image within handler.image_url_timeout_s "
                f"({sources.url_timeout_s:g} s)"
            )
        chunk = response.read(65536)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > sources.limits.max_bytes:
            raise too_large(
                f"{name} is a URL whose image has more than handler.max_image_bytes ({sources.limits.max_bytes}) bytes"
            )
        chunks.append(chunk)


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the host first asked (http may become https, never the reverse), a few times."""

    max_redirections = 3

    def __init__(self, host: str, name: str) -> None:
        self.host = host.lower()
        self.name = name

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        old, new = urlsplit(req.full_url), urlsplit(newurl)
        if (new.hostname or "").lower() != self.host or (old.scheme, new.scheme) == ("https", "http"):
            raise RequestError(
                f"{self.name}: the URL redirects to {new.scheme}://{new.hostname}, another host or a downgrade to "
                f"http; only redirects within {self.host} are followed"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)
