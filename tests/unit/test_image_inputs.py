"""handlers/image/inputs.py: the ways a request carries images (raw body, base64, data: URIs, URLs from allowed hosts),
each bad one refused with a 4xx that names the field and the problem. URL fetches go to a real HTTP server on a free
local port."""

from __future__ import annotations

import base64
import http.server
import io
import json
import threading
import time

import pytest
from PIL import Image

from handlers.core.config import ConfigError, validate
from handlers.core.errors import RequestError
from handlers.image.decode import ImageLimits, decode_image
from handlers.image.inputs import (
    SOURCE_OPTIONS,
    ImageSources,
    base64_image,
    host_allowed,
    image_from_body,
    image_sources,
    images_from_json,
    images_from_request,
    is_image_content_type,
)


def png(size=(6, 4), color=(10, 200, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


PNG = png()
B64 = base64.b64encode(PNG).decode("ascii")


def refused(call, *args, **kwargs) -> RequestError:
    with pytest.raises(RequestError) as caught:
        call(*args, **kwargs)
    return caught.value


# The raw body, as TorchServe's stock image_classifier takes it.


@pytest.mark.parametrize("content_type", ["image/png", "image/jpeg", "image/webp", "application/octet-stream"])
def test_raw_body_bytes_are_the_image_whatever_image_type_is_declared(content_type):
    # A PNG declared as JPEG is decoded as the PNG it is (clients mislabel; the bytes decide).
    data = image_from_body(bytearray(PNG), content_type)
    assert data == PNG
    assert decode_image(data).getpixel((0, 0)) == (10, 200, 30)


def test_content_types_that_carry_images():
    assert is_image_content_type("image/png")
    assert is_image_content_type("Image/JPEG; charset=binary")
    assert is_image_content_type("application/octet-stream")
    assert not is_image_content_type("application/json")
    assert not is_image_content_type("text/plain")


@pytest.mark.parametrize(
    ("content_type", "says"),
    [
        ("image/svg+xml", "Content-Type is 'image/svg+xml', which is SVG, not served"),
        ("image/heic", "'image/heic', which is HEIC, not served"),
        ("application/pdf", "'application/pdf', which is PDF, not served"),
        ("image/x-unknown", "Content-Type is 'image/x-unknown', not an image type"),
        ("text/plain", "'text/plain', not an image type"),
    ],
)
def test_raw_body_of_a_type_not_served_is_a_415_naming_it(content_type, says):
    error = refused(image_from_body, PNG, content_type)
    assert error.code == 415
    assert says in error.message


def test_raw_body_refusals():
    assert refused(image_from_body, b"", "image/png").message == "body is empty: send the image's bytes"
    error = refused(image_from_body, b'{"images": []}', "image/png")
    assert error.code == 415 and "send JSON with Content-Type: application/json" in error.message
    error = refused(image_from_body, {"images": []}, "image/png")
    assert error.code == 400 and "got dict" in error.message
    error = refused(image_from_body, PNG, "image/png", ImageLimits(max_bytes=10))
    assert error.code == 413 and "handler.max_image_bytes is 10" in error.message
    assert refused(image_from_body, PNG, "image/tiff").code == 415  # TIFF is not served by default


# JSON strings: base64 and data: URIs.


def test_one_image_or_a_list():
    assert images_from_json(B64) == [PNG]
    other = png(color=(1, 2, 3))
    uri = "data:image/png;base64," + base64.b64encode(other).decode()
    assert images_from_json([B64, uri], "images") == [PNG, other]


@pytest.mark.parametrize(
    "text",
    [
        base64.urlsafe_b64encode(PNG).decode().rstrip("="),  # URL-safe, unpadded
        "\n".join(B64[i : i + 76] for i in range(0, len(B64), 76)),  # MIME line breaks
        "data:image/jpeg;base64," + B64,  # a mislabelled data: URI: the bytes decide
        "DATA:image/png;BASE64," + B64,
        "data:application/octet-stream;base64," + B64,
        "data:;base64," + B64,
    ],
)
def test_base64_spellings_clients_send(text):
    assert images_from_json([text]) == [PNG]


@pytest.mark.parametrize(
    ("value", "code", "says"),
    [
        ("", 400, "'images' is empty"),
        ("   ", 400, "'images' is empty"),
        ([], 400, "'images' must be an image"),
        (7, 400, "'images' must be an image"),
        ([B64, 7], 400, "'images'[1] must be a string"),
        ([B64, ""], 400, "'images'[1] is empty"),
        ("abc$def", 400, "'images' is not valid base64: '$' at character 3"),
        ("abcdé", 400, "'images' is not valid base64: 'é' at character 4"),
        ("abcde", 400, "'images' is not valid base64: 5 digits cannot encode whole bytes"),
        ("ab=cd", 400, "'images' is not valid base64: '=' padding before its end"),
        ("ab+c-d", 400, "mixes the standard (+/) and URL-safe (-_) alphabets"),
        ("====", 400, "'images' is empty"),
        ("data:image/png," + B64, 400, "'images' is a data: URI that is not base64"),
        ("data:image/png;base64" + B64, 400, "'images' is a data: URI without a ','"),
        ("data:image/svg+xml;base64,PHN2Zz4=", 415, "the data: URI type of 'images' is 'image/svg+xml', which is SVG"),
        ("data:text/plain;base64," + B64, 415, "'text/plain', not an image type"),
        ("file:///etc/passwd", 400, "'images' is a file: URL"),
        ("ftp://example.com/a.png", 400, "'images' is a ftp: URL"),
        ("https://example.com/cat.png", 400, "this model fetches no images (handler.image_url_hosts is empty)"),
    ],
)
def test_bad_json_images_name_the_field_and_the_problem(value, code, says):
    error = refused(images_from_json, value)
    assert error.code == code
    assert says in error.message


def test_count_and_size_limits_are_checked_before_decoding():
    error = refused(images_from_json, [B64] * 3, "images", ImageSources(max_images=2))
    assert error.code == 413
    assert error.message == "'images' has 3 images; at most 2 are allowed per request (handler.max_images)"
    limits = ImageLimits(max_bytes=len(PNG) - 1)
    error = refused(base64_image, B64, "'images'[0]", limits)
    assert error.code == 413
    assert f"'images'[0] holds {len(PNG)} bytes in base64; handler.max_image_bytes is {len(PNG) - 1}" in error.message
    assert base64_image(B64, "x", ImageLimits(max_bytes=len(PNG))) == PNG


def test_sources_from_the_handler_config():
    config = validate({"image_url_hosts": ["Images.Example.com", "*.cdn.example.org"], "max_images": 8}, SOURCE_OPTIONS)
    sources = image_sources(config)
    assert sources.url_hosts == ("images.example.com", "*.cdn.example.org")
    assert sources.max_images == 8
    assert image_sources({}) == ImageSources()
    with pytest.raises(ConfigError, match="handler.image_url_hosts"):
        validate({"image_url_hosts": ["http://example.com/"]}, SOURCE_OPTIONS)


def test_host_matching():
    allowed = ("images.example.com", "*.cdn.example.org")
    assert host_allowed("IMAGES.example.com", allowed)
    assert host_allowed("a.b.cdn.example.org", allowed)
    assert not host_allowed("cdn.example.org", allowed)
    assert not host_allowed("evilcdn.example.org", allowed)
    assert not host_allowed("images.example.com.evil.net", allowed)


# A whole request body, as TorchServe hands it over.


def test_request_with_a_raw_image_body():
    carried = images_from_request(bytearray(PNG), "image/png")
    assert (carried.images, carried.names, carried.single, carried.options) == ((PNG,), ("body",), True, {})
    assert images_from_request(bytearray(PNG), "").images == (PNG,)  # no Content-Type: the bytes say what they are


def test_request_with_json_images():
    carried = images_from_request({"image": B64, "top_k": 3}, "application/json")
    assert (carried.images, carried.names, carried.single) == ((PNG,), ("'image'",), True)
    assert carried.options == {"top_k": 3}
    carried = images_from_request({"images": B64}, "application/json")  # a lone value: answered as one
    assert (carried.images, carried.names, carried.single) == ((PNG,), ("'images'",), True)
    carried = images_from_request(json.dumps({"images": [B64, B64]}).encode(), "text/plain")
    assert (carried.images, carried.names, carried.single) == ((PNG, PNG), ("'images'[0]", "'images'[1]"), False)


@pytest.mark.parametrize(
    ("body", "content_type", "code", "says"),
    [
        (
            bytearray(PNG),
            "application/json",
            415,
            "body is a PNG image but its Content-Type is 'application/json': send it with Content-Type: image/png",
        ),
        (bytearray(PNG), "text/plain", 415, "send it with Content-Type: image/png"),
        ({"image": B64, "images": [B64]}, "application/json", 400, "send exactly one of 'image'"),
        ({"text": "a cat"}, "application/json", 400, "send exactly one of 'image'"),
        ({"image": [B64]}, "application/json", 400, "'image' holds one image: send a list as 'images'"),
        ({"images": [B64, 5]}, "application/json", 400, "'images'[1] must be a string"),
        ([B64], "application/json", 400, "body must be a JSON object with 'image' or 'images'"),
        (bytearray(b"{not json"), "application/json", 400, "body is not valid JSON"),
        (bytearray(b'{"image": "x"}'), "image/jpeg", 415, "body is JSON, not an image"),
    ],
)
def test_request_refusals_name_the_problem(body, content_type, code, says):
    error = refused(images_from_request, body, content_type)
    assert error.code == code
    assert says in error.message


# URLs from allowed hosts, fetched from a real local HTTP server.


class _Images(http.server.BaseHTTPRequestHandler):
    port = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading at its limit: what the tests want

    def _answer(self):
        if self.path == "/cat.png":
            self._send(PNG)
        elif self.path == "/same-host":
            self._redirect(f"http://127.0.0.1:{self.port}/cat.png")
        elif self.path == "/other-host":
            self._redirect(f"http://localhost:{self.port}/cat.png")
        elif self.path == "/declared-big":
            self._send(PNG, length=10**9)
        elif self.path == "/endless":
            self.send_response(200)
            self.end_headers()
            for _ in range(64):
                self.wfile.write(bytes(65536))
        elif self.path == "/trickle":
            self.send_response(200)
            self.end_headers()
            for _ in range(40):
                self.wfile.write(PNG[:8])
                self.wfile.flush()
                time.sleep(0.05)
        else:
            self.send_error(404)

    def _send(self, data, length=None):
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(length or len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _redirect(self, location):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    server.daemon_threads = True
    _Images.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{_Images.port}"
    server.shutdown()
    server.server_close()


def allowing(*hosts, **options) -> ImageSources:
    return ImageSources(url_hosts=hosts, **options)


def test_an_allowed_host_is_fetched(image_server):
    assert images_from_json(f"{image_server}/cat.png", "images", allowing("127.0.0.1")) == [PNG]
    assert images_from_json([f"{image_server}/same-host"], "images", allowing("127.0.0.1")) == [PNG]


def test_a_host_not_listed_is_refused_without_a_fetch(image_server):
    error = refused(images_from_json, f"{image_server}/cat.png", "images", allowing("images.example.com"))
    assert error.code == 400
    assert "on host '127.0.0.1', which is not in handler.image_url_hosts" in error.message


def test_redirects_to_another_host_are_not_followed(image_server):
    error = refused(images_from_json, f"{image_server}/other-host", "img", allowing("127.0.0.1", "localhost"))
    assert error.code == 400
    assert "redirects to http://localhost" in error.message


@pytest.mark.parametrize("path", ["/declared-big", "/endless"])
def test_the_byte_limit_holds_while_fetching(image_server, path):
    sources = allowing("127.0.0.1", limits=ImageLimits(max_bytes=100_000))
    error = refused(images_from_json, f"{image_server}{path}", "images", sources)
    assert error.code == 413
    assert "handler.max_image_bytes" in error.message


def test_a_fetch_that_outlasts_its_deadline_is_refused(image_server):
    error = refused(images_from_json, f"{image_server}/trickle", "images", allowing("127.0.0.1", url_timeout_s=0.3))
    assert error.code == 400
    assert "did not deliver its image within handler.image_url_timeout_s (0.3 s)" in error.message


def test_upstream_errors_name_the_field(image_server):
    error = refused(images_from_json, [B64, f"{image_server}/missing.png"], "images", allowing("127.0.0.1"))
    assert error.message == "'images'[1]: fetching the URL answered HTTP 404"
    error = refused(images_from_json, "http://user:pw@127.0.0.1/cat.png", "images", allowing("127.0.0.1"))
    assert "credentials" in error.message
