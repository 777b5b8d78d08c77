"""Before a load test sends traffic: the inference token to send, and one checked request, so a missing model or a
missing token fails in seconds with the server's own answer instead of as a run full of failures."""

import json
import time

import requests

from loadtests.payloads import answer_of, request_headers, request_parts, traffic
from scripts.ops import auth


def resolve_token(args, log=print):
    """The inference token for this run from --token / --key-file (scripts/ops/auth.py), as a KeySource (a key file's
    is re-read after rotations); says where it came from."""
    keys = auth.KeySource.for_inference(args.token, args.key_file)
    log(f"inference token: {keys.source}")
    return keys


def wait_for_prediction(url, body, check, timeout=300, headers=None, answer=None):
    """Poll until one request answers correctly (a freshly started baseline may still be loading); raise otherwise,
    at once when the server refuses the token (waiting would not change that). ``answer(content, headers)`` reads
    the response for ``check`` (default: as JSON)."""
    answer = answer or (lambda content, _: json.loads(content))
    deadline = time.time() + timeout
    last = "no answer"
    while time.time() < deadline:
        try:
            sent, content_type = request_parts(body)
            sent_headers = {**(headers or {}), "Content-Type": content_type, **request_headers(body)}
            response = requests.post(url, timeout=30, headers=sent_headers, **sent)
            if auth.refused(response.status_code, response.text):
                raise RuntimeError(
                    f"{url} refused the request ({response.status_code}: {response.text[:200]}); {auth.REFUSED_HINT}"
                )
            if response.status_code == 200:
                reason = check(answer(response.content, response.headers))
                if reason is None:
                    return
                last = f"wrong answer: {reason}"
            else:
                last = f"HTTP {response.status_code}: {response.text[:200]}"
        except (requests.RequestException, ValueError) as error:
            last = f"{type(error).__name__}: {error}"
        time.sleep(1)
    raise RuntimeError(f"{url} did not answer correctly within {timeout}s ({last})")


def wait_for_model(inference_url, model, timeout=30, token=None):
    """One request of the model's own traffic answered correctly at `inference_url`, within `timeout` seconds
    (`token`: a token or a KeySource)."""
    model_traffic = traffic(model)
    wait_for_prediction(
        f"{inference_url.rstrip('/')}{model_traffic.path}",
        model_traffic.payloads(0, 0).next(),
        model_traffic.check,
        timeout=timeout,
        answer=lambda content, headers: answer_of(model_traffic, content, headers),
        headers=auth.KeySource.of(token).headers(),
    )
