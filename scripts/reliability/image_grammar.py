"""The image grammar: seeded images of every mode, size and format an image model serves, the same images damaged in
the ways real files and hostile clients damage them, and request bodies that carry them.

- :func:`valid_image`: a JPEG, PNG, WebP, GIF or BMP of a random mode (1, L, LA, P with and without transparency,
  RGB, RGBA, CMYK, 16-bit I;16), size and content, sometimes animated or with an EXIF orientation;
- :func:`mutated_image`: such an image truncated, with header or body bytes flipped, a huge declared size patched
  into its header (checksums fixed, so the decoder believes it), bytes spliced or appended, or emptied;
- :func:`declare_size`: an image's header rewritten to declare another width and height (decompression bombs and
  20,000-pixel-wide images without the pixels);
- :func:`corpus_image`: the bytes of a ``body_image`` entry of a bad-request corpus (tests/data/bad_requests/);
- :class:`ImageProductions`: the fuzzer's productions for a model whose body is a raw image (``image/*``) or JSON
  ``{"image": ...}`` / ``{"images": [...]}`` (handlers/image/inputs.py), valid and invalid, each with what the
  server must do (fuzz_grammar's OK / ERROR / EITHER). fuzz_grammar.PRODUCTIONS takes it under an image kind's
  name together with that kind's oracle in fuzz.ORACLES (the registry test keeps those tables equal).

Every function draws from the ``random.Random`` it is given, so a case is rebuilt from its seed.
"""

import base64
import io
import json
import random
import struct
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image

# fuzz_grammar's expectations, spelled as it spells them: it will import this module for its PRODUCTIONS table, so
# importing them from it would be circular.
EITHER, ERROR, OK = "either", "error", "ok"

MEDIA_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}
# The modes each format writes (PIL's encoders); "P+t" is a palette image with a transparent index.
MODES = {
    "JPEG": ["RGB", "L", "CMYK"],
    "PNG": ["RGB", "RGBA", "L", "LA", "1", "P", "P+t", "I;16"],
    "WEBP": ["RGB", "RGBA"],
    "GIF": ["P", "P+t", "L"],
    "BMP": ["RGB", "L", "1", "P"],
}


@dataclass
class GeneratedImage:
    data: bytes
    format: str  # PIL's name: JPEG, PNG, WEBP, GIF, BMP
    mode: str
    size: tuple[int, int]
    frames: int = 1
    orientation: int = 1  # EXIF orientation written (1: none)

    @property
    def media_type(self):
        return MEDIA_TYPES[self.format]

    def describe(self):
        extra = (f", {self.frames} frames" if self.frames > 1 else "") + (
            f", EXIF orientation {self.orientation}" if self.orientation != 1 else ""
        )
        return f"{self.format} {self.mode} {self.size[0]}x{self.size[1]}{extra}"


def picture(rng, mode, size):
    """An image of ``mode`` and ``size``: noise, a gradient or a flat colour (each compresses differently)."""
    width, height = size
    numbers = np.random.default_rng(rng.randrange(2**32))
    style = rng.choice(["noise", "gradient", "flat"])
    if style == "noise":
        pixels = numbers.integers(0, 256, (height, width, 4), dtype=np.uint8)
    elif style == "gradient":
        y, x = np.mgrid[0:height, 0:width]
        pixels = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256, x % 256], -1)
        pixels = pixels.astype(np.uint8)
    else:
        pixels = np.broadcast_to(numbers.integers(0, 256, 4, dtype=np.uint8), (height, width, 4)).copy()
    rgba = Image.fromarray(pixels, "RGBA")
    if mode == "I;16":
        wide = pixels[..., 0].astype(np.uint16) * 257 + numbers.integers(0, 257, (height, width), dtype=np.uint16)
        return Image.fromarray(wide)
    if mode in ("P", "P+t"):
        image = rgba.convert("RGB").quantize(rng.choice([2, 16, 256]))
        if mode == "P+t":
            image.info["transparency"] = 0
        return image
    return rgba if mode == "RGBA" else rgba.convert("LA" if mode == "LA" else "RGB").convert(mode)


