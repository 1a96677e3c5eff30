"""The ``batchsum`` command: ``summarize`` Parquet files, summarize one ``text``, ``serve`` locally.

Exit codes: 0 the run finished (per-row failures are in the output), 1 stopped by a fatal error
(wrong key, expired plan, a journal that cannot be written, service unreachable for a single text),
2 bad usage or input, 130 interrupted (SIGINT), 143 terminated (SIGTERM). Every stop says how to resume.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NoReturn

from . import contract
from ._retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .budget import ENV_BUDGET, check_budget, open_budget
from .client import ENV_API_KEY, AsyncClient, Client, validate_params
from .engine import BatchStats, RunOptions, plan_batch
from .errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BatchsumError,
    BudgetError,
    ConfigurationError,
    InputError,
    InvalidParameterError,
    JournalError,
    NotPremiumError,
    RateLimitError,
    UnprocessableEntityError,
    redact_location,
)

__all__ = ["main"]

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
DEFAULT_RPM = 60.0
ENV_RPM = "BATCHSUM_RPM"


class _Stop(Exception):
    """Leave with an exit code and a one-line message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _summary_type(text: str) -> str | None:
    lowered = text.strip().lower()
    if lowered in ("default", "none", ""):
        return None
    names = [t.value for t in contract.SummaryType]
    if lowered not in names:
        raise argparse.ArgumentTypeError(f"invalid type {text!r}: use default, {', '.join(names)}")
    return lowered


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _whole_number(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        return value

    return parse


_positive_int = _whole_number(1)
_non_negative_int = _whole_number(0)


def _add_request_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        default="1",
        choices=["1", "2", "standard", "advanced"],
        help="1 = standard (smaller, faster model; default), 2 = advanced (full model)",
    )
    parser.add_argument(
        "--percentage",
        type=int,
        default=contract.PERCENTAGE_DEFAULT,
        choices=range(1, 7),
        metavar="1..6",
        help="summary length, 1 (shortest) to 6 (longest); default 4",
    )
    parser.add_argument(
        "--type",
        default=None,
        type=_summary_type,
        metavar="TYPE",
        help="output format: default (a plain summary), summary_2 (headings and points), bullets, best_line (any case)",
    )
    parser.add_argument(
        "--base-url", default=None, help="service address; default $BATCHSUM_BASE_URL or https://www.summarizer.org"
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for one answer (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-retries",
        type=_non_negative_int,
        default=DEFAULT_MAX_RETRIES,
        help=f"retries of a transient failure (429, 5xx, timeout, dropped connection; default {DEFAULT_MAX_RETRIES})",
    )
    parser.add_argument(
        "--encoding", default="json", choices=["json", "form", "multipart"], help="request body encoding (default json)"
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="start the local reference service in this process and use it (no key needed)",
    )


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line naming the problem, and one pointing to --help (not the usage block)."""

    def error(self, message: str) -> NoReturn:
        _say(f"error: {message}")
        _say(f"see '{self.prog} --help'")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="batchsum",
        description="Summarize text in bulk through a rate-limited summarization API.",
        epilog=f"The API key comes from ${ENV_API_KEY}.",
    )
    parser.add_argument(
        "--version", action="version", version=f"batchsum {_version()}", help="print the version and exit"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    run = commands.add_parser(
        "summarize",
        help="summarize a text column of a dataset (Parquet, CSV, JSON Lines; local or s3://) into a new file",
        description="Summarize the text column of a dataset (Parquet, CSV or JSON Lines files, folders, "
        "hive-partitioned folders, globs; local paths or s3://, gs://, abfs://, https:// URIs) into one "
        "output file with every input column plus the result columns, in input order (the inputs as "
        "given, a folder's files sorted by path, each file's rows in order). Paced under --rpm, texts "
        "outside 10..5000 words skipped, identical requests sent once, answers kept in a journal so "
        "that an interrupted run resumes where it stopped when the same command is run again.",
    )
    run.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="a file, a folder (recursive; key=value sub-folders become columns), a glob, or a URI; "
        "several inputs must share one schema",
    )
    run.add_argument(
        "-o",
        "--output",
        required=True,
        help="output file: .parquet, .csv or .jsonl, local or a URI (written when complete)",
    )
    run.add_argument("--column", required=True, help="the input column holding the texts")
    run.add_argument(
        "--format",
        default=None,
        choices=["parquet", "csv", "jsonl"],
        type=str.lower,
        help="the inputs' format (default: from their extension)",
    )
    _add_request_options(run)
    run.add_argument(
        "--rpm",
        type=_positive_float,
        default=None,
        help=f"requests per minute your plan allows; starts are evenly spaced under it "
        f"(default ${ENV_RPM} or {DEFAULT_RPM:g}; with --local, no limit; 0 = no pacing)",
    )
    run.add_argument(
        "--budget",
        default=None,
        metavar="WHERE",
        help="the key's rate budget, shared with every other run using the same key and "
        "service: machine (every batchsum process on this machine; the default, or "
        f"${ENV_BUDGET}), redis://HOST:PORT/DB (every machine), sqlite:///PATH, or none "
        "(this process only)",
    )
    run.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        help="a cap on requests in flight at once (default: sized from --rpm and the "
        "service's measured latency, so the pace holds at any latency)",
    )
    run.add_argument(
        "--output-column",
        default="summary",
        help="name of the summary column; the others are NAME_status, NAME_error, "
        "NAME_message, NAME_http_status, NAME_attempts (default summary)",
    )
    run.add_argument(
        "--journal",
        default=None,
        help="SQLite journal of finished answers (default: OUTPUT.journal.sqlite); "
        "reused by later runs so nothing is paid for twice",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="send nothing: show what would be sent, skipped, reused, and the least time it takes",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--wait",
        action="store_true",
        help="when another run holds the output or the journal, wait for it instead of refusing",
    )

    journal = commands.add_parser(
        "journal",
        help="show what a journal holds",
        description="Show what a run's journal holds: answers by status, size, last write, and which "
        "output it served. A journal is safe to delete once its output is complete and you will not "
        "rerun the command (it only saves paying again for answers already received).",
    )
    journal.add_argument("path", metavar="PATH", help="the journal (OUTPUT.journal.sqlite by default)")

    one = commands.add_parser("text", help="summarize one text (an argument or standard input) and print it")
    one.add_argument("text", nargs="?", default="-", help="the text; '-' or nothing reads standard input")
    _add_request_options(one)

    serve = commands.add_parser(
        "serve",
        help="run the local reference service",
        description="Run the local reference implementation of the summarization API.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    serve.add_argument(
        "--key",
        action="append",
        default=None,
        metavar="KEY[:PLAN]",
        help="an accepted API key, with plan premium (default), basic or expired; "
        "repeat for more; one premium key is generated and printed when none is given",
    )
    serve.add_argument(
        "--rpm",
        type=int,
        default=60,
        help="per-key limit over a sliding minute, answered with 429 and Retry-After (default 60; 0 = none)",
    )
    serve.add_argument("--latency", type=_positive_float, default=0.0, help="seconds added to every answer")
    serve.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND=RATE",
        help="inject a fault into a share of requests: KIND one of 429, 500, 502, drop, "
        "hang, garbled, 422; e.g. --fault 500=0.05 (repeatable)",
    )
    serve.add_argument("--seed", type=int, default=0, help="seed of the fault injection (default 0)")
    serve.add_argument(
        "--test-controls",
        action="store_true",
        help="serve /_local/stats, /_local/faults and /_local/reset (for tests and benchmarks), "
        "behind an admin key printed at start; off by default",
    )
    return parser


def _version() -> str:
    from . import __version__

    return __version__


def _say(message: str) -> None:
    print(f"batchsum: {message}", file=sys.stderr, flush=True)


def _start_local(stack: ExitStack, rpm: float) -> tuple[str, str]:
    try:
        from .local import LocalService
    except ImportError as exc:
        raise _Stop(EXIT_USAGE, str(exc)) from None
    service = stack.enter_context(LocalService(rpm=int(rpm)))
    _say(f"using the local reference service at {service.url} (extractive summaries made on this machine)")
    return service.url, service.key


def _client_settings(args: argparse.Namespace, stack: ExitStack, rpm: float) -> dict[str, Any]:
    settings: dict[str, Any] = {"timeout": args.timeout, "max_retries": args.max_retries, "encoding": args.encoding}
    if args.local:
        settings["base_url"], settings["api_key"] = _start_local(stack, rpm)
    else:
        if not os.environ.get(ENV_API_KEY, "").strip():
            raise _Stop(
                EXIT_USAGE,
                f"error: no API key: export {ENV_API_KEY}=... (the key is on the service's "
                "'My Account' page), or pass --local to try the local service",
            )
        settings["base_url"] = args.base_url
    return settings


def _budget_line(args: argparse.Namespace, stack: ExitStack, rpm: float) -> str:
    """Which budget a run would join, and how many starts it had in the last minute (others' runs)."""
    if args.local:
        return "budget:           the local service's own fresh key: no other run uses it"
    if not os.environ.get(ENV_API_KEY, "").strip():
        return f"budget:           not known without a key (${ENV_API_KEY} is not set)"
    try:
        client = AsyncClient(**_client_settings(args, stack, rpm))
    except ConfigurationError as exc:
        return f"budget:           not known ({exc})"
    budget = open_budget(args.budget, client.identity)

    async def look() -> Any:
        async with client:
            try:
                return await budget.look()
            finally:
                await budget.aclose()

    seen = asyncio.run(look())
    pause = f"; paused {seen.paused_for:.0f} s more: {seen.pause_reason}" if seen.paused_for > 0 else ""
    return (
        f"budget:           {budget.where}; {seen.starts} requests started on it in the last minute "
        f"by other runs with this key{pause}"
    )


def _run_rpm(args: argparse.Namespace) -> float:
    if args.rpm is not None:
        return float(args.rpm)
    if args.local:
        return 0.0
    raw = os.environ.get(ENV_RPM, str(DEFAULT_RPM))
    try:
        return _positive_float(raw)
    except argparse.ArgumentTypeError:
        raise InvalidParameterError(
            f"invalid ${ENV_RPM} {raw!r}: use a finite number of requests per minute >= 0"
        ) from None


class _StopOnSignal:
    """SIGINT and SIGTERM stop a run the same way: the first cancels it (nothing new starts, answers
    on the wire are awaited and kept); a second aborts at once."""

    def __init__(self, task: asyncio.Task[Any], say: Any) -> None:
        self.received: int | None = None
        self._task = task
        self._say = say
        self._loop = asyncio.get_running_loop()
        self._installed = threading.current_thread() is threading.main_thread()
        if self._installed:
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        if self.received is not None:
            raise KeyboardInterrupt  # the second signal: leave now
        self.received = signum
        self._say(
            f"batchsum: {signal.Signals(signum).name}: stopping; waiting for answers on the wire "
            "(signal again to abort at once)"
        )
        self._task.cancel()

    def remove(self) -> None:
        if self._installed:
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._loop.remove_signal_handler(signum)


def _summarize(args: argparse.Namespace) -> int:
    from .datasets import DatasetInput, DatasetOutput, check_output, default_journal, summarize_dataset
    from .journal import Journal, RunLock
    from .progress import ProgressBar

    # Everything that can be refused is checked before any file is created or anything is sent.
    params = validate_params(args.mode, args.percentage, args.type)
    rpm = _run_rpm(args)
    options = RunOptions(rpm=rpm, concurrency=args.concurrency)
    source = DatasetInput(args.inputs, args.column, format=args.format)
    target = check_output(args.output, source)
    output_path = redact_location(target.spec)  # as shown and stored: without credentials
    journal_path = Path(args.journal) if args.journal else default_journal(target)
    if not target.remote and os.path.abspath(journal_path) == os.path.abspath(target.local):
        raise InputError(f"--journal {journal_path} is the output file; give the journal a path of its own")
    if any(os.path.abspath(journal_path) == os.path.abspath(p) for p in source.paths):
        raise InputError(f"--journal {journal_path} is an input file; give the journal a path of its own")
    if args.dry_run:
        with ExitStack() as stack:
            store = stack.enter_context(Journal(journal_path, readonly=True)) if journal_path.exists() else None
            print(plan_batch(source.texts(), params=params, store=store).describe(rpm))
            print(_budget_line(args, stack, rpm))
        return EXIT_OK
    with ExitStack() as stack:
        client = AsyncClient(**_client_settings(args, stack, rpm))
        budget = open_budget(args.budget, client.identity)
        asyncio.run(check_budget(budget))  # before any file is created
        options = dataclasses.replace(options, budget=budget)
        if not target.remote:  # a remote output is one PUT at the end: the journal's lock guards the run
            stack.enter_context(RunLock(target.local, "output", wait=args.wait))
        journal_path.parent.mkdir(parents=True, exist_ok=True)
        stack.enter_context(RunLock(journal_path, "journal", wait=args.wait))
        assert source.schema is not None
        output = DatasetOutput(target, source.schema, args.output_column, source)
        cleanup = stack.enter_context(ExitStack())
        cleanup.callback(output.abort)  # a refused journal leaves no temporary output behind
        journal = stack.enter_context(Journal(journal_path))
        journal.note_output(output_path)
        cleanup.pop_all()
        bar = stack.enter_context(ProgressBar(source.num_rows, enabled=not args.quiet))
        stats = BatchStats(total=source.num_rows)
        pacer = options.pacer(lambda change: bar.write(f"batchsum: {change}"))
        kept = len(journal)
        stop: _StopOnSignal | None = None

        async def run() -> None:
            nonlocal stop
            current = asyncio.current_task()
            assert current is not None
            stop = _StopOnSignal(current, bar.write)
            ticker = asyncio.ensure_future(bar.follow(stats))
            try:
                async with client:
                    await summarize_dataset(
                        source, output, client, params, options, store=journal, stats=stats, pacer=pacer, on_result=bar
                    )
            finally:
                ticker.cancel()
                stop.remove()
                await budget.aclose()

        resume = f"run the same command again to resume (answers are kept in {journal_path})"
        try:
            asyncio.run(run())
        except (AuthenticationError, NotPremiumError) as exc:
            bar.close()
            _say(
                f'stopped: the service answered {exc.status_code} "{exc.message}" after {stats.done} rows; '
                f"{len(journal) - kept} new answers kept. "
                + (
                    "Check the key in $BATCHSUM_API_KEY, then "
                    if isinstance(exc, AuthenticationError)
                    else "Check your plan (mode 2 needs premium), then "
                )
                + resume
            )
            return EXIT_FATAL
        except BudgetError as exc:
            bar.close()
            _say(f"stopped: {exc}; {stats.done} rows were done; {len(journal) - kept} new answers kept; {resume}")
            return EXIT_FATAL
        except JournalError as exc:
            bar.close()
            _say(
                f"stopped: {exc}. {output_path} holds the {stats.done} rows finished so far, with every answer "
                f"received; free space (or pass another --journal), then run the same command again to resume"
            )
            return EXIT_FATAL
        except (KeyboardInterrupt, asyncio.CancelledError):
            bar.close()
            signum = stop.received if stop is not None else None
            why = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
            _say(
                f"{why}: {stats.done} rows were done ({stats.ok} ok); {len(journal) - kept} new answers kept in "
                f"the journal, with those that arrived while stopping; {resume}"
            )
            return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED
        bar.close()
        _say(f"wrote {output_path}: {stats.account()}")
        unreachable = stats.failed_by_code["connection_error"] + stats.failed_by_code["timeout"]
        if unreachable:
            _say(
                f"{unreachable} rows could not reach the service at {client.base_url} after {args.max_retries} "
                "retries each: check --base-url and the network, then run the same command again"
            )
        if stats.failed:
            _say(
                f"{stats.failed} rows failed (see the {args.output_column}_error column); "
                f"running the same command again retries the transient ones"
            )
    return EXIT_OK


def _text(args: argparse.Namespace) -> int:
    if args.text == "-" and sys.stdin.isatty():
        raise _Stop(
            EXIT_USAGE,
            'error: no text given: pass it as an argument (batchsum text "...") or on standard '
            "input (batchsum text < article.txt)",
        )
    text = sys.stdin.read() if args.text == "-" else args.text
    validate_params(args.mode, args.percentage, args.type)
    with ExitStack() as stack:
        settings = _client_settings(args, stack, 0)
        with Client(**settings) as client:
            try:
                print(client.summarize(text, args.mode, args.percentage, args.type))
            except APIError as exc:
                raise _Stop(EXIT_FATAL, f"error: {explain(exc, client.base_url)}") from None
    return EXIT_OK


def explain(error: APIError, base_url: str) -> str:
    """What went wrong in words a CLI user acts on: who answered what, and what to do."""
    tries = f"after {error.attempts} attempt{'s' if error.attempts != 1 else ''}"
    if isinstance(error, AuthenticationError):
        return f'the service answered 401 "{error.message}": check the key in ${ENV_API_KEY}'
    if isinstance(error, NotPremiumError):
        return (
            f'the service answered 401 "{error.message}": your plan does not allow this request (mode 2 needs premium)'
        )
    if isinstance(error, UnprocessableEntityError):
        return f'the service refused the request (422 "{error.message}")'
    if isinstance(error, RateLimitError):
        return f"the service kept answering 429 (too many requests) {tries}; try again later, or lower --rpm"
    if isinstance(error, APITimeoutError):
        return f"no answer from {base_url} in time {tries}; try again, or raise --timeout"
    if isinstance(error, APIConnectionError):
        return f"cannot reach the service at {base_url} ({error.message}) {tries}; check --base-url and the network"
    if isinstance(error, APIStatusError):
        return f'the service at {base_url} answered {error.status_code} "{error.message}" {tries}'
    return f"{error.message} ({base_url}, {tries})"


def _journal(args: argparse.Namespace) -> int:
    import datetime

    from .journal import Journal

    path = Path(args.path)
    with Journal(path, readonly=True) as journal:
        counts = journal.counts()
        meta = journal.meta()
        last = journal.last_write()
    size = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + "-*") if p.is_file())
    when = datetime.datetime.fromtimestamp(last).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z") if last else "never"
    by_status = ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) or "none"
    print(f"journal:    {path}")
    print(f"answers:    {sum(counts.values())} ({by_status})")
    print(f"size:       {size / 1024:.1f} KiB")
    print(f"last write: {when}")
    print(f"output:     {redact_location(meta.get('output', 'not recorded'))}")
    print(
        "safe to delete once its output is complete and you will not rerun the command: it only spares "
        "paying again for answers already received"
    )
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .local import Faults, ServiceState
        from .local.app import create_app
        from .local.state import new_key
    except ImportError as exc:
        raise _Stop(EXIT_USAGE, str(exc)) from None
    rates: dict[str, float] = {}
    for spec in args.fault:
        kind, _, rate = spec.partition("=")
        try:
            rates[kind] = float(rate)
        except ValueError:
            raise _Stop(EXIT_USAGE, f"invalid --fault {spec!r}: use KIND=RATE, e.g. 500=0.05") from None
    try:
        faults = Faults(latency=args.latency, rates=rates, seed=args.seed)
        state = ServiceState(args.key, rpm=args.rpm, faults=faults, admin_key=new_key() if args.test_controls else None)
    except ValueError as exc:
        raise _Stop(EXIT_USAGE, str(exc)) from None
    shown = f"{args.host}:{args.port}" if ":" not in args.host else f"[{args.host}]:{args.port}"
    print(f"batchsum local service on http://{shown} (limit {args.rpm or 'none'} requests/min per key)", flush=True)
    for key, plan in state.plans.items():
        print(f"  key ({plan.value}): {key}" if args.key is None else f"  key ({plan.value}) accepted", flush=True)
    if args.key is None:
        print(f"  export {ENV_API_KEY}={state.key} BATCHSUM_BASE_URL=http://{shown}", flush=True)
    if state.admin_key is not None:
        print(f"  test controls on /_local/* with admin key: {state.admin_key}", flush=True)
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level="warning")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version, or a usage error already said in one line
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    handlers = {"summarize": _summarize, "text": _text, "serve": _serve, "journal": _journal}
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main_thread else None
    if in_main_thread and previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C: answers on the wire are kept
    try:
        return handlers[args.command](args)
    except _Stop as stop:
        _say(str(stop))
        return stop.code
    except (InputError, InvalidParameterError, ConfigurationError, BudgetError) as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    except BatchsumError as exc:
        _say(f"error: {exc}")
        return EXIT_FATAL
    except KeyboardInterrupt:
        _say("interrupted")
        return EXIT_INTERRUPTED
    finally:
        if in_main_thread and previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
