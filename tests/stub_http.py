"""A stand-in HTTP server for unit tests of clients (modelctl, the readiness probe, the load tools' token handling):
it answers every request with what `answer(method, path, headers) -> (status, JSON-able body)` returns."""

import contextlib
import http.server
import json
import threading


@contextlib.contextmanager
def stub_http_server(answer):
    """Yield the base URL of a local server that answers with `answer`; shut down afterwards."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def respond(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body = answer(self.command, self.path.split("?")[0], self.headers)
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = respond

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
