"""A no-model decoder under TorchServe's asyncCommunication: each request is a coroutine that sends its pieces as
intermediate responses as it makes them, with nothing between it and the frontend but the socket.

Request: {"tokens": n, "stream": bool, "sleep_ms": per-token time}; {"stats": true} answers what it saw. TorchServe
never tells this worker that a client left: a disconnected stream runs to its end."""

import asyncio
import json

from ts.handler_utils.utils import send_intermediate_predict_response

RUNNING = {}  # request id -> tokens made so far


async def handle(data, context):
    if data is None:
        return None
    body = data[0].get("body") or data[0].get("data")
    body = json.loads(body) if isinstance(body, (bytes, bytearray)) else body
    if body.get("stats"):
        return [json.dumps({"cancelled": [], "running": dict(RUNNING)})]
    request_id = context.get_request_id(0)
    tokens, sleep_s = int(body["tokens"]), float(body.get("sleep_ms", 0)) / 1000
    for made in range(1, tokens):
        RUNNING[request_id] = made
        if body.get("stream"):
            send_intermediate_predict_response([f"t{made} "], context.request_ids, "piece", 200, context)
        await asyncio.sleep(sleep_s)
    RUNNING.pop(request_id, None)
    return [f"t{tokens} "]
