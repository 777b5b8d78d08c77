"""A TorchServe handler for the stall tests (tests/integration/test_model_stall.py): it answers every request with
{"ok": true, "pid": <worker pid>}, except one whose JSON body is {"stall": true}: then the worker blocks for good and
answers nothing more, as a wedged worker does. No model, no torch: it loads in a moment."""

import json
import os
import threading

NEVER = threading.Event()


def handle(data, context):
    if data is None:  # TorchServe's load-time call
        return None
    answers = []
    for row in data:
        body = row.get("body") or row.get("data") or b"{}"
        request = json.loads(body) if isinstance(body, (bytes, bytearray, str)) else body
        if isinstance(request, dict) and request.get("stall") is True:
            print(f"stall: worker {os.getpid()} blocks for good", flush=True)  # model_log.log: the tests wait for it
            NEVER.wait()
        answers.append(json.dumps({"ok": True, "pid": os.getpid()}))
    return answers
