"""The image grammar (scripts/reliability/image_grammar.py) against the real decoding path, in process: 2,000
damaged images never raise anything but a client error and never decode past the limits, the grammar's requests
get what their expectation says from handlers/image/inputs.py + decode.py, and patched headers declare what they
say."""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from handlers.core.errors import RequestError
from handlers.core.http import FORM_CONTENT_TYPES
from handlers.image.decode import DEFAULT_LIMITS, ImageLimits, decode_image, image_header
from handlers.image.inputs import ImageSources, images_from_request
from scripts.reliability import corpus, fuzz_grammar
from scripts.reliability.fuzz_grammar import EITHER, ERROR, OK, Grammar, Limits
from scripts.reliability.image_grammar import (
    MEDIA_TYPES,
    ImageProductions,
    corpus_image,
    declare_size,
    mutated_image,
    valid_image,
)

# PIL warns on the way to a refusal (a bomb over its own limit) or while skipping a damaged EXIF tag: expected here.
pytestmark = [
    pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning"),
    pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning"),
    pytest.mark.filterwarnings("ignore:Tag data larger than file:UserWarning"),
]


def test_valid_images_cover_every_format_and_mode_and_decode():
    rng = random.Random("valid")
    seen = set()
    for _ in range(300):
        image = valid_image(rng, max_side=96)
        seen.add((image.format, image.mode))
        decoded = decode_image(image.data, DEFAULT_LIMITS)
        width, height = image.size
        assert decoded.mode == "RGB"
        assert decoded.size == ((height, width) if image.orientation >= 5 else (width, height)), image.describe()
    assert {fmt for fmt, _ in seen} == set(MEDIA_TYPES)
    assert {"P+t", "I;16", "CMYK", "LA", "1"} <= {mode for _, mode in seen}


# 600 in `make test` (each outcome is reached well before that); TS_IMAGE_MUTATIONS=2000 for a longer campaign.
MUTATIONS = int(os.environ.get("TS_IMAGE_MUTATIONS", "600"))


def test_damaged_images_fail_alone_and_within_the_limits():
    """Every outcome is an RGB image within the limits or a RequestError with a 4xx: no other exception (which
    would fail a whole batch) and no image past the pixel limits. The slowest decode is printed, not asserted (a
    shared machine's timings are not a pass condition)."""
    limits = ImageLimits(max_pixels=1_000_000, max_side=4_000)
    rng = random.Random("mutations")
    outcomes = {"decoded": 0, 400: 0, 413: 0, 415: 0}
    slowest = (0.0, "")
    for index in range(MUTATIONS):
        data, described = mutated_image(rng)
        started = time.perf_counter()
        try:
            image = decode_image(data, limits, name=f"case {index}")
        except RequestError as error:
            assert error.code in (400, 413, 415), f"{described}: {error.code} {error.message}"
            assert error.message.startswith(f"case {index} "), error.message
            outcomes[error.code] += 1
        else:
            assert image.mode == "RGB"
            assert image.width * image.height <= limits.max_pixels and max(image.size) <= limits.max_side
            outcomes["decoded"] += 1
        elapsed = time.perf_counter() - started
        slowest = max(slowest, (elapsed, described))
    print(f"outcomes {outcomes}; slowest decode {slowest[0] * 1000:.1f} ms ({slowest[1]})")
    assert all(outcomes.values()), outcomes  # each outcome happened: the mutations reach every check


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "BMP", "JPEG"])
def test_declared_sizes_are_what_the_header_says(fmt):
    image = valid_image(random.Random(fmt), formats=(fmt,), max_side=16)
    patched = declare_size(image.data, 20_000, 10)
    with pytest.raises(RequestError) as caught:
        decode_image(patched)
    assert caught.value.code == 413
    assert "20000x10 pixels" in caught.value.message
    small = declare_size(image.data, 3, 2)
    assert (image_header(small).width, image_header(small).height) == (3, 2)


def test_webp_declared_sizes():
    rng = random.Random("webp")
    for _ in range(20):
        image = valid_image(rng, formats=("WEBP",), max_side=16)
        patched = declare_size(image.data, 16_384, 16_384)
        with pytest.raises(RequestError) as caught:
            decode_image(patched)
        assert caught.value.code in (400, 413), caught.value.message


