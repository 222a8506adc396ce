"""A loopback server that answers as a half-dead Tinker: its health check and capabilities answer,
every work call answers 500 and is counted. The Tinker engine's tests and its benchmark use it."""

from __future__ import annotations

import http.server
import threading


class HalfDead(http.server.BaseHTTPRequestHandler):
    """Tinker's health check and capabilities answer; every work call answers 500 (and is counted)."""
    work = 0

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.endswith("/api/v1/healthz"):
            return self._answer(200, b'{"status": "ok"}')
        if self.path.endswith("/api/v1/get_server_capabilities"):
            return self._answer(200, b'{"supported_models": [{"model_name": "thinkingmachines/Inkling"}]}')
        type(self).work += 1
        self._answer(500, b'{"detail": "internal error"}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        type(self).work += 1
        self._answer(500, b'{"detail": "internal error"}')

    def log_message(self, *args):
        pass


def serve_half_dead() -> tuple[http.server.ThreadingHTTPServer, str, type[HalfDead]]:
    """Start one on a free loopback port, served from a daemon thread.

    Returns:
        (the server, its URL, its handler class: `work` counts the work calls answered 500).
    """
    handler = type("Handler", (HalfDead,), {"work": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # a short poll interval: shutdown() waits for the serving loop's next poll
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", handler