def image_size(rng, max_side=512):
    """Mostly thumbnails, sometimes a few hundred pixels, with odd shapes (1 pixel wide, long strips)."""
    shape, small = rng.random(), min(64, max_side)
    if shape < 0.1:
        return (1, rng.randint(1, small)) if rng.random() < 0.5 else (rng.randint(1, small), 1)
    side = rng.randint(1, small) if shape < 0.8 or max_side <= small else rng.randint(small + 1, max_side)
    return side, min(max_side, max(1, int(side * rng.choice([0.25, 0.75, 1.0, 1.33, 3.0]))))


def valid_image(rng, formats=tuple(MODES), max_side=512):
    """A valid image of a random format, mode and size (see the module docstring)."""
    fmt = rng.choice(list(formats))
    mode = rng.choice(MODES[fmt])
    size = image_size(rng, max_side)
    image = picture(rng, mode, size)
    options = {}
    if mode == "P+t":
        options["transparency"] = 0
    if fmt == "JPEG":
        options["quality"] = rng.choice([30, 75, 95])
        options["progressive"] = rng.random() < 0.3
    if fmt == "WEBP":
        options["lossless"] = rng.random() < 0.5
    orientation = 1
    if fmt in ("JPEG", "PNG", "WEBP") and rng.random() < 0.2:
        orientation = rng.randint(2, 8)
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif
    frames = 1
    # PIL's APNG writer takes no transparency option for a palette image's frames.
    animatable = mode not in ("I;16", "1") and (fmt, mode) != ("PNG", "P+t")
    if fmt in ("GIF", "PNG", "WEBP") and animatable and rng.random() < 0.15:
        frames = rng.randint(2, 4)
        options.update(save_all=True, append_images=[picture(rng, mode, size) for _ in range(frames - 1)])
        options.update(duration=40, loop=0)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return GeneratedImage(buffer.getvalue(), fmt, mode, size, frames, orientation)


# ------------------------------------------------------------------------------------------------ damage
def declare_size(data, width, height):
    """``data`` (a PNG, GIF, BMP, JPEG or lossless/extended WebP) with its header declaring ``width`` x ``height``
    (clamped to what the format can declare; checksums fixed); other bytes unchanged."""
    if len(data) < 33:  # too short for any header to patch (a truncated image): unchanged
        return data
    if data.startswith(b"\x89PNG"):
        ihdr = struct.pack(">II", width, height) + data[24:29]
        crc = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr) & 0xFFFFFFFF)
        return data[:16] + ihdr + crc + data[33:]
    if data[:3] == b"GIF":
        return _gif_declaring(data, min(width, 65535), min(height, 65535))
    if data[:2] == b"BM":
        size = struct.pack("<ii", min(width, 2**31 - 1), min(height, 2**31 - 1))
        return data[:18] + size + data[26:]
    if data[:2] == b"\xff\xd8":
        return _jpeg_declaring(data, min(width, 65535), min(height, 65535))
    if data[:4] == b"RIFF" and data[12:16] == b"VP8L":
        bits = (
            (min(width, 16384) - 1)
            | ((min(height, 16384) - 1) << 14)
            | (struct.unpack("<I", data[21:25])[0] & ~0xFFFFFFF)
        )
        return data[:21] + struct.pack("<I", bits & 0xFFFFFFFF) + data[25:]
    if data[:4] == b"RIFF" and data[12:16] == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":  # lossy: 14-bit sides
        return data[:26] + struct.pack("<HH", min(width, 16383), min(height, 16383)) + data[30:]
    if data[:4] == b"RIFF" and data[12:16] == b"VP8X":
        size = (min(width, 2**24) - 1).to_bytes(3, "little") + (min(height, 2**24) - 1).to_bytes(3, "little")
        return data[:24] + size + data[30:]
    return data


