"""A no-model decoder under TorchServe's continuousBatching: each call is one step of every running request.

Request: {"tokens": n, "stream": bool, "sleep_ms": per-step time}; {"stats": true} answers what it saw. A running
request comes back without its body (TorchServe marks it cached); one that no longer comes back was dropped by the
frontend (its client left). A streamed request gets one piece per step; a plain one is left out of the answer until
its last step."""

import json
import time

RUNNING = {}  # request id -> {"left", "made", "stream"}
CANCELLED = []  # tokens made by requests that stopped coming back


def handle(data, context):
    if data is None:
        return None
    context.stopping_criteria = None
    ids = [context.get_request_id(idx) for idx in range(len(data))]
    for request_id in [r for r in RUNNING if r not in ids]:
        CANCELLED.append(RUNNING.pop(request_id)["made"])
    answers, last = [""] * len(data), {}
    for idx, request_id in enumerate(ids):
        if request_id not in RUNNING:
            body = data[idx].get("body") or data[idx].get("data")
            body = json.loads(body) if isinstance(body, (bytes, bytearray)) else body
            if body.get("stats"):
                running = {r: state["made"] for r, state in RUNNING.items()}
                answers[idx], last[idx] = json.dumps({"cancelled": CANCELLED, "running": running}), None
                continue
            RUNNING[request_id] = {"left": int(body["tokens"]), "made": 0, "stream": bool(body.get("stream"))}
            RUNNING[request_id]["sleep_s"] = float(body.get("sleep_ms", 0)) / 1000
        answers[idx], last_piece = step(request_id)
        if last_piece is not False or RUNNING.get(request_id, {}).get("stream"):
            last[idx] = last_piece
    time.sleep(max((state["sleep_s"] for state in RUNNING.values()), default=0.0))
    context.stopping_criteria = {idx: (lambda _answer, value=value: value) for idx, value in last.items()}
    for idx in range(len(data)):
        if idx not in last:
            del context.request_ids[idx]  # a plain request still running: not part of this answer
    return answers


def step(request_id):
    """One token of a request: (its answer now, ts_stream_next's stopping value: False more to come, True the end
    of a stream, None a whole answer)."""
    state = RUNNING[request_id]
    state["left"] -= 1
    state["made"] += 1
    if state["left"] > 0:
        return (f"t{state['made']} " if state["stream"] else ""), False
    del RUNNING[request_id]
    return f"t{state['made']} ", (True if state["stream"] and state["made"] > 1 else None)
