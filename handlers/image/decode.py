"""One image's bytes to the RGB picture a model's image processor takes, or a client error that names the problem.

:func:`decode_image` is the only place image bytes are decoded. Its checks run cheapest first, so a bad image costs
little and fails alone (a :class:`~handlers.core.errors.RequestError` for that request, never an exception for the
batch):

1. size in bytes (``handler.max_image_bytes``), then the format from the first bytes (:func:`sniff_format`): only
   the formats of :attr:`ImageLimits.formats` reach a decoder, and PIL is told to try only that one, so no other
   plugin ever parses client bytes (SVG, PDF, HEIC, ... are refused by name with 415 and the accepted list);
2. a JPEG's scans counted (:attr:`ImageLimits.max_jpeg_scans`: each progressive scan decodes the whole image
   again), then the header only (``Image.open`` reads no pixels): the declared width and height against
   ``handler.max_image_side`` and ``handler.max_image_pixels``, so a decompression bomb or a 20,000-pixel-wide image
   is refused (413) before any pixel is decoded; PIL's own bomb check (``DecompressionBombError``/``Warning``)
   answers the same 413;
3. the pixels (``load()``): a truncated or corrupt file is a 400 naming the format and PIL's reason. Decode time is
   bounded by the bytes, pixel and scan limits above; only the first frame of an animated GIF, PNG (APNG) or WebP is
   decoded and served (what PIL opens, and what transformers' ``load_image`` takes from the same file);
4. orientation and colour as transformers prepares an image: ``ImageOps.exif_transpose`` (its ``load_image``), then
   its ``convert_to_rgb`` (the image processors' ``do_convert_rgb``) step for step: an image with an alpha band or a
   ``transparency`` entry (palette, L or RGB with tRNS) is composited onto white, anything else goes through
   ``convert("RGB")`` (CMYK JPEGs as PIL converts them; 16-bit ``I;16`` values above 255 clip to 255 as PIL's
   conversion does, which is what the processor sees too).

JPEG ``draft()`` (decoding at 1/2, 1/4, 1/8 scale) is not used: it changes the pixels the processor would see.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageOps, UnidentifiedImageError

from handlers.core.config import Option
from handlers.core.errors import RequestError, too_large

# The formats a served image may have, by PIL's format name, with the name messages use. The four web formats are
# accepted by default; TIFF only where an operator lists it (handler.image_formats): libtiff brings many
# compressions, float and multi-channel modes and pages, a far larger surface than any model client needs.
DECODABLE: dict[str, str] = {
    "JPEG": "JPEG",
    "PNG": "PNG",
    "WEBP": "WebP",
    "GIF": "GIF",
    "BMP": "BMP",
    "TIFF": "TIFF",
}
DEFAULT_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP")

# PIL refuses outright (DecompressionBombError) above twice this and warns above it; a limit at or below it means
# PIL's check never fires on an image this module would accept.
PIL_PIXEL_LIMIT = int(Image.MAX_IMAGE_PIXELS or 89_478_485)


@dataclass(frozen=True)
class ImageLimits:
    """What one image may cost before and while it is decoded (``handler:`` keys in :data:`LIMIT_OPTIONS`)."""

    max_bytes: int = 20_000_000  # the encoded file (after base64 decoding)
    max_pixels: int = 40_000_000  # width x height as the header declares them, checked before decoding
    max_side: int = 12_000  # the longer side, checked before decoding
    formats: tuple[str, ...] = DEFAULT_FORMATS  # PIL format names, a subset of DECODABLE
    # Scans of a progressive JPEG: each one walks the whole image again, so a small file of empty scans takes as long
    # as its count (measured: 10,000 of them, 100 kB, kept a 2000x2000 JPEG decoding for 10.7 s instead of 0.17 s).
    # Encoders write about 10 (libjpeg's progression) and rarely more than 20.
    max_jpeg_scans: int = 100

    def __post_init__(self) -> None:
        for key, value in (
            ("max_bytes", self.max_bytes),
            ("max_pixels", self.max_pixels),
            ("max_side", self.max_side),
            ("max_jpeg_scans", self.max_jpeg_scans),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ImageLimits.{key} must be a positive integer, got {value!r}")
        if self.max_pixels > PIL_PIXEL_LIMIT:
            raise ValueError(f"ImageLimits.max_pixels is at most {PIL_PIXEL_LIMIT} (PIL's bomb limit)")
        unknown = [name for name in self.formats if name not in DECODABLE]
        if unknown or not self.formats:
            raise ValueError(f"ImageLimits.formats must be a non-empty list from {sorted(DECODABLE)}, got {unknown}")

    def accepted(self) -> str:
        """The accepted formats in words, for refusals."""
        return ", ".join(DECODABLE[name] for name in self.formats)


DEFAULT_LIMITS = ImageLimits()


def _check_formats(option: Option, key: str, value: Any) -> tuple[str, ...]:
    names = [item.upper() if isinstance(item, str) else item for item in value]
    names = ["JPEG" if name == "JPG" else name for name in names]
    bad = [item for item in names if item not in DECODABLE]
    if bad or not names:
        option.refuse(key, f"{value!r}: list one or more of {list(DECODABLE)}")
    return tuple(dict.fromkeys(names))


# The ``handler:`` keys an image model's schema takes from here (the kind adds them to its own options).
LIMIT_OPTIONS: dict[str, Option] = {
    "max_image_bytes": Option(
        int, DEFAULT_LIMITS.max_bytes, minimum=1, help="bytes of one encoded image (after base64 decoding)"
    ),
    "max_image_pixels": Option(
        int,
        DEFAULT_LIMITS.max_pixels,
        minimum=1,
        maximum=PIL_PIXEL_LIMIT,
        help="width x height of one image, read from its header before any pixel is decoded (decompression bombs)",
    ),
    "max_image_side": Option(
        int, DEFAULT_LIMITS.max_side, minimum=1, help="longer side of one image in pixels, checked before decoding"
    ),
    "image_formats": Option(
        list,
        list(DEFAULT_FORMATS),
        validator=_check_formats,
        help=f"image formats served, from {list(DECODABLE)}; others are refused by name (415)",
    ),
}


def image_limits(config: Mapping[str, Any]) -> ImageLimits:
    """The limits from a validated ``handler:`` config (keys of :data:`LIMIT_OPTIONS`; absent keys keep defaults)."""
    return ImageLimits(
        max_bytes=int(config.get("max_image_bytes", DEFAULT_LIMITS.max_bytes)),
        max_pixels=int(config.get("max_image_pixels", DEFAULT_LIMITS.max_pixels)),
        max_side=int(config.get("max_image_side", DEFAULT_LIMITS.max_side)),
        formats=tuple(config.get("image_formats", DEFAULT_LIMITS.formats)),
    )


# First bytes of each format: those PIL decodes (keys of DECODABLE) and those recognised only so that a refusal names
# what the client sent. WebP, HEIF/AVIF and text formats are recognised in sniff_format itself.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"%PDF-", "PDF"),
    (b"%!PS", "PostScript"),
    (b"\xc5\xd0\xd3\xc6", "PostScript"),
    (b"8BPS", "PSD"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"\x00\x00\x02\x00", "CUR"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (b"\xff\x0a", "JPEG XL"),
    (b"qoif", "QOI"),
    (b"DDS ", "DDS"),
    (b"v/1\x01", "OpenEXR"),
    (b"II+\x00", "BigTIFF"),
)
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1"}


def sniff_format(data: bytes) -> str | None:
    """The format of ``data`` from its first bytes: a key of :data:`DECODABLE` (PIL's name), the name of a format
    that is never decoded here (SVG, PDF, HEIC, AVIF, ...), or None when nothing is recognised."""
    head = bytes(data[:64])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[4:8] == b"ftyp":  # ISO base media: HEIF/AVIF stills, or a video
        brand = head[8:12]
        if brand in (b"avif", b"avis"):
            return "AVIF"
        return "HEIC" if brand in _HEIF_BRANDS else "MP4/QuickTime video"
    if head[:1] == b"P" and head[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6", b"7") and head[2:3].isspace():
        return "PNM"
    return _sniff_text(bytes(data[:1024]))


def _sniff_text(head: bytes) -> str | None:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if text.startswith(b"<"):
        return "SVG" if b"<svg" in text else "HTML/XML text"
    if text[:1] in (b"{", b"["):
        return "JSON text"
    return None


def image_digest(data: bytes) -> str:
    """A digest of an image's bytes, for cache keys: equal bytes, equal digest (the same hash as the text cache's)."""
    return hashlib.blake2b(bytes(data), digest_size=16).hexdigest()


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header declares (nothing decoded yet)."""

    format: str  # PIL's format name, a key of DECODABLE
    width: int
    height: int
    mode: str  # PIL's mode as opened (P, L, LA, RGB, RGBA, CMYK, I;16, ...)


