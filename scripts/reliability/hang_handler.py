"""TEST-ONLY handler for the reliability suite's hang check; never packaged by `make mar`.

It is the classifier, except that a request whose first value equals HANG_MARKER sleeps far past responseTimeout,
as a stuck kernel or a deadlock would. TorchServe must then fail that batch, replace the worker, and keep serving.
"""

import time

from handlers.classifier import ClassifierHandler

HANG_MARKER = 12345.0


class HangOnMarkerClassifierHandler(ClassifierHandler):
    def parse_request(self, body, request):
        payload = super().parse_request(body, request)
        if float(payload.rows[0, 0]) == HANG_MARKER:
            time.sleep(3600)
        return payload
