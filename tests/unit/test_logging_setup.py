"""handlers.logging_setup: a body TorchServe's worker cannot decode costs one log line, never a traceback.

The bodies go through TorchServe's own decoding code (ts.protocol.otf_message_handler._retrieve_input_data, fed the
frontend's wire format), so the test follows TorchServe if the message or the logger it uses changes."""

import inspect
import io
import logging
import struct

import pytest
from ts.protocol import otf_message_handler

from handlers.core import logging_setup


class WireConnection:
    """The frontend's side of the worker socket: one input parameter in TorchServe's frame format."""

    def __init__(self, content_type, value):
        frame = b""
        for part in (b"body", content_type.encode(), value):
            frame += struct.pack("!i", len(part)) + part
        self.stream = io.BytesIO(frame)

    def recv(self, length):
        return self.stream.read(length)


@pytest.fixture
def worker_log():
    """The root logger as TorchServe's worker sets it up (stdout, '%(message)s', INFO), written to a buffer."""
    root = logging.getLogger()
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(message)s"))
    old_level = root.level
    # Start without the filter even when handlers.core.base (which installs it at import) was imported by another test.
    installed = [f for f in root.filters if isinstance(f, logging_setup.OneLineClientDecodeErrors)]
    for existing in installed:
        root.removeFilter(existing)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield buffer
    root.removeHandler(handler)
    root.setLevel(old_level)
    for existing in [f for f in root.filters if isinstance(f, logging_setup.OneLineClientDecodeErrors)]:
        root.removeFilter(existing)
    for existing in installed:
        root.addFilter(existing)


def decode(content_type, value):
    return otf_message_handler._retrieve_input_data(WireConnection(content_type, value))


def test_without_the_filter_torchserve_logs_a_traceback_per_malformed_body(worker_log):
    # The behaviour being fixed: if this stops holding, TorchServe changed and the filter may be obsolete.
    decode("application/json", b'{"inputs": [1,')
    assert "Traceback (most recent call last)" in worker_log.getvalue()
    assert len(worker_log.getvalue().splitlines()) > 5


@pytest.mark.parametrize(
    "content_type, body, error",
    [
        ("application/json", b'{"inputs": [1,', "JSONDecodeError"),
        ("application/json", b"\xff\xfe not utf-8", "UnicodeDecodeError"),
        ("text/plain", b"caf\xe9 latin-1", "UnicodeDecodeError"),
    ],
)
def test_a_malformed_body_costs_one_line_naming_the_error(worker_log, content_type, body, error):
    logging_setup.install()
    model_input = decode(content_type, body)
    lines = worker_log.getvalue().splitlines()
    assert model_input["value"] == body, "the raw bytes must still reach the handler, which answers 400"
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0] and error in lines[0] and "4xx" in lines[0]


def test_a_huge_malformed_body_still_makes_a_short_line(worker_log):
    logging_setup.install()
    decode("application/json", b'{"text": "' + b"x" * 100_000 + b"\n")
    (line,) = worker_log.getvalue().splitlines()
    assert len(line) < 400


def test_install_is_idempotent_and_other_tracebacks_are_kept(worker_log):
    logging_setup.install()
    logging_setup.install()
    assert sum(isinstance(f, logging_setup.OneLineClientDecodeErrors) for f in logging.getLogger().filters) == 1
    try:
        raise RuntimeError("a real server error")
    except RuntimeError:
        logging.error("inference failed", exc_info=True)
    text = worker_log.getvalue()
    assert "Traceback (most recent call last)" in text and "RuntimeError: a real server error" in text


def test_the_per_batch_receive_stamp_is_dropped_and_other_lines_are_kept(worker_log):
    # TorchServe's worker logs this for every batch it receives; if it stops, the filter is obsolete.
    assert logging_setup.PER_BATCH_STAMP in inspect.getsource(otf_message_handler.retrieve_msg)
    logging_setup.install()
    logging.info("Backend received inference at: %d", 1764600000)
    logging.info("model loaded")
    assert worker_log.getvalue().splitlines() == ["model loaded"]
    assert sum(isinstance(f, logging_setup.DropPerBatchStamp) for f in logging.getLogger().filters) == 1