def _gif_declaring(data, width, height):
    """A GIF's logical screen and first frame rewritten to ``width`` x ``height`` (PIL takes the larger of both)."""
    size = struct.pack("<HH", width, height)
    patched = bytearray(data[:6] + size + data[10:])
    at = 13 + (3 * 2 ** ((data[10] & 7) + 1) if data[10] & 0x80 else 0)  # after the global colour table
    while at < len(patched) and patched[at] == 0x21:  # extension blocks: label, then sub-blocks until a zero
        at += 2
        while at < len(patched) and patched[at]:
            at += patched[at] + 1
        at += 1
    if at + 9 <= len(patched) and patched[at] == 0x2C:
        patched[at + 5 : at + 9] = size
    return bytes(patched)


def _jpeg_declaring(data, width, height):
    """A JPEG's first start-of-frame segment (SOF0..SOF15 but DHT/JPG/DAC) rewritten to ``width`` x ``height``."""
    at = 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker, length = data[at + 1], struct.unpack(">H", data[at + 2 : at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return data[: at + 5] + struct.pack(">HH", height, width) + data[at + 9 :]
        at += 2 + length
    return data


def truncate(rng, data):
    cut = rng.choice([0, 1, 4, 8, 16, 32, rng.randrange(len(data)), len(data) // 2, len(data) - 1, len(data) - 16])
    return data[: max(0, cut)]


def flip_bytes(rng, data, header=True):
    """Some bytes replaced: in the first 64 (the header) or anywhere."""
    damaged = bytearray(data)
    span = min(len(damaged), 64) if header else len(damaged)
    for _ in range(rng.choice([1, 2, 4, 16])):
        if span:
            at = rng.randrange(span)
            damaged[at] = rng.choice([0x00, 0xFF, damaged[at] ^ (1 << rng.randrange(8)), rng.randrange(256)])
    return bytes(damaged)


def huge_declared(rng, data):
    width, height = rng.choice(
        [(20_000, 10), (10, 20_000), (12_001, 1), (10_000, 10_000), (65_535, 65_535), (16_384, 16_384), (2**31 - 1, 1)]
    )
    return declare_size(data, width, height)


def splice(rng, data):
    """Bytes of another kind appended, repeated or inserted: trailing garbage, a second image, a repeated block."""
    at = rng.randrange(len(data) + 1)
    piece = rng.choice(
        [b"\x00" * rng.randint(1, 4096), bytes(rng.randrange(256) for _ in range(64)), data[: len(data) // 2]]
    )
    return rng.choice([data + piece, data[:at] + piece + data[at:], data[:at] + data[at // 2 :]])


def with_scans(data, copies):
    """A JPEG with ``copies`` more of its last start-of-scan header before its end: each scan decodes the whole image
    again, so many of them make a decode-time bomb of a small file. Other formats unchanged."""
    last = data.rfind(b"\xff\xda") if data.startswith(b"\xff\xd8") else -1
    if last < 0 or last + 4 > len(data):
        return data
    header = data[last : last + 2 + struct.unpack(">H", data[last + 2 : last + 4])[0]]
    return data[:-2] + header * copies + b"\xff\xd9"


def extra_scans(rng, data):
    return with_scans(data, rng.choice([50, 101, 1000, 20_000]))


MUTATIONS = {
    "truncated": truncate,
    "header bytes flipped": lambda rng, data: flip_bytes(rng, data, header=True),
    "bytes flipped": lambda rng, data: flip_bytes(rng, data, header=False),
    "huge declared size": huge_declared,
    "spliced": splice,
    "extra scans": extra_scans,
}


def mutated_image(rng, formats=tuple(MODES), max_side=256):
    """(bytes, description): a valid image damaged by one or two mutations (see the module docstring)."""
    image = valid_image(rng, formats, max_side)
    data, names = image.data, []
    for _ in range(rng.choice([1, 1, 2])):
        name = rng.choice(list(MUTATIONS))
        data = MUTATIONS[name](rng, data) if data else data
        names.append(name)
    return data, f"{image.describe()}, {' + '.join(names)}"


# Formats no image model serves, as clients send them: each must be refused by name.
REFUSED_FORMATS = {
    "SVG": b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect/></svg>',
    "PDF": b"%PDF-1.7\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n",
    "HEIC": b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(32),
    "AVIF": b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf" + bytes(32),
    "PSD": b"8BPS\x00\x01" + bytes(32),
    "ICO": b"\x00\x00\x01\x00\x01\x00\x10\x10" + bytes(32),
}


def tiff(rng):
    buffer = io.BytesIO()
    picture(rng, "RGB", (8, 8)).save(buffer, "TIFF")
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------ the corpus
def corpus_image(spec):
    """The bytes a corpus entry's ``body_image`` describes: ``{format, mode, size: [w, h]}`` of a generated image,
    then optionally ``declare: [w, h]`` (a header patched to declare that size), ``scans: n`` (n more scan headers in a
    JPEG), ``truncate: n`` (the first n
    bytes), ``flip: [offset, ...]`` (those bytes inverted), ``refused: SVG|PDF|HEIC|AVIF|PSD|ICO`` (such a file
    instead), ``base64: true`` (the result base64-encoded, as JSON strings carry it) and ``json: field`` (a JSON
    object with the result as that field's string, or list when ``list: true``)."""
    if "refused" in spec:
        data = REFUSED_FORMATS[spec["refused"]]
    else:
        fmt, mode = spec.get("format", "PNG"), spec.get("mode", "RGB")
        image = picture(random.Random(spec.get("seed", 0)), mode, tuple(spec.get("size", (8, 8))))
        buffer = io.BytesIO()
        image.save(buffer, fmt, **({"transparency": 0} if mode == "P+t" else {}))
        data = buffer.getvalue()
    if "declare" in spec:
        data = declare_size(data, *spec["declare"])
    if "truncate" in spec:
        data = data[: spec["truncate"]]
    if "scans" in spec:  # copies of the last scan header (a progressive JPEG's decode-time bomb)
        data = with_scans(data, spec["scans"])
    if "flip" in spec:
        damaged = bytearray(data)
        for at in spec["flip"]:
            damaged[at] ^= 0xFF
        data = bytes(damaged)
    if spec.get("base64") or "json" in spec:
        text = base64.b64encode(data).decode("ascii")
        if "json" in spec:
            value = [text] if spec.get("list") else text
            return json.dumps({spec["json"]: value}).encode("utf-8")
        return text.encode("ascii")
    return data


# ------------------------------------------------------------------------------------------------ the fuzzer
def b64(data):
    return base64.b64encode(data).decode("ascii")


def data_uri(image):
    return f"data:{image.media_type};base64,{b64(image.data)}"


class ImageProductions:
    """The fuzzer's productions for an image model (fuzz_grammar's production protocol: each returns
    ``(body, content_type, expect)``). Limits come from the served ``handler:`` section (max_images,
    max_image_side), defaults as handlers/image/ has them."""

    def __init__(self, limits, seed, pool_size):
        handler = getattr(limits, "handler", None) or {}
        self.max_images = int(handler.get("max_images", 16))
        self.max_side = int(handler.get("max_image_side", 12_000))

    def _json(self, value, key):
        return json.dumps({key: value}).encode("utf-8"), "application/json"

    def good_raw(self, rng):
        image = valid_image(rng)
        return image.data, image.media_type, OK

    def good_raw_mislabelled(self, rng):  # a PNG sent as image/jpeg: the bytes decide
        image = valid_image(rng)
        return image.data, rng.choice(sorted(set(MEDIA_TYPES.values()) - {image.media_type})), OK

    def good_octet_stream(self, rng):
        return valid_image(rng).data, "application/octet-stream", OK

    def good_json_one(self, rng):
        image = valid_image(rng)
        return (*self._json(rng.choice([b64(image.data), data_uri(image)]), "image"), OK)

    def good_json_list(self, rng):
        images = [valid_image(rng, max_side=128) for _ in range(rng.randint(1, min(4, self.max_images)))]
        return (*self._json([rng.choice([b64(i.data), data_uri(i)]) for i in images], "images"), OK)

    def good_at_max_images(self, rng):
        images = [valid_image(rng, max_side=16) for _ in range(self.max_images)]
        return (*self._json([b64(i.data) for i in images], "images"), OK)

    def mutated_raw(self, rng):  # a damaged image may still decode (a flipped pixel byte): 200 or its own 4xx
        data, _ = mutated_image(rng)
        return data, rng.choice(list(MEDIA_TYPES.values())), EITHER if data else ERROR

    def mutated_in_list(self, rng):
        data, _ = mutated_image(rng)
        values = [b64(valid_image(rng, max_side=32).data), b64(data)]
        rng.shuffle(values)
        return (*self._json(values, "images"), EITHER if data else ERROR)

    def huge_declared(self, rng):  # over max_image_side or max_image_pixels by the header alone: 413
        image = valid_image(rng, formats=("PNG", "GIF", "BMP", "JPEG"), max_side=32)
        return (
            declare_size(image.data, *rng.choice([(20_000, 10), (10_000, 10_000), (65_535, 65_535)])),
            image.media_type,
            ERROR,
        )

    def header_cut(self, rng):  # cut inside the header: never decodable
        image = valid_image(rng)
        return image.data[: rng.randint(0, 12)], image.media_type, ERROR

    def refused_format(self, rng):
        name = rng.choice(list(REFUSED_FORMATS) + ["TIFF"])
        data = tiff(rng) if name == "TIFF" else REFUSED_FORMATS[name]
        content_type = rng.choice(["application/octet-stream", "image/png", "image/svg+xml", "image/heic"])
        if rng.random() < 0.5:
            return (*self._json(b64(data), "image"), ERROR)
        return data, content_type, ERROR

    def wrong_content_type(self, rng):  # image bytes declared as JSON or text: 415 naming the type to send
        return valid_image(rng).data, rng.choice(["application/json", "text/plain", "text/plain; charset=utf-8"]), ERROR

    def bad_strings(self, rng):
        value = rng.choice(
            [
                "",
                " ",
                "abc$def",
                "abcde",
                "ab=cd",
                "====",
                "data:image/png," + b64(valid_image(rng, max_side=8).data),
                "data:text/plain;base64,aGVsbG8=",
                "https://example.com/cat.png",
                "file:///etc/passwd",
                "not base64 at all, just text",
            ]
        )
        return (*self._json(rng.choice([value, [value]]), rng.choice(["image", "images"])), ERROR)

    def wrong_types(self, rng):
        value = rng.choice([None, 5, True, {}, {"url": "x"}, [], [[]], [None], [5]])
        return (*self._json(value, rng.choice(["image", "images"])), ERROR)

    def too_many_images(self, rng):
        tiny = b64(valid_image(rng, formats=("PNG",), max_side=4).data)
        return (*self._json([tiny] * (self.max_images + rng.choice([1, 5])), "images"), ERROR)

    def empty_body(self, rng):
        return b"", rng.choice(list(MEDIA_TYPES.values())), ERROR

    def weighted(self):
        """(production, weight) pairs; the first cases walk them in this order."""
        return [
            (self.good_raw, 20),
            (self.good_raw_mislabelled, 3),
            (self.good_octet_stream, 2),
            (self.good_json_one, 8),
            (self.good_json_list, 8),
            (self.good_at_max_images, 0.5),
            (self.mutated_raw, 20),
            (self.mutated_in_list, 6),
            (self.huge_declared, 4),
            (self.header_cut, 3),
            (self.refused_format, 4),
            (self.wrong_content_type, 3),
            (self.bad_strings, 5),
            (self.wrong_types, 3),
            (self.too_many_images, 1),
            (self.empty_body, 1),
        ]

    def good_body(self, rng):
        return self._json([b64(valid_image(rng, max_side=32).data)], "images")[0]
