"""Run the local reference service: in a background thread on a free loopback port (tests,
notebooks, ``--local``), or in the foreground (``batchsum serve``)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

import uvicorn

from .app import create_app
from .state import Account, Faults, Plan, ServiceState, new_key

__all__ = ["LocalService"]


class LocalService:
    """The local service in a thread. ``with LocalService(rpm=60) as service: service.url, service.key``.

    ``keys``: ``["KEY", "KEY:basic", "KEY:expired"]`` or ``{key: Plan}``; one premium key is generated
    when none is given. ``rpm``: per-key limit over a sliding ``window`` of 60 seconds (0 = none;
    tests shrink the window to see several of them in seconds). ``faults``: see ``Faults``.
    ``test_controls``: serve ``/_local/*`` (stats, faults, reset), behind ``state.admin_key``.
    ``limit_kind``: how the limit counts: ``"sliding"`` (any ``window`` seconds), ``"fixed"``
    (windows of ``window`` seconds, the first opening at the key's first request), ``"bucket"`` (a
    token bucket of ``rpm`` that starts full), ``"clock"`` (windows of ``window`` seconds aligned to
    the service's clock), ``"clock-10s"`` / ``"clock-1s"`` (the window's share of ``rpm`` in each
    clock-aligned 10 s / 1 s window: the strictest judges of an even pace). ``room_headers``: state the room left in every answer,
    ``"ratelimit"`` (``RateLimit-Limit/-Remaining/-Reset``) or ``"x-ratelimit"`` (``X-RateLimit-*``);
    None (the default, as the live service): no such headers. ``accounts``: keys with limits of their
    own (``Account``: a per-minute limit, a plan expiring after N requests, a quota stated or not).
    """

    def __init__(
        self,
        keys: Iterable[str] | dict[str, Plan] | None = None,
        *,
        rpm: int = 0,
        faults: Faults | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        window: float = 60.0,
        test_controls: bool = True,
        limit_kind: str = "sliding",
        room_headers: str | None = None,
        accounts: dict[str, Account] | None = None,
    ) -> None:
        admin_key = new_key() if test_controls else None
        self.state = ServiceState(
            keys,
            rpm=rpm,
            faults=faults,
            window=window,
            admin_key=admin_key,
            limit_kind=limit_kind,
            room_headers=room_headers,
            accounts=accounts,
        )
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def key(self) -> str:
        return self.state.key

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def faults(self) -> Faults:
        return self.state.faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        self.state.faults = faults

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def start(self, timeout: float = 10.0) -> LocalService:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            create_app(self.state),
            log_level="critical",
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="batchsum-local", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the local service did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None

    def __enter__(self) -> LocalService:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalService(url={self.url!r}, rpm={self.state.rpm})"
