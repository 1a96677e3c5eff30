"""The routes of the local reference service: the interface's one operation, answered as the
interface says, its OpenAPI document at ``/openapi.json``, plus ``/_local/*`` for tests and
benchmarks (stats, faults, reset), off unless an admin key is set. What any server of the interface
shares is public here (``service_routes``, ``read_request``, ``word_limits``, the two error shapes):
``batchsum gateway`` serves the same routes, parses requests and refuses them with the same bodies.

Order of checks on the summarize route: injected fault, key, expired plan, rate limit (every
request with a valid key counts, valid body or not), body, plan vs mode, word limits, summary. The
fault, key, plan and limit are decided when the request arrives; the answer then takes the injected
latency. ``ServiceState.room_headers`` adds headers stating the room left in the key's limit.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..service import contract
from ..service.contract import Messages
from .openapi import openapi_document
from .state import Faults, Plan, ServiceState
from .summarizer import summarize

__all__ = [
    "create_app",
    "service_routes",
    "read_request",
    "word_limits",
    "shape_a",
    "shape_b",
    "validation_error",
    "MAX_BODY_BYTES",
]


def shape_a(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error body of the interface's shape A: ``{"error": message}``."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def shape_b(status: int, message: str) -> JSONResponse:
    """An error body of the interface's shape B: ``{"type": "invalid_request", "message": message}``."""
    return JSONResponse({"type": contract.ERROR_TYPE_INVALID_REQUEST, "message": message}, status_code=status)


def validation_error(*problems: tuple[list[Any], str, str]) -> JSONResponse:
    """FastAPI's own 422 body, which the interface calls "Validation Error"."""
    detail = [{"loc": loc, "msg": msg, "type": kind} for loc, msg, kind in problems]
    return JSONResponse({"detail": detail}, status_code=422)


_BAD_GATEWAY = """<!DOCTYPE html>
<html><head><title>502 Bad Gateway</title></head>
<body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>
"""


class _DroppedConnection(Response):
    """Starts a 200 answer, sends part of it, and stops: the server then cuts the connection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"64")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"result": "', "more_body": True})


MAX_BODY_BYTES = 1024 * 1024  # a 5000-word text is about 40 KB: 25 times that is generous


def _too_large() -> JSONResponse:
    return shape_a(413, f"Payload Too Large: the body may hold at most {MAX_BODY_BYTES} bytes")


async def _read_body(request: Request) -> bytes | None:
    """The body, or None once it passes MAX_BODY_BYTES: never read whole."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    request._body = bytes(body)  # what request.form() then parses, instead of the spent stream
    return request._body


async def _read_fields(request: Request) -> dict[str, Any] | JSONResponse:
    """The request's fields from JSON, multipart or url-encoded bodies; 413 when too large, a 422
    body when unreadable (malformed or nested too deep)."""
    raw = await _read_body(request)
    if raw is None:
        return _too_large()
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        try:
            form = await request.form()
        except Exception:  # a malformed form: the interface's 422, not a 500
            return validation_error((["body"], "Invalid form data", "value_error"))
        return {k: v for k, v in form.items() if isinstance(v, str)}
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError) as exc:
        return validation_error((["body", getattr(exc, "pos", 0)], "JSON decode error", "json_invalid"))
    if not isinstance(data, dict):
        return validation_error((["body"], "Input should be a valid dictionary", "model_attributes_type"))
    return data


def _validate(fields: dict[str, Any]) -> tuple[str, contract.Params] | JSONResponse:
    """(text, params) when the fields fit the interface's types; else FastAPI's 422 listing each problem."""
    problems: list[tuple[list[Any], str, str]] = []
    text = fields.get(contract.FIELD_TEXT)
    if text is None:
        problems.append((["body", "text"], "Field required", "missing"))
    elif not isinstance(text, str):
        problems.append((["body", "text"], "Input should be a valid string", "string_type"))
    mode = contract.as_int(fields.get(contract.FIELD_MODE))
    if contract.FIELD_MODE not in fields:
        problems.append((["body", "mode"], "Field required", "missing"))
    elif mode not in (1, 2):
        problems.append((["body", "mode"], "Input should be 1 or 2", "literal_error"))
    percentage = fields.get(contract.FIELD_PERCENTAGE)
    if percentage is not None:
        percentage = contract.as_int(percentage)
        if percentage is None or not contract.PERCENTAGE_MIN <= percentage <= contract.PERCENTAGE_MAX:
            problems.append((["body", "percentage"], "Input should be between 1 and 6", "less_than_equal"))
    kind = fields.get(contract.FIELD_TYPE)
    allowed = [t.value for t in contract.SummaryType]
    if kind is not None and kind not in allowed:
        problems.append((["body", "type"], "Input should be " + ", ".join(repr(a) for a in allowed), "literal_error"))
    if problems or not isinstance(text, str):
        return validation_error(*problems)
    return text, contract.parse_params(mode, percentage, kind)


async def read_request(request: Request) -> tuple[str, contract.Params] | JSONResponse:
    """The text and parameters of a summarize request (JSON, multipart or url-encoded), or the
    answer that refuses it: 413 when too large, FastAPI's 422 when unreadable or mistyped."""
    fields = await _read_fields(request)
    if isinstance(fields, JSONResponse):
        return fields
    return _validate(fields)


def word_limits(text: str) -> JSONResponse | None:
    """The interface's 422 for a text outside its word limits (shape B too short, shape A too long), or None."""
    words = contract.count_words(text)
    if words < contract.MIN_WORDS:
        return shape_b(422, Messages.TOO_SHORT)
    if words > contract.MAX_WORDS:
        return shape_a(422, Messages.TOO_LONG)
    return None


