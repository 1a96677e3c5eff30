"""``batchsum serve``: the local reference service, with its keys, limit and injected faults as
the flags say."""

from __future__ import annotations

import argparse

from ..service.settings import ENV_API_KEY
from .console import EXIT_OK, EXIT_USAGE, Stop

__all__ = ["serve_command"]


def serve_command(args: argparse.Namespace) -> int:
    try:
        from ..local import Faults, ServiceState
        from ..local.app import create_app
        from ..local.server import listen, serve
        from ..local.state import new_key
    except ImportError as exc:
        raise Stop(EXIT_USAGE, str(exc)) from None
    rates: dict[str, float] = {}
    for spec in args.fault:
        kind, _, rate = spec.partition("=")
        try:
            rates[kind] = float(rate)
        except ValueError:
            raise Stop(EXIT_USAGE, f"invalid --fault {spec!r}: use KIND=RATE, e.g. 500=0.05") from None
    try:
        faults = Faults(latency=args.latency, rates=rates, seed=args.seed)
        state = ServiceState(
            args.key,
            rpm=args.rpm,
            faults=faults,
            admin_key=new_key() if args.test_controls else None,
            limit_kind=args.limit_kind,
            room_headers=args.room_headers,
        )
    except ValueError as exc:
        raise Stop(EXIT_USAGE, str(exc)) from None
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise Stop(EXIT_USAGE, f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    port = sock.getsockname()[1]
    shown = f"{args.host}:{port}" if ":" not in args.host else f"[{args.host}]:{port}"
    limit = f"{args.rpm} requests/min per key, {args.limit_kind}" if args.rpm else "no limit"
    stated = f"; answers state the room left ({args.room_headers})" if args.room_headers and args.rpm else ""
    print(f"batchsum local service on http://{shown} ({limit}{stated})", flush=True)
    for key, plan in state.plans.items():
        print(f"  key ({plan.value}): {key}" if args.key is None else f"  key ({plan.value}) accepted", flush=True)
    if args.key is None:
        print(f"  export {ENV_API_KEY}={state.key} BATCHSUM_BASE_URL=http://{shown}", flush=True)
    if state.admin_key is not None:
        print(f"  test controls on /_local/* with admin key: {state.admin_key}", flush=True)
    serve(create_app(state), sock)
    return EXIT_OK
