"""The command line's parser: the commands and their flags, the run options' flags made from
``OPTIONS`` (one name, default and help for every front-end), usage errors in one line."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any, NoReturn

from ..run.options_table import OPTIONS, STORE_SCOPES, Option
from ..service import contract
from ..service.errors import InvalidParameterError
from ..service.key_plans import ENV_API_KEYS
from ..service.settings import ENCODINGS, ENV_API_KEY, LONG_TEXT_POLICIES
from ..service.version import __version__
from .console import EXIT_USAGE, say
from .gateway import add_gateway

__all__ = ["as_flags", "build_parser"]


def _summary_type(text: str) -> str | None:
    lowered = text.strip().lower()
    if lowered in ("default", "none", ""):
        return None
    names = [t.value for t in contract.SummaryType]
    if lowered not in names:
        raise argparse.ArgumentTypeError(f"invalid type {text!r}: use default, {', '.join(names)}")
    return lowered


def _number(minimum: float, *, whole: bool = False, above: bool = False, most: float = math.inf) -> Any:
    """An argparse type: a finite number >= ``minimum`` (> with ``above``) and <= ``most``, whole or not."""

    def parse(text: str) -> float | int:
        if most < math.inf:
            wanted = f"a number from {minimum:g} to {most:g}"
        else:
            wanted = f"a finite {'whole ' if whole else ''}number {'>' if above else '>='} {minimum:g}"
        try:
            value: float | int = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if not (value > minimum if above else value >= minimum) or not value <= most or value == math.inf:
            raise argparse.ArgumentTypeError(f"{text!r} must be {wanted}")
        return value

    return parse


def _checked(option: Option) -> Any:
    """An argparse type: the flag's text checked by its option's one check (``OPTIONS``), so that a bad
    value is a usage error."""

    def parse(text: str) -> Any:
        try:
            return option.check(text, option.name, text=True)  # type: ignore[misc]
        except InvalidParameterError as exc:
            raise argparse.ArgumentTypeError("invalid " + str(exc).removeprefix(f"invalid {option.name} ")) from None

    return parse


_AGE_UNITS = {"m": 1 / 1440, "h": 1 / 24, "d": 1.0, "w": 7.0}
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _age(text: str) -> float:
    """An age in days: ``30d``, ``12h``, ``2w``, ``90m`` (minutes), or a number of days."""
    spelled = text.strip().lower()
    unit = spelled[-1:] if spelled[-1:] in _AGE_UNITS else "d"
    try:
        value = float(spelled.removesuffix(unit) if spelled[-1:] in _AGE_UNITS else spelled)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age: use e.g. 30d, 12h, 2w") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be an age of 0 or more")
    return value * _AGE_UNITS[unit]


def _whole_days(text: str) -> int:
    days = _age(text)
    if days < 1 or days != int(days):
        raise argparse.ArgumentTypeError(f"{text!r}: the retention is a whole number of days (e.g. 90d), at least 1")
    return int(days)


def _size(text: str) -> int:
    """A size in bytes: ``500MB``, ``2GB``, ``1GiB``, or a number of bytes."""
    spelled = text.strip().lower().replace(" ", "")
    number = spelled.rstrip("kmgib")
    unit = spelled[len(number) :]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: use e.g. 500MB, 2GB, 1GiB") from None
    if not 1 << 20 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: the size cap is at least 1 MiB")
    return int(value)


_MODES = [str(int(m)) for m in contract.Mode] + [m.name.lower() for m in contract.Mode]

# How each option is typed on the command line; its name, default, help and check come from ``OPTIONS``
# (a flag whose option has a check and no type here is read by it: ``_checked``).
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
    "timeout": {"metavar": "SECONDS"},
    "max_retries": {"metavar": "N"},
    "encoding": {"metavar": "|".join(ENCODINGS)},
    "rpm": {"metavar": "N|auto[:N]"},
    "concurrency": {"metavar": "N"},
    "budget": {"metavar": "WHERE"},
    "journal": {"metavar": "PATH"},
    "store": {"metavar": "WHERE"},
    "refresh": {"action": "store_true"},
    "max_wait": {"metavar": "SECONDS"},
    "budget_wait": {"metavar": "SECONDS"},
    "long_texts": {"metavar": "|".join(LONG_TEXT_POLICIES)},
    "store_scope": {"metavar": "|".join(STORE_SCOPES)},
    "max_requests": {"metavar": "N"},
    "sample": {"metavar": "N"},
    "share": {"metavar": "F"},
    "report": {"metavar": "PATH"},
    "keys": {"metavar": "FILE"},
    "quota": {"metavar": "N/PERIOD"},
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
        if option.check is not None and "type" not in kwargs and "action" not in kwargs:
            kwargs["type"] = _checked(option)
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
        say(f"error: {message}")
        say(f"see '{self.prog} --help'")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="batchsum",
        description="Summarize text in bulk through a rate-limited summarization API.",
        epilog=f"The API keys come from --keys FILE, else ${ENV_API_KEYS}, else ${ENV_API_KEY}.",
    )
    parser.add_argument(
        "--version", action="version", version=f"batchsum {__version__}", help="print the version and exit"
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
        help="list the rate limits --rpm auto found and the quotas services stated, and forget them",
        description="List what the rate budget remembers of each key's limit at each service (found by "
        "--rpm auto, or stated by the service) and of its quotas longer than a minute (stated, and spent "
        "until when): the service, the limit or quota, how and when it was known, and "
        "the key as a short hash (never a piece of it; 'this key' marks the one in "
        f"${ENV_API_KEY}). A remembered limit is where --rpm auto starts for a week; --forget removes it "
        "with everything the budget knows of that key at that service (whether it was answered, the pace "
        "and counts its runs share, a search under way), never answers.",
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
    limits.add_argument(
        "--forget",
        action="store_true",
        help="forget the limits listed (all, or those chosen), with their keys' proof, quotas, shared pace and counts",
    )
    limits.add_argument(
        "--keys",
        default=None,
        metavar="FILE",
        help="a key file (as summarize takes): each of its keys is marked with its line (default: the keys of "
        f"${ENV_API_KEYS}, if set)",
    )

    top = commands.add_parser(
        "top",
        help="watch the keys on a budget live: each key's pace against its limit, quotas, and every run on it",
        description="Watch the keys on a rate budget, refreshed every second until Ctrl-C: per key (its short "
        "hash and label, never a piece of it) the limit in force and where it came from (each, when its runs "
        "disagree), its starts in the last 10 s and minute against it, 429s, a pause and its end, its quotas "
        "(what is left, the reset) and a search under way; per run on it, its host and pid, door, output, "
        "limit, share, sent, reused, rows left, its own rate and ETA. Reading never writes the budget.",
    )
    top.add_argument(
        "--budget",
        default=None,
        metavar="WHERE",
        help="the budget to watch: machine (default, or $BATCHSUM_BUDGET), sqlite:///PATH or redis://HOST:PORT/DB "
        "(every machine on it)",
    )
    top.add_argument("--service", default=None, metavar="URL", help="only the keys at this service (base URL)")
    top.add_argument("--this-key", action="store_true", help=f"only the key in ${ENV_API_KEY}")
    top.add_argument(
        "--keys",
        default=None,
        metavar="FILE",
        help=f"a key file (as summarize takes): each of its keys is labelled with its line (default: the keys of "
        f"${ENV_API_KEYS}, if set)",
    )
    top.add_argument("--once", action="store_true", help="print one view and leave")
    top.add_argument(
        "--json",
        action="store_true",
        help="print each view as one JSON object on a line (docs/top.schema.json); with --once, one",
    )
    top.add_argument(
        "--metrics-port",
        type=_number(0, whole=True),
        default=None,
        metavar="PORT",
        help="also serve the figures as Prometheus metrics on this port (extra 'prometheus'; 9464 is usual)",
    )
    top.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address the metrics are served on (default 127.0.0.1; 0.0.0.0 for every interface)",
    )

    store = commands.add_parser(
        "store",
        help="show the answer store (entries by service and age), remove entries, set its retention and size",
        description="Show the answer store every run shares (so that no job pays twice for a text): where it "
        "is, its size, and its answers by service and age. --remove removes answers (--older-than, --service, or "
        "--all); a run then asks the service again for those. --retention and --max-size set how long answers are "
        "kept and how large the store may grow, for every run using it (pruned in small steps that never hold a "
        "run up).",
    )
    store.add_argument(
        "--store",
        default=None,
        metavar="WHERE",
        help="the store: machine (default, or $BATCHSUM_STORE; with a redis:// $BATCHSUM_BUDGET, that Redis), "
        "sqlite:///PATH or redis://HOST:PORT/DB",
    )
    store.add_argument("--remove", action="store_true", help="remove the answers chosen by the flags below")
    store.add_argument(
        "--older-than",
        type=_age,
        default=None,
        metavar="AGE",
        help="with --remove: written before AGE ago (30d, 12h, 2w)",
    )
    store.add_argument("--service", default=None, metavar="URL", help="with --remove: of this service (base URL)")
    store.add_argument(
        "--all", action="store_true", help="with --remove: every answer (alone, without --older-than or --service)"
    )
    store.add_argument(
        "--retention",
        type=_whole_days,
        default=None,
        metavar="AGE",
        help="keep answers this long after they were written (default 90d), for every run using the store",
    )
    store.add_argument(
        "--max-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help="the machine store's size cap (default 1GiB; 500MB, 2GB): the oldest answers go first beyond it",
    )

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

    add_gateway(commands, _add_options, _number)

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


def as_flags(message: str) -> str:
    """An option's error as the command line says it: ``invalid share ...`` as ``invalid --share ...``
    (one that says where its value came from, as a location's does from every door, as it is)."""
    name, _, rest = message.removeprefix("invalid ").partition(" ")
    flags = {option.name: option.flag for option in OPTIONS}
    said_where = f"({flags.get(name)}, " in message or " ($BATCHSUM_" in message  # a location's line: as it is
    if not message.startswith("invalid ") or name not in flags or said_where:
        return message
    return f"invalid {flags[name]} {rest}"
