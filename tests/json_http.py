"""The tests' fake HTTP servers that speak JSON: a request handler that logs nothing, reads a
request's JSON body and answers JSON."""

from __future__ import annotations

import json
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
