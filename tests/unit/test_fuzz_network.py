"""The fuzzer's network campaign on the wire (scripts/reliability/fuzz.py network_campaign, post_tensor_case): a case's
bytes and headers arrive exactly as curl --data-binary sends them, and a campaign against a local HTTP endpoint that
answers with the network codec and engine passes, while one that accepts everything fails with the right classes."""

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from handlers.core.errors import RequestError
from handlers.network import oip
from handlers.network.binary import HEADER
from handlers.network.engine import NetworkEngine
from scripts.reliability import fuzz
from scripts.reliability.tensor_grammar import TensorGrammar
from tests.unit.network_programs import program_of, signature_of


def endpoint(answer):
    """A local HTTP server whose POST answers ``answer(body, headers) -> (status, headers, body)``; records what it
    received (the request line, headers and raw body)."""
    received = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append((self.path, dict(self.headers), body))
            status, headers, payload = answer(body, self.headers)
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/predictions/net", received


@pytest.fixture
def engine():
    return NetworkEngine(program_of("ranker"), signature_of("ranker"), {"max_rows_per_request": 32})


def test_a_binary_case_arrives_byte_for_byte_with_its_headers(engine):
    server, url, received = endpoint(lambda body, headers: (413, {HEADER: "7"}, b'{"error": "too big"}'))
    try:
        case = TensorGrammar(engine.signature, seed=0).good_oip_binary(random.Random(1))
        assert HEADER in case.headers and b"\0" in case.body  # raw tensor bytes after the JSON head
        status, headers, body = fuzz.post_tensor_case(requests.Session(), url, case, {"Authorization": "Bearer t"})
    finally:
        server.shutdown()
    [(path, sent, raw)] = received
    assert path == "/predictions/net" and raw == case.body
    assert sent[HEADER] == case.headers[HEADER] and sent["Content-Type"] == "application/octet-stream"
    assert sent["Content-Length"] == str(len(case.body)) and "Transfer-Encoding" not in sent
    assert sent["Authorization"] == "Bearer t"
    assert (status, headers[HEADER], json.loads(body)) == (413, "7", {"error": "too big"})


def test_no_answer_is_status_0():
    case = TensorGrammar(signature_of("mlp"), seed=0).good_oip_json(random.Random(0))
    status, _, why = fuzz.post_tensor_case(requests.Session(), "http://127.0.0.1:9/x", case, timeout=5)
    assert status == 0 and b"ConnectionError" in why


def served(engine):
    """What a server built from the network codec and engine answers (one request at a time)."""

    def answer(body, headers):
        try:
            request = oip.parse_request(body, headers.get(HEADER), engine.signature)
            [result] = engine.infer([request.inputs])
            if isinstance(result, RequestError):
                raise result
            payload, answer_headers = oip.encode_answer(request, result, engine.signature)
            return 200, answer_headers, payload
        except RequestError as error:
            status, payload = oip.error_answer(error)
            return status, {}, payload

    return answer


def test_a_campaign_against_the_codec_and_engine_passes_and_one_that_accepts_everything_fails(engine):
    server, url, _ = endpoint(served(NetworkEngine(engine.program, engine.signature, {"max_rows_per_request": 32})))
    try:
        row = fuzz.network_campaign(
            url, engine.program, engine.signature, {"max_rows_per_request": 32}, 120, clients=4, log=lambda *_: None
        )
    finally:
        server.shutdown()
    assert row.passed, row.figure
    assert row.details["statuses"].keys() >= {"200", "400", "413"}
    lying, url, _ = endpoint(lambda body, headers: (200, {}, b'{"outputs": {}}'))
    try:
        row = fuzz.network_campaign(
            url, engine.program, engine.signature, {"max_rows_per_request": 32}, 60, clients=4, log=lambda *_: None
        )
    finally:
        lying.shutdown()
    assert not row.passed
    assert row.details["counts"]["wrong_refusal"] and row.details["counts"]["wrong_answer"], row.details["counts"]
