"""``batchsum gateway``: one pace for every client of a key, in any language. An HTTP server of the
service's interface (the local service's routes, request parsing, error bodies and server:
``local.app``, ``local.server``) in front of the service: each request takes a turn on its key's
budget as a run's request does (``run.served``), goes upstream through batchsum's client, and its
answer goes back as it came. A request waits for its turn up to its deadline (``--max-queue-wait``,
shortened by the ``Batchsum-Max-Wait`` header); past it, a 429 whose ``Retry-After`` says when its turn
would come (a spent quota: its reset; the key's budget out of reach: a 503). Its requests are live:
they take the key's next turn ahead of the batch runs' reserved starts, up to ``--interactive-share``
of the key's starts (every gateway on the key together); beyond it they wait their turn beside them.

Keys: each client's own ``Authorization`` by default (a run per key, opened on first use, closed when
idle); with ``--hold-key`` the gateway's own key (or keys), for clients holding one of its tokens
(``--token-file``), which off loopback it needs in either mode.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import math
import os
import secrets
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..data.results import OK
from ..run.options_table import OPTION_NAMES
from ..run.spec import RunSpec
from ..service import contract
from ..service.contract import Messages
from ..service.errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    BatchsumError,
    BudgetError,
    ConfigurationError,
    RateLimitError,
    redact_location,
)
from ..service.key_plans import KeyPlan, read_key_file
from ..service.settings import Secret, check_key, check_path, is_loopback, key_hash
from .console import EXIT_OK, EXIT_USAGE, Stop

if TYPE_CHECKING:  # the command line imports this module for every command: the web stack when it runs
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from ..run.served import Served

__all__ = [
    "Gateway",
    "GatewayOptions",
    "create_app",
    "gateway_command",
    "read_tokens",
    "DEFAULT_PORT",
    "DEFAULT_MAX_QUEUE_WAIT",
    "DEFAULT_INTERACTIVE_SHARE",
    "MAX_WAIT_HEADER",
    "TOKEN_HEADER",
    "GATEWAY_OPTIONS",
    "add_gateway",
]

DEFAULT_PORT = 8040  # not serve's 8000 (the local service often runs beside it), nor 8080 (many proxies')
DEFAULT_MAX_QUEUE_WAIT = 30.0  # seconds a request waits for its turn: within an HTTP client's usual patience
# The part of the key's starts live requests may take ahead of the batch runs': a web service's live
# calls are a small part of a key's use; beyond it, a storm of them waits its turn beside the runs'.
DEFAULT_INTERACTIVE_SHARE = 0.25
MAX_WAIT_HEADER = "Batchsum-Max-Wait"  # seconds: a request's own, shorter, patience for its turn
TOKEN_HEADER = "Batchsum-Gateway-Token"  # the gateway's token beside a client's own key (keys passed through)
# The run options that fit a stream of requests (their flags made from ``OPTIONS``, as every door's).
GATEWAY_OPTIONS = ("rpm", "share", "keys", "quota", "budget", "budget_wait", "store", "store_scope", "report")
_HELD = ""  # the key of the held keys' run


@dataclass(frozen=True)
class GatewayOptions:
    """How a gateway serves. ``spec``: the run options every key's run opens with (a ``RunSpec``;
    its key or keys, with ``hold_key``); ``plans``: with keys passed through, a key file's lines by
    key hash (a listed key paces at its line's rate and quota); ``tokens``: the gateway's own (needed
    off loopback); ``report``: the gateway's run report, every key's run merged into it;
    ``interactive_share``: the part of the key's starts its requests may take ahead of the batch runs'
    (0 to 1; 0: none, they wait their turn beside them)."""

    spec: RunSpec
    hold_key: bool = False
    tokens: tuple[Secret, ...] = ()
    max_queue_wait: float = DEFAULT_MAX_QUEUE_WAIT
    plans: Mapping[str, KeyPlan] = field(default_factory=dict)
    idle_seconds: float | None = None  # None: run.served's IDLE_SECONDS
    report: str | None = None
    interactive_share: float = DEFAULT_INTERACTIVE_SHARE


def read_tokens(path: str | os.PathLike[str]) -> tuple[Secret, ...]:
    """The gateway's tokens, one a line (blank lines and ``#`` comments skipped), from a file its owner
    alone may read, as a key file; ``ConfigurationError`` in one line that never echoes a token."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            raw = file.read(1 << 16)
    except OSError as exc:
        raise ConfigurationError(f"cannot read the token file {shown}: {exc.strerror or exc}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise ConfigurationError(f"the token file {shown} may be read by others: make it yours alone (chmod 600)")
    lines = raw.decode("utf-8", errors="replace").splitlines()
    tokens = tuple(
        Secret(check_key(line, f"{shown} line {n}")) for n, line in enumerate(lines, 1) if line.strip()[:1] not in "#"
    )
    if not tokens or any(len(token.reveal()) < 16 for token in tokens):
        raise ConfigurationError(f"the token file {shown} needs one token of at least 16 characters a line")
    return tokens


class Gateway:
    """The gateway on the server's event loop: who may ask and on which key, each request's patience,
    and the runs by key (``run.served.KeyRuns``); ``summarize`` is the interface's route."""

    def __init__(self, options: GatewayOptions) -> None:
        from ..run.served import IDLE_SECONDS, KeyRuns

        self.options = options
        self.run_id = options.spec.run_id or os.urandom(8).hex()
        self.runs = KeyRuns(
            self._spec_for,
            idle_seconds=options.idle_seconds or IDLE_SECONDS,
            report=options.report,
            kept=_HELD if options.hold_key else None,
            live=options.interactive_share,
        )

    def _key_of(self, request: Request) -> str | None:
        """The key a request goes on (``_HELD``: the gateway's own), or None: refused (401)."""
        options, headers = self.options, request.headers
        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        bearer = bearer.strip() if scheme.lower() == "bearer" else ""
        if options.tokens:
            token = (bearer if options.hold_key else headers.get(TOKEN_HEADER, "").strip()).encode()
            if not any(secrets.compare_digest(token, mine.reveal().encode()) for mine in options.tokens):
                return None
        if options.hold_key:
            return _HELD
        try:
            return check_key(bearer, "Authorization")
        except ConfigurationError:
            return None

    def _spec_for(self, key: str) -> RunSpec:
        """The run options of a key's run: the gateway's, its door and run id, the request's patience
        as ``max_wait``; a client's key with its key file line's rate and quota, if listed."""
        base = self.options.spec
        changes: dict[str, Any] = {"run_id": self.run_id, "door": "gateway", "progress": False, "report": None}
        changes["max_wait"] = self.options.max_queue_wait
        if key:
            plan = self.options.plans.get(key_hash(key)) or KeyPlan(Secret(key), "Authorization")
            changes["client"] = dataclasses.replace(base.client, api_key=plan.key)
            changes["keys"] = (plan,)
        return base.replace(**changes)

    async def summarize(self, request: Request) -> Response:
        """``POST /api/user/summarize``: the request's key, its fields, its patience, then its turn."""
        from ..local.app import read_request, shape_b, word_limits

        arrived = time.monotonic()
        key = self._key_of(request)
        if key is None:
            return shape_b(401, Messages.INVALID_KEY)
        valid = await read_request(request)
        if not isinstance(valid, tuple):
            return valid
        text, params = valid
        refused = word_limits(text) or _unsendable(text)
        if refused is not None:
            return refused
        patience = _patience(request, self.options.max_queue_wait)
        if not isinstance(patience, float):
            return patience
        deadline = _loop_time() + patience
        try:
            run = await self.runs.get(key)
        except BatchsumError as exc:  # its budget out of reach (a Redis down) or unusable: nothing sent
            from ..run.served import Served

            what = "the key's rate budget cannot be reached" if isinstance(exc, BudgetError) else str(exc)
            return _response(Served(status=503, retry_after=2.0, why=f"{what}; nothing was sent"))
        return _response(await run.answer(text, params, arrived, deadline))


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def _response(served: Served) -> Response:
    """What a request gets, as HTTP: the service's answer as it came (status and body, the key taken
    out), or the gateway's own 429 or 503 with ``Retry-After``."""
    from starlette.responses import JSONResponse, Response

    from ..local.app import shape_a

    answer, error = served.answer, served.error
    if served.status is not None:
        reason = "Service Unavailable" if served.status == 503 else Messages.RATE_LIMITED
        return shape_a(served.status, f"{reason}: {served.why}", _retry_after(served.retry_after))
    if answer is not None and answer.status == OK:
        return JSONResponse({contract.FIELD_RESULT: answer.summary})
    if isinstance(error, APIStatusError):
        headers = {}
        if isinstance(error, RateLimitError) and error.retry_after is not None:
            headers = _retry_after(error.retry_after)
        if isinstance(error.body, (dict, list)):
            return JSONResponse(error.body, status_code=error.status_code, headers=headers)
        text = error.body if isinstance(error.body, str) else ""
        kind = "text/html" if text.lstrip().startswith("<") else "text/plain"
        return Response(text, status_code=error.status_code, headers=headers, media_type=kind)
    if isinstance(error, APITimeoutError):
        return shape_a(504, f"Gateway Timeout: {error.message}")
    if isinstance(error, APIConnectionError):
        return shape_a(502, f"Bad Gateway: {error.message}")
    if answer is not None and answer.http_status is not None:  # a refusal the run knew: its status, its words
        return shape_a(answer.http_status, answer.message or "")
    return shape_a(502, f"Bad Gateway: {answer.message if answer is not None else ''}")


def _unsendable(text: str) -> Response | None:
    """FastAPI's 422 for a text no request can carry (a lone surrogate): never sent."""
    from ..local.app import validation_error

    problem = contract.text_problem(text)
    if problem is not None and problem[0] is contract.SkipReason.INVALID:
        return validation_error((["body", "text"], problem[1], "string_unicode"))
    return None


def _patience(request: Request, most: float) -> float | Response:
    """Seconds the request waits for its turn: ``Batchsum-Max-Wait`` (at most ``most``), else
    ``most``; a header that is not a number of seconds is a 422."""
    from ..local.app import validation_error

    raw = request.headers.get(MAX_WAIT_HEADER)
    if raw is None:
        return float(most)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < math.inf:
        where = ["header", MAX_WAIT_HEADER.lower()]
        return validation_error((where, "Input should be a number of seconds >= 0", "float_parsing"))
    return min(seconds, float(most))


def _document() -> dict[str, Any]:
    """The interface's OpenAPI document, with what the gateway adds: its headers, its 429s and 503."""
    from ..local.openapi import openapi_document

    document = copy.deepcopy(openapi_document())
    document["info"]["title"] = "Text summarization service, through batchsum gateway"
    operation = document["paths"][contract.SUMMARIZE_PATH]["post"]
    operation["parameters"] = [
        {
            "name": MAX_WAIT_HEADER,
            "in": "header",
            "required": False,
            "schema": {"type": "number", "minimum": 0},
            "description": "Seconds this request may wait for its turn on the key (at most the gateway's --max-queue-wait).",
        },
        {
            "name": TOKEN_HEADER,
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "The gateway's token, beside the client's own key in Authorization, when the gateway asks for one.",
        },
    ]
    answers = operation["responses"]
    answers["429"]["description"] += (
        " From the gateway: the request's turn (or a spent quota's reset) is past its wait; Retry-After says when."
    )
    answers["503"] = {
        "description": "The key's rate budget cannot be reached: nothing was sent; Retry-After says when to ask again.",
        "headers": answers["429"]["headers"],
        "content": answers["500"]["content"],
    }
    return document


def create_app(gateway: Gateway, metrics: Any = None) -> Starlette:
    """The gateway as an ASGI app: the interface's routes (the local service's), its lifespan opening
    and closing the gateway's runs on the server's loop; ``metrics`` (``run.key_metrics.KeyMetrics``)
    shown the gateway's budget as ``top`` reads it, every second."""
    from starlette.applications import Starlette

    from ..local.app import service_routes

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gateway.runs.start()
        watching = asyncio.ensure_future(_show(gateway, metrics)) if metrics is not None else None
        try:
            yield
        finally:
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
            await gateway.runs.close()

    return Starlette(routes=service_routes(gateway.summarize, "batchsum gateway", _document()), lifespan=lifespan)


async def _show(gateway: Gateway, metrics: Any) -> None:
    """``--metrics-port``: the gateway's budget as ``batchsum top`` reads it, shown to the metrics every
    ``top`` refresh (the keys it serves, every run on them, the gateway's queue and waits among them)."""
    from ..run.budget_keys import Watcher
    from .top import REFRESH_SECONDS

    watcher = Watcher(gateway.options.spec.budget, service=gateway.options.spec.client.base_url)
    while True:
        try:
            metrics.show(await watcher.read())
        except BudgetError:  # out of reach now: the figures stay the last ones read
            pass
        await asyncio.sleep(REFRESH_SECONDS)


# -- the command ----------------------------------------------------------------------------------


def add_gateway(commands: Any, add_options: Callable[[Any, Sequence[str]], None], number: Callable[..., Any]) -> None:
    """``batchsum gateway``'s flags, on the command line's parser (``commands``): its own, and the run
    options that fit a stream of requests, made by ``add_options`` from ``OPTIONS`` as every door's;
    ``number`` types a number flag."""
    gateway = commands.add_parser(
        "gateway",
        help="serve the service's interface to any HTTP client, each request paced on its key's budget as a run's",
        description="Serve the summarization interface (POST /api/user/summarize, JSON or form fields, the "
        "same error bodies, /openapi.json) in front of the service, so that any HTTP client of a key (a web "
        "service, an R script, curl) shares batchsum's pace: each request takes a turn on the key's budget "
        "with every batchsum run on it, waits for it up to its deadline (a 429 with Retry-After past it), "
        "goes upstream through batchsum's client (retries included), and gets the service's answer as it "
        "came; a text answered before is answered by the answer store. The first line on stdout is the "
        "address it serves. docs/gateway.md says how to run it beside a web service or behind a load balancer.",
    )
    gateway.add_argument(
        "--upstream",
        default=None,
        metavar="URL",
        help=f"the service (default $BATCHSUM_BASE_URL, else {contract.DEFAULT_BASE_URL}), checked as --base-url is",
    )
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    gateway.add_argument(
        "--port",
        type=number(0, whole=True),
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0 = any free port, said on the first line)",
    )
    gateway.add_argument(
        "--max-queue-wait",
        type=number(0),
        default=DEFAULT_MAX_QUEUE_WAIT,
        metavar="SECONDS",
        help=f"how long a request waits for its turn on the key before a 429 with Retry-After (default "
        f"{DEFAULT_MAX_QUEUE_WAIT:g}); a request's {MAX_WAIT_HEADER} header shortens it",
    )
    gateway.add_argument(
        "--hold-key",
        action="store_true",
        help="send on the gateway's own key ($BATCHSUM_API_KEY, or --keys FILE) rather than each client's "
        "Authorization; clients then authenticate with a token of --token-file",
    )
    gateway.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="the gateway's tokens, one a line (the file its owner's alone): with --hold-key a client sends "
        f"'Authorization: Bearer TOKEN'; else its own key there and the token in {TOKEN_HEADER}. Needed off loopback",
    )
    gateway.add_argument(
        "--interactive-share",
        type=number(0, most=1),
        default=DEFAULT_INTERACTIVE_SHARE,
        metavar="FRACTION",
        help=f"the part of the key's starts the gateway's requests may take ahead of the batch runs' reserved ones "
        f"(default {DEFAULT_INTERACTIVE_SHARE:g}; every gateway on the key shares it); beyond it they wait their "
        "turn beside the runs'. 0: none. --share caps everything the gateway sends",
    )
    add_options(gateway, GATEWAY_OPTIONS)
    gateway.add_argument(
        "--metrics-port",
        type=number(0, whole=True),
        default=None,
        metavar="PORT",
        help="also serve the budget's figures as Prometheus metrics, as top does (extra 'prometheus')",
    )
    gateway.add_argument(
        "--metrics-address", default="127.0.0.1", metavar="ADDRESS", help="the metrics' address (default 127.0.0.1)"
    )
    gateway.add_argument(
        "--log-format",
        choices=["human", "json"],
        default="human",
        type=str.lower,
        help="json: each key's run's events (start, pause, resume, pace, progress, end) as JSON lines on stderr",
    )


