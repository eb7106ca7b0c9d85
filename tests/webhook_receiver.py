"""A local incoming webhook on 127.0.0.1, as Slack's or Mattermost's receives alerts: it keeps
every body POSTed to it and answers with the status the test chose."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOOK_PATH = "/hooks/T0001/B0002/not-a-real-token"  # a path like Slack's, token and all


@dataclass
class Receiver:
    url: str
    status: int = 200
    posts: list[tuple[int, bytes]] = field(default_factory=list)  # (status answered, body)

    @property
    def bodies(self) -> list[bytes]:
        """Every body POSTed, answered or refused."""
        return [body for _, body in self.posts]

    def messages(self) -> list[dict[str, Any]]:
        """The bodies it accepted (2xx), decoded."""
        return [json.loads(body) for status, body in self.posts if 200 <= status < 300]


@contextmanager
def webhook_receiver(status: int = 200) -> Iterator[Receiver]:
    """Serve until the block ends; `receiver.status` may change while it serves."""
    receiver = Receiver(url="", status=status)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status = receiver.status
            receiver.posts.append((status, body))
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok" if status < 300 else b"no")

        def log_message(self, *args: object) -> None:
            pass  # quiet: pytest shows what the test asserts

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}{HOOK_PATH}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
