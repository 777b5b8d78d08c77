"""The image mix of the load tests: seeded images from 64-pixel thumbnails to 4,000-pixel photos, JPEG, PNG and WebP,
sent as the raw body or as JSON base64.

Nothing is stored: :func:`image_pool` draws the images from the seed when a load generator starts (about a second
for the 40 images, the same bytes on every machine with the same Pillow), and every process that sends the mix (the
Locust workers, the in-process ceiling, the ideal batcher) draws the same pool. Each request then takes one image of
the pool and stamps a counter into a metadata field of fixed width (:func:`stamp`): every request's bytes differ,
so a cache keyed by the image's digest never hits and a comparison measures decoding and computing, not a cache,
while the stamping costs the generator a byte copy instead of an encode.

The pool follows :data:`SIZES`: mostly phone-screen and web sizes, a tail of full-size photos (which cost the server
the most: decoding a 12-megapixel JPEG takes longer than ViT-base's forward pass on one image). 4,000-pixel images
are JPEG only, as cameras write them; PNG stops at 1920 pixels (a screenshot), WebP is any size up to that.
"""

from __future__ import annotations

import base64
import functools
import io
import random
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageDraw

# (width, height, images of the pool): thumbnails to 12-megapixel photos. A quarter of each size class is portrait.
SIZES = (
    (64, 64, 6),
    (160, 120, 4),
    (320, 240, 6),
    (640, 480, 10),
    (1024, 768, 6),
    (1920, 1080, 5),
    (4000, 3000, 3),
)
POOL_SIZE = sum(count for _, _, count in SIZES)
# Share of each format among the sizes that allow it (PNG and WebP end at 1920 pixels).
FORMATS = (("JPEG", 0.6), ("PNG", 0.2), ("WEBP", 0.2))
MEDIA_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}
LARGEST_PNG_OR_WEBP = 1920
# Share of requests sent as JSON ({"image": base64}) instead of the raw image body.
JSON_SHARE = 0.5
# The metadata value stamped per request: an EXIF ImageDescription (JPEG, WebP) or a PNG tEXt chunk, written once
# with zeros and overwritten in place with the same number of digits.
STAMP_PREFIX = b"loadtest-"
STAMP_DIGITS = 12
PLACEHOLDER = STAMP_PREFIX + b"0" * STAMP_DIGITS


@dataclass(frozen=True)
class PoolImage:
    """One encoded image of the pool, and where its stamp lies in the bytes."""

    data: bytes
    format: str  # JPEG, PNG or WEBP
    width: int
    height: int
    stamp_at: int  # offset of the placeholder's digits

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]


@dataclass(frozen=True)
class RawBody:
    """A request body sent as bytes with its own Content-Type (an image, an OIP binary-extension body), not as JSON,
    and any header it needs besides (the OIP body's Inference-Header-Content-Length)."""

    data: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


