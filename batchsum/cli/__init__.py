"""The ``batchsum`` command: ``summarize`` Parquet files, summarize one ``text``, ``serve`` locally.

Exit codes: 0 the run finished (per-row failures are in the output), 1 stopped by a fatal error
(wrong key, expired plan, a journal that cannot be written, the request cap reached, service
unreachable for a single text),
2 bad usage or input, 130 interrupted (SIGINT), 143 terminated (SIGTERM). Every stop says how to resume.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .run.spec import ENCODINGS, ENV_API_KEY, LONG_TEXT_POLICIES, OPTIONS, RunSpec, check_rate
from .service import contract
from .service.errors import (
    APIError,
    AuthenticationError,
    BatchsumError,
    BrokenInputError,
    BudgetError,
    ConfigurationError,
    InputError,
    InvalidParameterError,
    JournalError,
    NotPremiumError,
    RequestCapReached,
    explain,
    redact_location,
)

__all__ = ["main"]

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


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


def _number(minimum: float, *, whole: bool = False, above: bool = False) -> Any:
    """An argparse type: a finite number >= ``minimum`` (> with ``above``), whole or not."""

    def parse(text: str) -> float | int:
        try:
            value: float | int = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if whole else ''}number") from None
        if not (value > minimum if above else value >= minimum) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number {'>' if above else '>='} {minimum:g}")
        return value

    return parse


def _rate(text: str) -> float | str:
    """``--rpm``: a number of requests a minute, ``auto`` or ``auto:N``."""
    try:
        rpm, auto = check_rate(text, text=True)
    except InvalidParameterError as exc:
        raise argparse.ArgumentTypeError("invalid " + str(exc).removeprefix("invalid rpm ")) from None
    return text.strip().lower() if auto else rpm


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0 and at most 1 (e.g. 0.8)")
    return value


_MODES = [str(int(m)) for m in contract.Mode] + [m.name.lower() for m in contract.Mode]

# How each option is typed on the command line; its name, default and help come from ``OPTIONS``.
_FLAGS: dict[str, dict[str, Any]] = {
    "mode": {"choices": _MODES, "type": str.lower},
    "percentage": {
        "type": int,
        "choices": range(contract.PERCENTAGE_MIN, contract.PERCENTAGE_MAX + 1),
        "metavar": f"{contract.PERCENTAGE_MIN}..{contract.PERCENTAGE_MAX}",
    },
    "type": {"type": _summary_type, "metavar": "TYPE"},
    "output_column": {"metavar": "NAME"},
    "base_url": {"metavar": "URL"},
    "local": {"action": "store_true"},
    "timeout": {"type": _number(0, above=True), "metavar": "SECONDS"},
    "max_retries": {"type": _number(0, whole=True), "metavar": "N"},
    "encoding": {"choices": ENCODINGS},
    "rpm": {"type": _rate, "metavar": "N|auto[:N]"},
    "concurrency": {"type": _number(1, whole=True), "metavar": "N"},
    "budget": {"metavar": "WHERE"},
    "journal": {"metavar": "PATH"},
    "max_wait": {"type": _number(0), "metavar": "SECONDS"},
    "long_texts": {"choices": LONG_TEXT_POLICIES, "type": str.lower},
    "max_requests": {"type": _number(1, whole=True), "metavar": "N"},
    "sample": {"type": _number(1, whole=True), "metavar": "N"},
    "share": {"type": _share, "metavar": "F"},
    "report": {"metavar": "PATH"},
}
_REQUEST = ("mode", "percentage", "type", "base_url", "local", "timeout", "max_retries", "encoding")
# Options the CLI takes otherwise (options.EXCEPTIONS says why): the key from the environment only,
# no limiter object, progress off with --quiet; the journal's default beside the output.
_NOT_FLAGS = ("api_key", "limiter", "progress")
_JOURNAL_HELP = " (default: OUTPUT.journal.sqlite beside the output)"


def _add_options(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """The flags of ``names``, from ``OPTIONS``: one name, default and help for every front-end."""
    for option in OPTIONS:
        if option.name not in names or option.name in _NOT_FLAGS:
            continue
        kwargs = dict(_FLAGS.get(option.name, {}))
        default = option.default
        if kwargs.get("action") == "store_true":
            parser.add_argument(option.flag, action="store_true", help=option.help)
            continue
        shown = "" if default is None else f" (default {default})"
        more = _JOURNAL_HELP if option.name == "journal" else ""
        parser.add_argument(option.flag, default=default, help=option.help + shown + more, **kwargs)


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
    _add_options(run, [option.name for option in OPTIONS])
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="send nothing: show what would be sent, skipped, reused, and the least time it takes",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--log-format",
        choices=["human", "json"],
        default="human",
        type=str.lower,
        help="human (default): a progress bar and lines for a person; json: one JSON object per event "
        "(start, pause, resume, pace, progress, stop, error, end) on stderr, and nothing else there",
    )
    run.add_argument(
        "--raw-csv",
        action="store_true",
        help="write summaries and messages to a .csv output as they came, even when one starts with "
        "=, +, -, @, a tab or a CR (by default such a cell gets a leading ' so no spreadsheet runs it)",
    )
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

    report = commands.add_parser(
        "report",
        help="show a run report (--report) for a person",
        description="Show what a run report written with --report holds: outcome, rows by status, "
        "requests sent, paid, 429s and retries, utilization of the plan, latency.",
    )
    report.add_argument("path", metavar="PATH", help="the run report (a JSON file)")

    limits = commands.add_parser(
        "limits",
        help="list the rate limits --rpm auto found, and forget them",
        description="List what the rate budget remembers of each key's limit at each service (found by "
        "--rpm auto, or stated by the service): the service, the limit, how and when it was known, and "
        "the key as a short hash (never a piece of it; 'this key' marks the one in "
        f"${ENV_API_KEY}). A remembered limit is where --rpm auto starts for a week; --forget removes it.",
    )
    limits.add_argument(
        "--budget",
        default=None,
        metavar="WHERE",
        help="the budget that remembers: machine (default, or $BATCHSUM_BUDGET), sqlite:///PATH or "
        "redis://HOST:PORT/DB; none remembers nothing",
    )
    limits.add_argument("--service", default=None, metavar="URL", help="only the limits at this service (base URL)")
    limits.add_argument("--this-key", action="store_true", help=f"only the limits of the key in ${ENV_API_KEY}")
    limits.add_argument("--forget", action="store_true", help="forget the limits listed (all, or those chosen)")

    one = commands.add_parser(
        "text",
        help="summarize one text (an argument or standard input) and print it",
        description="Summarize one text and print the summary: the text as an argument, or '-' (or "
        "nothing) to read it from standard input. The same request options as summarize; --local uses "
        "the local reference service.",
        epilog='e.g. batchsum text --local "$(cat article.txt)"   or   cat article.txt | batchsum text --local',
    )
    one.add_argument("text", nargs="?", default="-", help="the text; '-' or nothing reads standard input")
    _add_options(one, _REQUEST)

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
        help="per-key limit per minute, answered with 429 and Retry-After (default 60; 0 = none)",
    )
    serve.add_argument(
        "--limit-kind",
        choices=("sliding", "fixed", "bucket", "clock", "clock-10s", "clock-1s"),
        default="sliding",
        help="how the limit counts: sliding (any 60 s), fixed (a minute opened by the key's first "
        "request, then the next), bucket (a token bucket of --rpm that starts full), clock (minutes on "
        "the clock), clock-10s / clock-1s (the minute's share in each 10 s / 1 s window on the clock) "
        "(default sliding)",
    )
    serve.add_argument(
        "--room-headers",
        choices=("ratelimit", "x-ratelimit"),
        default=None,
        help="state the room left in the key's limit in every answer: RateLimit-Limit/-Remaining/-Reset "
        "or X-RateLimit-*; the live service states none (default: none)",
    )
    serve.add_argument("--latency", type=_number(0), default=0.0, help="seconds added to every answer")
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


_json_logs = False  # --log-format json: stderr carries JSON events only


def _say(message: str) -> None:
    if _json_logs:
        logging.getLogger("batchsum").info("%s", message, extra={"event": "message"})
        return
    print(f"batchsum: {message}", file=sys.stderr, flush=True)


class _JsonLogs:
    """``--log-format json``: the ``batchsum`` logger's records as JSON lines on stderr, and nothing
    else there (no bar, no human lines) while the command runs."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._handler: logging.Handler | None = None
        self._saved: tuple[int, bool] = (logging.NOTSET, True)

    def __enter__(self) -> _JsonLogs:
        global _json_logs
        if self.enabled:
            from .run.logs import json_handler

            logger = logging.getLogger("batchsum")
            self._saved = (logger.level, logger.propagate)
            self._handler = json_handler(sys.stderr)
            logger.addHandler(self._handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
            _json_logs = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        global _json_logs
        if self._handler is not None:
            logger = logging.getLogger("batchsum")
            logger.removeHandler(self._handler)
            logger.setLevel(self._saved[0])
            logger.propagate = self._saved[1]
            _json_logs = False


class _StopOnSignal:
    """SIGINT and SIGTERM stop a run the same way, in every phase: the first cancels it (nothing new
    starts, answers on the wire are awaited and kept); a second aborts at once. Once the output is
    complete (``finish``), a signal changes nothing: the run ends as it would have, saying so.

    ``with _StopOnSignal(say) as stop: asyncio.run(...)``, and ``stop.arm(task)`` inside the loop."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, say: Any) -> None:
        self.received: int | None = None
        self.late: int | None = None  # a signal that came after the output was complete
        self.finished = False
        self._say = say
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._installed = threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        if self._installed:  # before the loop and after it: a signal is a KeyboardInterrupt, or a note
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._outside_loop)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, _Late(self) if self.finished else handler)

    def arm(self, task: asyncio.Task[Any]) -> None:
        self._task, self._loop = task, asyncio.get_running_loop()
        if self._installed:
            for signum in self.SIGNALS:
                self._loop.add_signal_handler(signum, self._on_signal, signum)

    def disarm(self) -> None:
        if self._installed and self._loop is not None:
            for signum in self.SIGNALS:
                self._loop.remove_signal_handler(signum)
                signal.signal(signum, self._outside_loop)

    def finish(self) -> None:
        """The output is complete: from now on a signal is only noted."""
        self.finished = True

    def _outside_loop(self, signum: int, frame: Any) -> None:
        if self.finished:
            self.note_late(signum)
            return
        self.received = signum
        raise KeyboardInterrupt

    def note_late(self, signum: int) -> None:
        if self.late is None:
            self.late = signum
            self._say(f"{signal.Signals(signum).name}: the output is already complete; finishing")

    def _on_signal(self, signum: int) -> None:
        if self.finished:
            self.note_late(signum)
            return
        if self.received is not None:
            raise KeyboardInterrupt  # the second signal: leave now
        self.received = signum
        self._say(
            f"{signal.Signals(signum).name}: stopping; waiting for answers on the wire (signal again to abort at once)"
        )
        if self._task is not None:
            self._task.cancel()


class _Late:
    """The handler a finished run leaves until its process exits: a signal is noted, nothing more."""

    def __init__(self, stop: _StopOnSignal) -> None:
        self._stop = stop

    def __call__(self, signum: int, frame: Any) -> None:
        self._stop.note_late(signum)


def _remove_empty_journal(path: Path) -> None:
    """A journal this run created and that holds no answer (the key was refused at once)."""
    from .data.journal import Journal

    try:
        with Journal(path, create=False) as journal:
            empty = len(journal) == 0
    except (InputError, JournalError):
        return
    if empty:
        for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            name.unlink(missing_ok=True)


def _journal_path(args: argparse.Namespace, target: Any, source: Any) -> Path:
    """``--journal``, or ``OUTPUT.journal.sqlite``; never the output or an input."""
    from .data.datasets import default_journal

    path = Path(args.journal) if args.journal else default_journal(target)
    if not target.remote and os.path.realpath(path) == os.path.realpath(target.local):
        raise InputError(f"--journal {path} is the output file; give the journal a path of its own")
    if any(os.path.realpath(path) == os.path.realpath(p) for p in source.paths):
        raise InputError(f"--journal {path} is an input file; give the journal a path of its own")
    return path


def _own_process(args: argparse.Namespace) -> None:
    """The command runs in a process of its own (``batchsum ...``, not ``main([...])`` called from
    Python): it may choose for the whole process what a library leaves to its host
    (``_imports.own_arrow``: jemalloc for Arrow's memory, and no pandas)."""
    if args.own_process:
        from ._imports import own_arrow

        own_arrow()


def _summarize(args: argparse.Namespace) -> int:
    _own_process(args)
    from .data.datasets import DatasetInput, DatasetOutput, check_output
    from .run.run import Run, dry_run

    # Everything that can be refused is checked before any file is created or anything is sent.
    spec = RunSpec.from_args(args, key_required=not args.dry_run)
    if args.log_format == "json":
        spec = spec.replace(progress=False)
    source = DatasetInput(args.inputs, args.column, format=args.format)
    target = check_output(args.output, source)
    journal_path = _journal_path(args, target, source)
    spec = spec.replace(journal=str(journal_path))
    shown = redact_location(target.spec)  # the output as shown: without credentials
    if args.dry_run:
        print(dry_run(spec, source.texts()))
        return EXIT_OK
    journal_path.parent.mkdir(parents=True, exist_ok=True)  # the cache folder, for a remote output's journal
    journal_existed = journal_path.exists()
    if spec.client.local:
        _say("using the local reference service (extractive summaries made on this machine)")
    schema = source.schema
    assert schema is not None
    locks = [] if target.remote else [(target.local, "output")]  # a remote output is one PUT at the end
    run = Run(
        spec,
        total=source.num_rows,
        locks=[*locks, (journal_path, "journal")],
        wait=args.wait,
        output=lambda: DatasetOutput(target, schema, spec.output_column, source, raw_csv=args.raw_csv),
    )
    resume = f"run the same command again to resume (answers are kept in {journal_path})"
    stop = _StopOnSignal(_say)

    async def main() -> None:
        current = asyncio.current_task()
        assert current is not None
        stop.arm(current)
        try:
            async with run:
                await run.write_dataset(source)
                if run.late_stop is None:
                    stop.finish()
            if run.late_stop is not None:  # the stop came after every row was written
                stop.finish()
                stop.note_late(stop.received or signal.SIGINT)
        finally:
            stop.disarm()

    stats = run.stats
    try:
        with stop:
            asyncio.run(main())
    except (AuthenticationError, NotPremiumError) as exc:
        if run.new_answers == 0 and not journal_existed:
            _remove_empty_journal(journal_path)  # nothing to resume: leave nothing behind
            _say(f"stopped: {explain(exc)}; nothing was kept, so fix the key or the plan and run the command again")
        else:
            _say(f"stopped after {stats.done} rows: {explain(exc)}; {run.new_answers} new answers kept; {resume}")
        return EXIT_FATAL
    except RequestCapReached as exc:
        command = shlex.join(["batchsum", *getattr(args, "argv", [])])
        _say(
            f"stopped: {exc}. {target.spec} holds every row (the {exc.remaining} not sent: failed, not_sent); "
            f"{run.new_answers} new answers are kept in {journal_path}, so no text is paid for twice. "
            f"To continue, run the same command again: {command}"
        )
        return EXIT_FATAL
    except BudgetError as exc:
        if not run.opened:
            raise  # refused before anything was sent: a usage error
        _say(f"stopped: {exc}; {stats.done} rows were done; {run.new_answers} new answers kept; {resume}")
        return EXIT_FATAL
    except JournalError as exc:
        _say(
            f"stopped: {exc}. {shown} holds the {stats.yielded} rows finished so far, with every answer "
            f"received; free space (or pass another --journal), then run the same command again to resume"
        )
        return EXIT_FATAL
    except BrokenInputError as exc:
        _say(
            f"stopped: {exc}. {shown} holds the {stats.yielded} rows read and finished before it broke; "
            f"{run.new_answers} new answers are kept in {journal_path}, so a rerun pays for none of them again: "
            "mend or replace the input, then run the same command again"
        )
        return EXIT_FATAL
    except (KeyboardInterrupt, asyncio.CancelledError):
        signum = stop.received
        why = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
        _say(
            f"{why}: {stats.done} rows were done ({stats.ok} ok); {run.new_answers} new answers kept in "
            f"the journal, with those that arrived while stopping; {resume}"
        )
        return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED
    late = f" (a {signal.Signals(stop.late).name} came after every row was done)" if stop.late else ""
    _say(f"wrote {shown}: {stats.account()}{late}")
    unreachable = stats.failed_by_code["connection_error"] + stats.failed_by_code["timeout"]
    if unreachable:
        _say(
            f"{unreachable} rows could not reach the service at {run.base_url} after {spec.client.max_retries} "
            "retries each: check --base-url and the network, then run the same command again"
        )
    not_sent = stats.failed_by_code["not_sent"]
    if not_sent:
        why = "not in the sample: the same command without --sample sends them" if spec.sample else "see its message"
        _say(f"{not_sent} rows were not sent ({spec.output_column}_error not_sent; {why})")
    if stats.failed - not_sent:
        _say(
            f"{stats.failed - not_sent} rows failed (see the {spec.output_column}_error column); "
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
    from .run.run import bind
    from .service.client import Client

    spec = bind(RunSpec.from_args(args))
    text = sys.stdin.read() if args.text == "-" else args.text
    with Client(**spec.client.client_kwargs()) as client:
        try:
            print(client.summarize(text, *spec.params))
        except APIError as exc:
            raise _Stop(EXIT_FATAL, f"error: {explain(exc, client.base_url)}") from None
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    import json

    from .run.report import describe_report

    try:
        with open(args.path, encoding="utf-8") as file:
            report = json.load(file)
        print(describe_report(report))
    except OSError as exc:
        raise InputError(f"cannot read the run report {args.path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{args.path} is not a batchsum run report ({type(exc).__name__}: {exc})") from None
    return EXIT_OK


def _limits(args: argparse.Namespace) -> int:
    """``batchsum limits``: what the budget remembers of keys' limits; ``--forget`` removes them."""
    import datetime

    from .pacing.budget import ProcessBudget, open_budget
    from .pacing.limit import Found
    from .pacing.record import LIMIT
    from .run.spec import budget_spec, check_base_url, key_hash_from_environment

    budget = open_budget(budget_spec(args.budget), "")
    if isinstance(budget, ProcessBudget):
        print("the budget 'none' remembers nothing: there are no limits to list")
        return EXIT_OK
    mine = key_hash_from_environment()
    if args.this_key and mine is None:
        raise _Stop(EXIT_USAGE, f"error: --this-key needs ${ENV_API_KEY}")
    service = contract.service_identity(check_base_url(args.service)) if args.service else None

    async def look() -> tuple[list[Any], int]:
        """The entries chosen, and how many of them were forgotten (with --forget): one connection."""
        try:
            chosen = [
                e
                for e in await budget.remembered()
                if e.name == LIMIT
                and (service is None or e.service == service)
                and (not args.this_key or e.key_hash == mine)
            ]
            gone = 0
            for entry in chosen if args.forget else ():
                gone += await budget.forget(entry.key_hash, entry.service, LIMIT)
            return chosen, gone
        finally:
            await budget.aclose()

    found, gone = asyncio.run(look())
    for entry in found:
        limit = Found.from_json(entry.value, entry.at)
        when = datetime.datetime.fromtimestamp(entry.at).astimezone().strftime("%Y-%m-%d %H:%M %Z")
        this = " (this key)" if entry.key_hash == mine else ""
        shown = f"{limit.rpm:g}/min, {limit.how} {when}" if limit is not None else "unreadable"
        print(f"{entry.service}  {shown}  key {entry.key_hash}{this}")
    if not found:
        print(f"no limits remembered in {budget.where}" + (" for that choice" if service or args.this_key else ""))
    elif args.forget:
        print(f"forgot {gone} remembered limits; --rpm auto searches again for those keys")
    return EXIT_OK


def _journal(args: argparse.Namespace) -> int:
    import datetime

    from .data.journal import Journal

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
        state = ServiceState(
            args.key,
            rpm=args.rpm,
            faults=faults,
            admin_key=new_key() if args.test_controls else None,
            limit_kind=args.limit_kind,
            room_headers=args.room_headers,
        )
    except ValueError as exc:
        raise _Stop(EXIT_USAGE, str(exc)) from None
    shown = f"{args.host}:{args.port}" if ":" not in args.host else f"[{args.host}]:{args.port}"
    limit = f"{args.rpm} requests/min per key, {args.limit_kind}" if args.rpm else "no limit"
    stated = f"; answers state the room left ({args.room_headers})" if args.room_headers and args.rpm else ""
    print(f"batchsum local service on http://{shown} ({limit}{stated})", flush=True)
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
    handlers = {
        "summarize": _summarize,
        "text": _text,
        "serve": _serve,
        "journal": _journal,
        "report": _report,
        "limits": _limits,
    }
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    args.own_process = argv is None
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in _StopOnSignal.SIGNALS} if in_main_thread else {}
    if previous.get(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C: answers on the wire are kept
    try:
        with _JsonLogs(getattr(args, "log_format", "human") == "json"):
            return _dispatch(handlers[args.command], args)
    except KeyboardInterrupt:
        _say("interrupted")
        return EXIT_INTERRUPTED
    finally:
        # The command in its own process (no argv) ignores signals once its run is finished: a late
        # one changes nothing (and the interpreter's exit would restore the default, which kills).
        # Called in-process, every handler is put back as it was.
        finished = isinstance(signal.getsignal(signal.SIGTERM), _Late)
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if argv is None and finished else handler)


def _as_flags(message: str) -> str:
    """An option's error as the command line says it: ``invalid share ...`` as ``invalid --share ...``."""
    name, _, rest = message.removeprefix("invalid ").partition(" ")
    flags = {option.name: option.flag for option in OPTIONS}
    return f"invalid {flags[name]} {rest}" if message.startswith("invalid ") and name in flags else message


def _dispatch(handler: Any, args: argparse.Namespace) -> int:
    """The command's exit code; its errors said in one line (as JSON with --log-format json)."""
    try:
        code: int = handler(args)
        return code
    except _Stop as stop:
        _say(str(stop))
        return stop.code
    except InvalidParameterError as exc:
        _say(f"error: {_as_flags(str(exc))}")
        return EXIT_USAGE
    except (InputError, ConfigurationError, BudgetError) as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    except BatchsumError as exc:
        _say(f"error: {exc}")
        return EXIT_FATAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