def as_torchserve_hands_it(body: bytes, content_type: str):
    """The body the worker gets (ts/protocol/otf_message_handler.py): JSON decoded from UTF-8 and parsed when sent as
    JSON, text/* decoded from UTF-8, the bytes where either fails or for any other type."""
    try:
        if content_type == "application/json":
            return json.loads(body.decode("utf-8"))
        if content_type.startswith("text"):
            return body.decode("utf-8")
    except Exception:  # as TorchServe does: any failure forwards the bytes
        pass
    return bytearray(body)


@pytest.fixture
def image_kind():
    """The image classifier's kind: fuzz_grammar.PRODUCTIONS fuzzes it with these productions (with fuzz.ORACLES'
    oracle for it; tests/unit/test_model_registry.py keeps the three tables equal)."""
    assert fuzz_grammar.PRODUCTIONS["image-classification"] is ImageProductions
    return "image-classification"


def test_grammar_requests_get_what_their_expectation_says(image_kind):
    grammar = Grammar("t-vit", Limits(max_request_size=6_553_500), seed=3, kind=image_kind)
    got = {OK: 0, ERROR: 0, EITHER: 0}
    for case in grammar.cases(400):
        if case.oversize:  # TorchServe's own 413 before any handler
            continue
        error = served_in_process(case.body, case.content_type or "")
        if error is not None:
            assert 400 <= error.code < 500
            assert case.expect != OK, f"case {case.index} ({case.production}) refused: {error.message}"
        else:
            assert case.expect != ERROR, f"case {case.index} ({case.production}) was accepted: {case.preview()}"
        got[case.expect] += 1
    assert all(got.values()), got


def test_the_grammar_is_reproducible(image_kind):
    first = Grammar("t-vit", Limits(max_request_size=6_553_500), seed=5, kind=image_kind)
    again = Grammar("t-vit", Limits(max_request_size=6_553_500), seed=5, kind=image_kind)
    for index in (0, 7, 40, 123):
        assert first.case(index).body == again.case(index).body


@pytest.mark.parametrize(
    ("spec", "code", "says"),
    [
        ({"format": "PNG", "size": [8, 8], "declare": [20000, 10]}, 413, "handler.max_image_side"),
        ({"format": "GIF", "mode": "P", "declare": [10000, 10000]}, 413, "handler.max_image_pixels"),
        ({"format": "JPEG", "size": [32, 32], "truncate": 200}, 400, "not a valid JPEG image"),
        ({"format": "PNG", "size": [8, 8], "flip": [12, 13]}, 400, "not a valid PNG image"),
        ({"refused": "SVG"}, 415, "SVG, which is not served"),
    ],
)
def test_corpus_images(spec, code, says):
    with pytest.raises(RequestError) as caught:
        decode_image(corpus_image(spec))
    assert (caught.value.code, says in caught.value.message) == (code, True), caught.value.message


def test_corpus_images_in_json():
    body = json.loads(corpus_image({"format": "PNG", "mode": "RGBA", "json": "images", "list": True}))
    carried = images_from_request(body, "application/json")
    assert decode_image(carried.images[0]).size == (8, 8)


def served_in_process(body: bytes, content_type: str) -> RequestError | None:
    """What handlers/image/inputs.py and decode.py answer a request body as TorchServe hands it over (None: every
    image decoded), with the base handler's refusal of form bodies first."""
    media_type, sources = content_type.split(";")[0].strip(), ImageSources()
    try:
        if media_type in FORM_CONTENT_TYPES:
            raise RequestError("form fields", code=415)
        carried = images_from_request(as_torchserve_hands_it(body, media_type), media_type, sources)
        if carried.options:  # the kind's own check: the grammar's and the corpus's bodies carry no options
            raise RequestError(f"unknown field(s) {sorted(carried.options)}")
        for data, name in zip(carried.images, carried.names, strict=True):
            decode_image(data, sources.limits, name=name)
    except RequestError as error:
        return error
    return None


def test_the_image_corpus_says_what_the_decoding_path_answers():
    """tests/data/bad_requests/t-vit.yaml, each entry in process: its status and its message fragment (the served
    model answers the same through these modules; tests/integration runs the corpus against it)."""
    cases = corpus.load("t-vit")
    assert len(cases) >= 40
    wrong = []
    for case in cases:
        error = served_in_process(case.body, case.content_type)
        if error is None:
            wrong.append(f"{case.name}: accepted")
        elif (error.code, case.message in error.message) != (case.status, True):
            wrong.append(f"{case.name}: {error.code} {error.message!r} (want {case.status} with {case.message!r})")
    assert not wrong, "\n".join(wrong)