def gateway_options(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> GatewayOptions:
    """The command's flags as ``GatewayOptions``, every value checked where every door checks it (the
    upstream as ``--base-url``, the run options by ``RunSpec``); one line for a bad one."""
    values = {name: getattr(args, name) for name in OPTION_NAMES if hasattr(args, name)}
    values.update(base_url=args.upstream, progress=False, report=None)
    plans: dict[str, KeyPlan] = {}
    if args.hold_key:
        spec = RunSpec.from_kwargs(**values, environ=environ)
    else:  # the clients' keys: none here (a key file gives listed keys their rate and quota)
        keys = values.pop("keys")
        if keys is not None:
            plans = {plan.hash: plan for plan in read_key_file(keys)}
        spec = RunSpec.from_kwargs(**values, api_key="-", environ=environ)
        spec = spec.replace(client=dataclasses.replace(spec.client, api_key=None), keys=())
    tokens = read_tokens(args.token_file) if args.token_file is not None else ()
    if not tokens and not is_loopback(args.host):
        raise ConfigurationError(
            f"refusing to serve on {args.host} (not loopback) without a token: give --token-file FILE "
            "(and put TLS in front, in a reverse proxy)"
        )
    report = None if args.report is None else check_path("report", args.report)
    return GatewayOptions(
        spec,
        args.hold_key,
        tokens,
        float(args.max_queue_wait),
        plans,
        report=report,
        interactive_share=args.interactive_share,
    )


def gateway_command(args: argparse.Namespace) -> int:
    """``batchsum gateway``: checked, bound, its address said on the first line, then served until a
    signal (SIGINT, SIGTERM) ends it; each key's run closes then (answers on the wire kept)."""
    try:
        from ..local.server import address, listen, serve
    except ImportError as exc:
        raise Stop(EXIT_USAGE, str(exc)) from None
    options = gateway_options(args)  # a bad value is one line (the command's dispatch says it as a flag)
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise Stop(EXIT_USAGE, f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    gateway = Gateway(options)
    spec = options.spec
    metrics = None
    if args.metrics_port is not None:
        from ..run.budget_keys import Watcher
        from ..run.key_metrics import KeyMetrics

        Watcher(spec.budget)  # a budget top cannot watch (none) is one line, before anything is served
        metrics = KeyMetrics.serve(args.metrics_port, args.metrics_address)
    keys = "the gateway's own key" if options.hold_key else "each client's own key (Authorization)"
    tokens = f", {len(options.tokens)} token{'s' if len(options.tokens) != 1 else ''}" if options.tokens else ""
    print(
        f"batchsum gateway on {address(args.host, sock.getsockname()[1])} to {redact_location(spec.client.base_url)} "
        f"({keys}{tokens}; budget {redact_location(str(spec.budget))}, run {gateway.run_id})",
        flush=True,
    )
    try:
        # A signal: what waits for a turn is answered at once (503, ask again), what is on the wire
        # gets its answer within the drain time, then each key's run closes.
        serve(
            create_app(gateway, metrics), sock, lifespan="on", on_signal=gateway.runs.stop, graceful=spec.drain_seconds
        )
    finally:
        if metrics is not None:
            metrics.close()
    return EXIT_OK