def service_routes(summarize_route: Any, name: str, document: dict[str, Any] | None = None) -> list[Route]:
    """The interface's routes, served by ``summarize_route``: the one operation, a short description
    of the server (``name``) at ``/``, and the OpenAPI document at ``/openapi.json`` (``document``:
    the interface's, with what a server adds to it)."""

    async def index_route(request: Request) -> Response:
        return JSONResponse(
            {"service": name, "endpoint": f"POST {contract.SUMMARIZE_PATH}", "openapi": "/openapi.json"}
        )

    document = document if document is not None else openapi_document()

    async def openapi_route(request: Request) -> Response:
        return JSONResponse(document)

    return [
        Route(contract.SUMMARIZE_PATH, summarize_route, methods=["POST"]),
        Route("/", index_route, methods=["GET"]),
        Route("/openapi.json", openapi_route, methods=["GET"]),
    ]


def create_app(state: ServiceState) -> Starlette:
    """The ASGI app serving ``state``'s keys, plans, limit and faults. The test controls
    (``/_local/*``) exist only when ``state.admin_key`` is set, and need it as a bearer token."""

    def admin(request: Request) -> Response | None:
        """None when the request may use the test controls; else the answer that refuses it."""
        if state.admin_key is None:
            return JSONResponse({"error": "Not Found"}, status_code=404)
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(key.strip(), state.admin_key):
            return shape_b(401, Messages.INVALID_KEY)
        return None

    async def summarize_route(request: Request) -> Response:
        generation = state.begin()
        try:
            response, fields = await _answer(request)
        finally:
            state.end(generation)
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        state.record(response.status_code, fields, key.strip(), generation)
        return response

    async def _answer(request: Request) -> tuple[Response, dict[str, Any] | None]:
        faults = state.faults
        number = faults.arrive()
        fault = faults.next()
        # The key, the plan and the limit decide at arrival (the answer then takes its latency).
        admission = _admission(request) if fault is None else None
        if admission is not None and admission[3] and admission[0] is not None:
            return admission[0], None  # the key's account refused: answered at once, no work done
        while faults.holds(number) and state.faults is faults:  # held until released, or new faults
            await asyncio.sleep(0.01)
        if faults.latency or faults.latency_spread:
            await asyncio.sleep(faults.delay(number))
        if fault == "429":
            headers = {} if faults.retry_after is None else {"Retry-After": f"{faults.retry_after:g}"}
            return shape_a(429, Messages.RATE_LIMITED, headers), None
        if fault == "500":
            return shape_a(500, Messages.SERVER), None
        if fault == "502":
            return HTMLResponse(_BAD_GATEWAY, status_code=502), None
        if fault == "drop":
            return _DroppedConnection(), None
        if fault == "422":
            return shape_a(422, Messages.TOO_LONG), None
        if fault == "garbled":
            return Response(b'{"result": "The summ', media_type="application/json"), None
        if fault == "hang":
            await asyncio.sleep(faults.hang_seconds)
        refusal, plan, room, _ = admission if admission is not None else _admission(request)
        if refusal is not None or plan is None:
            return refusal or shape_b(401, Messages.INVALID_KEY), None
        response, fields = await _admitted(request, plan)
        response.headers.update(room)
        return response, fields

    def _admission(request: Request) -> tuple[Response | None, Plan | None, dict[str, str], bool]:
        """(the refusal or None, the key's plan, the headers stating the room left): key, plan, the
        key's account (its plan expired after N requests, its quota: a refusal with no plan, answered
        at once: the last item True), limit."""
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        plan = state.plans.get(key.strip()) if scheme.lower() == "bearer" else None
        if plan is None:
            return shape_b(401, Messages.INVALID_KEY), None, {}, False
        if plan is Plan.EXPIRED:
            return shape_b(401, Messages.NOT_PREMIUM), plan, {}, False
        refused = state.refusal(key.strip())
        if refused is not None:
            status, headers = refused
            answer = (
                shape_b(401, Messages.NOT_PREMIUM) if status == 401 else shape_a(429, Messages.RATE_LIMITED, headers)
            )
            return answer, plan, {}, True
        wait, room = state.admit(key.strip())
        if wait is not None:
            return shape_a(429, Messages.RATE_LIMITED, {"Retry-After": str(wait), **room}), plan, room, False
        return None, plan, room, False

    async def _admitted(request: Request, plan: Plan) -> tuple[Response, dict[str, Any] | None]:
        """The answer to a request the key, plan and limit admitted."""
        valid = await read_request(request)
        if isinstance(valid, Response):
            return valid, None
        text, params = valid
        if plan is Plan.BASIC and params.mode == contract.Mode.ADVANCED:
            return shape_b(401, Messages.NOT_PREMIUM), None
        if (refused := word_limits(text)) is not None:
            return refused, None
        try:
            result = await run_in_threadpool(
                summarize, text, params.mode, params.percentage, params.type and params.type.value
            )
        except Exception:  # the summarizer must never take the service down
            return shape_a(500, Messages.SERVER), None
        return JSONResponse({contract.FIELD_RESULT: result}), {"text": text, **params.fields()}

    async def stats_route(request: Request) -> Response:
        if (refused := admin(request)) is not None:
            return refused
        return JSONResponse(state.stats())

    async def faults_route(request: Request) -> Response:
        if (refused := admin(request)) is not None:
            return refused
        try:
            state.faults = Faults.from_json(await request.json())
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"ok": True})

    async def reset_route(request: Request) -> Response:
        if (refused := admin(request)) is not None:
            return refused
        state.reset()
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            *service_routes(summarize_route, "batchsum local reference service"),
            Route("/_local/stats", stats_route, methods=["GET"]),
            Route("/_local/faults", faults_route, methods=["POST"]),
            Route("/_local/reset", reset_route, methods=["POST"]),
        ]
    )
