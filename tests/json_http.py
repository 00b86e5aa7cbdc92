"""JSON over HTTP for the tests: a request handler for their fake servers that logs nothing,
reads a request's JSON body and answers JSON; and a client's POST of JSON over TLS."""

from __future__ import annotations

import http.client
import json
import ssl
from http.server import BaseHTTPRequestHandler
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """A handler base: :meth:`read_json` and :meth:`reply_json`; no access log on stderr."""

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def read_json(self) -> Any:
        """The request's JSON body ({} when it has none)."""
        return json.loads(self.read_body() or b"{}")

    def reply_json(self, code: int, body: Any) -> None:
        """Answer ``code`` with ``body`` as JSON."""
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def post_json(
    port: int, ca_pem: str, path: str, token: str, body: Any, timeout: float
) -> tuple[int, bytes]:
    """POST ``body`` as JSON to ``https://127.0.0.1:port/path`` with ``token`` as its bearer
    token, verifying the server's certificate with ``ca_pem`` (ssl.SSLError if it is not the
    CA's); the answer's status and body."""
    context = ssl.create_default_context(cadata=ca_pem)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        conn.request("POST", path, json.dumps(body), headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