def image_header(data: bytes, limits: ImageLimits = DEFAULT_LIMITS, *, name: str = "image") -> ImageHeader:
    """The header of an image that passes every check before decoding (bytes, format, side, pixels)."""
    with _open_checked(data, limits, name) as image:
        return ImageHeader(_format_of(image), image.width, image.height, image.mode)


def decode_image(data: bytes, limits: ImageLimits = DEFAULT_LIMITS, *, name: str = "image") -> Image.Image:
    """The image as an upright RGB picture, as transformers would hand it to the model's processor.

    Raises RequestError (400 corrupt or truncated, 413 over a limit, 415 a format not served) whose message starts
    with ``name`` (the request field the image came in, e.g. "'images'[2]")."""
    with _open_checked(data, limits, name) as image:
        shown_format = DECODABLE[_format_of(image)]
        try:
            image.load()  # the first frame only, for animated GIF, PNG and WebP
        except MemoryError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise _over_pixels(name, limits, image.size) from None
        except Exception as error:  # PIL's decoders raise OSError, SyntaxError, ValueError, EOFError, struct.error...
            raise RequestError(
                f"{name} is not a valid {shown_format} image (truncated or corrupt): {_reason(error)}",
                error_type="InvalidImage",
            ) from None
        try:
            upright = ImageOps.exif_transpose(image)
        except MemoryError:
            raise
        except Exception as error:
            raise RequestError(
                f"{name} has EXIF data that cannot be read, so its orientation is unknown: {_reason(error)}",
                error_type="InvalidImage",
            ) from None
        try:
            return to_rgb(upright)
        except MemoryError:
            raise
        except Exception as error:
            raise RequestError(
                f"{name} is a {shown_format} image in pixel mode {upright.mode!r}, which cannot be converted to RGB: "
                f"{_reason(error)}",
                error_type="InvalidImage",
            ) from None


