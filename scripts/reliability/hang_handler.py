"""TEST-ONLY handler for the reliability suite's hang check; never packaged by `make mar`.

It is the classifier (the network handler with the classifier folder's hooks), except that a request whose first
value equals HANG_MARKER sleeps far past responseTimeout, as a stuck kernel or a deadlock would. TorchServe must then
fail that batch, replace the worker, and keep serving.
"""

import time

from handlers.network_model import NetworkModelHandler

HANG_MARKER = 12345.0


class HangOnMarkerClassifierHandler(NetworkModelHandler):
    def parse_request(self, body, request):
        payload = super().parse_request(body, request)
        hook_request = getattr(payload, "hook_request", None)
        if hook_request is not None:  # the classifier's native form, already checked by its preprocess hook
            inputs = hook_request.json()["inputs"]
            first = inputs[0][0] if isinstance(inputs[0], list) else inputs[0]
            if float(first) == HANG_MARKER:
                time.sleep(3600)
        return payload