def _picture(rng: random.Random, width: int, height: int) -> Image.Image:
    """A photo-like picture: a smooth two-colour gradient with a few filled shapes. Smooth areas keep PNG and WebP
    files to photo-like sizes (noise would make a 1920-pixel PNG 6 MB); the shapes give the codecs edges."""
    horizontal = Image.linear_gradient("L").resize((width, height))
    first = tuple(rng.randrange(256) for _ in range(3))
    second = tuple(rng.randrange(256) for _ in range(3))
    picture = Image.composite(
        Image.new("RGB", (width, height), first), Image.new("RGB", (width, height), second), horizontal
    )
    draw = ImageDraw.Draw(picture)
    for _ in range(rng.randint(3, 8)):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = x0 + rng.randint(1, max(1, width // 3)), y0 + rng.randint(1, max(1, height // 3))
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    return picture


def _encode(picture: Image.Image, image_format: str) -> bytes:
    buffer = io.BytesIO()
    if image_format == "PNG":
        from PIL.PngImagePlugin import PngInfo

        info = PngInfo()
        info.add_text("Comment", PLACEHOLDER.decode())
        picture.save(buffer, "PNG", pnginfo=info)
    else:
        exif = Image.Exif()
        exif[0x010E] = PLACEHOLDER.decode()  # ImageDescription: a field no decoder acts on
        options = {"quality": 85} if image_format == "JPEG" else {"quality": 80, "method": 0}
        picture.save(buffer, image_format, exif=exif.tobytes(), **options)
    return buffer.getvalue()


def _pick_format(rng: random.Random, width: int, height: int) -> str:
    allowed = FORMATS if max(width, height) <= LARGEST_PNG_OR_WEBP else FORMATS[:1]
    return rng.choices([name for name, _ in allowed], weights=[share for _, share in allowed])[0]


@functools.lru_cache(maxsize=4)
def image_pool(seed: int = 0) -> tuple[PoolImage, ...]:
    """The seeded pool (:data:`SIZES`), drawn once per process and seed."""
    rng = random.Random(f"image-pool-{seed}")
    pool = []
    for width, height, count in SIZES:
        for index in range(count):
            w, h = (height, width) if index % 4 == 3 else (width, height)
            image_format = _pick_format(rng, w, h)
            data = _encode(_picture(rng, w, h), image_format)
            at = data.find(PLACEHOLDER)
            if at < 0:  # a Pillow that stores the metadata otherwise: fail loudly, not send one cached image
                raise RuntimeError(f"{image_format} writer did not keep the stamp field")
            pool.append(PoolImage(data, image_format, w, h, at + len(STAMP_PREFIX)))
    return tuple(pool)


def stamp(image: PoolImage, number: int) -> bytes:
    """The image's bytes with ``number`` in its stamp field; a PNG's chunk checksum is recomputed (decoders verify
    it), JPEG's and WebP's containers carry none over metadata."""
    digits = str(number % 10**STAMP_DIGITS).zfill(STAMP_DIGITS).encode()
    data = bytearray(image.data)
    data[image.stamp_at : image.stamp_at + STAMP_DIGITS] = digits
    if image.format == "PNG":
        # The tEXt chunk holding the stamp: length (4) + type (4) + data + CRC (4), CRC over type and data.
        start = data.rfind(b"tEXt", 0, image.stamp_at) - 4
        (length,) = struct.unpack(">I", data[start : start + 4])
        end = start + 8 + length
        data[end : end + 4] = struct.pack(">I", zlib.crc32(bytes(data[start + 4 : end])))
    return bytes(data)


class ImagePayloads:
    """Seeded stream of image requests over the pool: each draws an image, stamps it unique, and sends it as the raw
    body (share 1 - :data:`JSON_SHARE`) or as ``{"image": base64}``. ``json_share`` 0 sends raw bodies only (a
    server that takes nothing else), 1 JSON only; subclasses shape the JSON body for other APIs."""

    json_share = JSON_SHARE

    def __init__(self, seed: int = 0, stream: int = 0):
        self.pool = image_pool(seed)
        self.rng = random.Random(f"images-{seed}-{stream}")
        self.stream = stream
        self.sent = 0

    def next_image(self) -> tuple[PoolImage, bytes]:
        image = self.rng.choice(self.pool)
        self.sent += 1
        return image, stamp(image, self.stream * 1_000_000 + self.sent)

    def json_body(self, image: PoolImage, data: bytes) -> dict[str, Any]:
        return {"image": base64.b64encode(data).decode("ascii")}

    def next(self) -> RawBody | dict[str, Any]:
        image, data = self.next_image()
        if self.rng.random() < self.json_share:
            return self.json_body(image, data)
        return RawBody(data, image.media_type)


class RawImagePayloads(ImagePayloads):
    """The same images, every one as the raw body: what TorchServe's stock ``image_classifier`` handler takes."""

    json_share = 0.0


class OpenAIImagePayloads(ImagePayloads):
    """The same images as OpenAI-style embedding requests with Infinity's ``modality: image`` (a ``data:`` URI per
    image), for the Infinity baseline; ``served_name`` is set per model."""

    json_share = 1.0
    served_name = ""

    def json_body(self, image: PoolImage, data: bytes) -> dict[str, Any]:
        uri = f"data:{image.media_type};base64,{base64.b64encode(data).decode('ascii')}"
        return {"model": self.served_name, "input": [uri], "modality": "image"}


def mix_summary(seed: int = 0) -> dict[str, Any]:
    """What the pool holds: counts per format and size class, the largest and the total bytes (for reports)."""
    pool = image_pool(seed)
    formats: dict[str, int] = {}
    for image in pool:
        formats[image.format] = formats.get(image.format, 0) + 1
    return {
        "images": len(pool),
        "formats": formats,
        "sizes": [f"{w}x{h}" for w, h, _ in SIZES],
        "largest_bytes": max(len(image.data) for image in pool),
        "mean_bytes": round(sum(len(image.data) for image in pool) / len(pool)),
        "json_share": JSON_SHARE,
    }
