"""Run the local reference service: in a background thread on a free loopback port (tests,
notebooks, ``--local``), or in the foreground (``batchsum serve``). How any ASGI app of batchsum is
served is here once (``listen``, ``ThreadServer``, ``serve``): ``batchsum gateway`` is served the same way."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

import uvicorn

from .app import create_app
from .state import Account, Faults, Plan, ServiceState, new_key

__all__ = ["LocalService", "ThreadServer", "listen", "serve", "address"]


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
        self._server: ThreadServer | None = None

    @property
    def key(self) -> str:
        return self.state.key

    @property
    def url(self) -> str:
        return address(self.host, self.port)

    @property
    def faults(self) -> Faults:
        return self.state.faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        self.state.faults = faults

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def start(self, timeout: float = 10.0) -> LocalService:
        self._server = ThreadServer(create_app(self.state), self.host, self.port, name="batchsum-local")
        self._server.start(timeout)
        self.port = self._server.port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> LocalService:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalService(url={self.url!r}, rpm={self.state.rpm})"


def address(host: str, port: int) -> str:
    """``http://HOST:PORT`` (an IPv6 host in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host`` and ``port`` (0: any free port; ``getsockname`` says which),
    before the server starts, so its address is known and can be said at once. ``OSError`` when it
    cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so (its accepted ones are
    # this one's kind); without it every answer's body waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # connections wait in the backlog until the server takes them: none is refused
    except OSError:
        sock.close()
        raise
    return sock


Lifespan = Literal["on", "off"]


def _config(app: Any, lifespan: Lifespan, log_level: str, graceful: float = 1.0) -> uvicorn.Config:
    return uvicorn.Config(app, log_level=log_level, lifespan=lifespan, timeout_graceful_shutdown=math.ceil(graceful))


def serve(
    app: Any,
    sock: socket.socket,
    *,
    lifespan: Lifespan = "off",
    log_level: str = "warning",
    on_signal: Callable[[], None] | None = None,
    graceful: float = 1.0,
) -> None:
    """Serve ``app`` on ``sock`` in the foreground until a signal (SIGINT, SIGTERM) ends it.
    ``on_signal``: told first, on the main thread, when the signal comes (the app answers what
    waits before the server stops); ``graceful``: seconds the requests under way then get to end."""
    server = uvicorn.Server(_config(app, lifespan, log_level, graceful))
    if on_signal is not None:
        handle_exit = server.handle_exit

        def told_first(sig: int, frame: Any) -> None:
            on_signal()
            handle_exit(sig, frame)

        server.handle_exit = told_first  # type: ignore[method-assign]  # uvicorn's signal handler while it serves
    server.run(sockets=[sock])


class ThreadServer:
    """An ASGI app served by uvicorn on a thread of its own, on a free loopback port by default:
    ``start()`` returns once it answers, ``stop()`` ends it (its lifespan's shutdown run, with
    ``lifespan="on"``)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "batchsum-server",
        lifespan: Lifespan = "off",
    ) -> None:
        self.app, self.host, self.port, self.name, self.lifespan = app, host, port, name, lifespan
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return address(self.host, self.port)

    def start(self, timeout: float = 10.0) -> ThreadServer:
        sock = listen(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(_config(self.app, self.lifespan, "critical"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=timeout)
            self._server = self._thread = None
