"""Run a sandbox on 127.0.0.1: in a background thread (tests, demo) or in the foreground (CLI)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any, Self

import uvicorn

from connectors.sandbox.app import API_PREFIX, AUTH_PREFIX, Sandbox
from connectors.sandbox.config import Customer, SandboxConfig
from connectors.sandbox.control import SandboxControl
from connectors.sandbox.store import Store

HOST = "127.0.0.1"


class SandboxServer:
    """A sandbox served by uvicorn on a free loopback port; use it as a context manager."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        port: int = 0,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        self.config = config or SandboxConfig()
        self.sandbox = Sandbox(self.config)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Connections accepted from it inherit this: without it a small answer written as
        # headers, then body, waits ~40 ms for the client's delayed ACK (Nagle's algorithm).
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket.bind((HOST, port))
        # Listening from here on: a client that reads the printed settings and connects at
        # once waits in the backlog until the server runs, instead of being refused.
        self._socket.listen(2048)
        self.port: int = self._socket.getsockname()[1]
        self.scheme = "https" if ssl_certfile else "http"
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.sandbox.app,
                log_level="warning",
                access_log=False,  # paths can hold document ids: never log them
                ssl_certfile=ssl_certfile,
                ssl_keyfile=ssl_keyfile,
                timeout_keep_alive=30,
                lifespan="off",
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def store(self) -> Store:
        return self.sandbox.store

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{HOST}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.origin + API_PREFIX

    @property
    def auth_url(self) -> str:
        return self.origin + AUTH_PREFIX

    def env(self, customer: str | None = None) -> dict[str, str]:
        """The CLINICAL_* settings a client of `customer` (default: the first) needs."""
        c = self._customer(customer)
        rate = self.config.rate if c.rate is None else c.rate
        env = {
            "CLINICAL_API_BASE_URL": self.base_url,
            "CLINICAL_AUTH_URL": self.auth_url,
            "CLINICAL_CLIENT_ID": c.client_id,
            "CLINICAL_CLIENT_SECRET": c.client_secret,
            "CLINICAL_API_KEY": c.api_key,
            "CLINICAL_CUSTOMER": c.name,
        }
        if rate is not None:
            env["CLINICAL_RATE_LIMIT"] = f"{rate:g}"
            env["CLINICAL_BURST"] = str(self.config.burst if c.burst is None else c.burst)
        return env

    @property
    def customers(self) -> list[Customer]:
        return self.sandbox.tokens.customers

    def _customer(self, name: str | None) -> Customer:
        if name is None:
            return self.sandbox.default
        found = [c for c in self.customers if c.name == name]
        if not found:
            raise KeyError(f"no sandbox customer {name!r}")
        return found[0]

    def store_of(self, customer: str) -> Store:
        """A customer's data (`store` is the default customer's)."""
        return self.sandbox.stores[self._customer(customer).name]

    def control(self, customer: str | None = None) -> SandboxControl:
        """The test controls over HTTP; data controls act on `customer`'s store."""
        return SandboxControl(self.origin, self._customer(customer).api_key)

    def configure(self, **changes: Any) -> None:
        """Change faults or limits while serving (see SandboxConfig.RUNTIME)."""
        self.sandbox.configure(**changes)

    def stats(self) -> dict[str, int]:
        return self.sandbox.stats()

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._socket])),
            name=f"sandbox-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"sandbox on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            self._socket.close()

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (the CLI's `sandbox` command)."""
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(self._server.serve(sockets=[self._socket]))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