def to_rgb(image: Image.Image) -> Image.Image:
    """transformers' ``convert_to_rgb`` (transformers/image_transforms.py, 5.x) for a PIL image, step for step, so
    the pixels equal what the processor computes: transparency (an alpha band, or a ``transparency`` entry in the
    image's info, as palette and tRNS images carry) is composited onto opaque white; anything else is
    ``convert("RGB")``."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


@contextmanager
def _open_checked(data: bytes, limits: ImageLimits, name: str) -> Iterator[Image.Image]:
    """The header opened by the one PIL plugin of the sniffed format, its declared size within the limits; closed
    when the block ends."""
    image = _open(data, limits, name)
    try:
        yield image
    finally:
        image.close()


def _open(data: bytes, limits: ImageLimits, name: str) -> Image.Image:
    found = _checked_format(data, limits, name)
    try:
        # formats=[...]: only this plugin parses the bytes (never a format PIL would guess from them).
        image = Image.open(io.BytesIO(bytes(data)), formats=[found])
    except MemoryError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise too_large(
            f"{name} declares more pixels than handler.max_image_pixels ({limits.max_pixels}) allows "
            f"(a decompression bomb?)"
        ) from None
    except Exception as error:
        # PIL reports a plugin's failure as "cannot identify image file <BytesIO ...>", which says nothing to a client.
        reason = "truncated or corrupt" if isinstance(error, UnidentifiedImageError) else _reason(error)
        raise RequestError(
            f"{name} is not a valid {DECODABLE[found]} image (its header cannot be read): {reason}",
            error_type="InvalidImage",
        ) from None
    try:
        _check_size(image.size, limits, name)
    except RequestError:
        image.close()
        raise
    return image


def _checked_format(data: bytes, limits: ImageLimits, name: str) -> str:
    """The PIL format name of bytes within the size limit and of a served format."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RequestError(f"{name} must be image bytes, got {type(data).__name__}", error_type="InvalidImage")
    size = len(data)
    if size == 0:
        raise RequestError(f"{name} is empty (0 bytes)", error_type="InvalidImage")
    if size > limits.max_bytes:
        raise too_large(f"{name} has {size} bytes; handler.max_image_bytes is {limits.max_bytes}")
    found = sniff_format(data)
    if found is None:
        raise RequestError(
            f"{name} is not an image in a recognised format (it starts with {bytes(data[:8])!r}); accepted formats: "
            f"{limits.accepted()}",
            code=415,
            error_type="UnsupportedMediaType",
        )
    if found not in limits.formats:
        raise RequestError(
            f"{name} is {DECODABLE.get(found, found)}, which is not served; accepted formats: {limits.accepted()}",
            code=415,
            error_type="UnsupportedMediaType",
        )
    if found == "JPEG":
        # Every start-of-scan marker counts (entropy-coded data never holds 0xFF 0xDA): a bound, in one C pass, before
        # libjpeg reads a byte. An EXIF thumbnail's own scan counts too, well within the limit.
        scans = bytes(data).count(b"\xff\xda")
        if scans > limits.max_jpeg_scans:
            raise too_large(
                f"{name} is a JPEG with {scans} scans; at most {limits.max_jpeg_scans} are decoded (each scan decodes "
                f"the whole image again)"
            )
    return found


def _check_size(size: tuple[int, int], limits: ImageLimits, name: str) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise RequestError(f"{name} declares a size of {width}x{height} pixels", error_type="InvalidImage")
    if max(width, height) > limits.max_side:
        raise too_large(
            f"{name} is {width}x{height} pixels; its longer side is over handler.max_image_side ({limits.max_side})"
        )
    if width * height > limits.max_pixels:
        raise _over_pixels(name, limits, size)


def _over_pixels(name: str, limits: ImageLimits, size: tuple[int, int]) -> RequestError:
    width, height = size
    return too_large(
        f"{name} is {width}x{height} = {width * height} pixels; handler.max_image_pixels is {limits.max_pixels}"
    )


def _format_of(image: Image.Image) -> str:
    # Only the JPEG plugin opens as another format: MPO, a JPEG with more pictures after it (cameras write them),
    # decoded as the JPEG it starts with.
    found = image.format or ""
    return found if found in DECODABLE else "JPEG"


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."
