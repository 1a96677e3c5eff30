"""The ``batchsum`` command: ``summarize`` Parquet files, summarize one ``text``, ``serve`` locally.

Exit codes: 0 the run finished (per-row failures are in the output), 1 stopped by a fatal error
(wrong key, expired plan, a journal that cannot be written, the request cap reached, service
unreachable for a single text),
2 bad usage or input, 130 interrupted (SIGINT), 143 terminated (SIGTERM). Every stop says how to resume.

The command lives by idea: ``parser`` (the commands and their flags), ``summarize`` (a dataset, one
text), ``show`` (report, journal, limits, store), ``serve`` (the local service), ``signals`` (how a signal
stops a run) and ``console`` (what the command says, its exit codes); this module runs the command.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ..service.errors import BatchsumError, BudgetError, ConfigurationError, InputError, InvalidParameterError
from .console import EXIT_FATAL as EXIT_FATAL
from .console import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from .console import EXIT_OK as EXIT_OK
from .console import EXIT_TERMINATED as EXIT_TERMINATED
from .console import EXIT_USAGE as EXIT_USAGE
from .console import JsonLogs, Stop, say
from .parser import as_flags
from .parser import build_parser as build_parser
from .serve import serve_command
from .show import journal_command, limits_command, report_command, store_command
from .signals import Late, StopOnSignal
from .summarize import summarize_command, text_command

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version, or a usage error already said in one line
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    handlers = {
        "summarize": summarize_command,
        "text": text_command,
        "serve": serve_command,
        "journal": journal_command,
        "report": report_command,
        "limits": limits_command,
        "store": store_command,
    }
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    args.own_process = argv is None
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in StopOnSignal.SIGNALS} if in_main_thread else {}
    if previous.get(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C: answers on the wire are kept
    try:
        with JsonLogs(getattr(args, "log_format", "human") == "json"):
            return _dispatch(handlers[args.command], args)
    except KeyboardInterrupt:
        say("interrupted")
        return EXIT_INTERRUPTED
    finally:
        # The command in its own process (no argv) ignores signals once its run is finished: a late
        # one changes nothing (and the interpreter's exit would restore the default, which kills).
        # Called in-process, every handler is put back as it was.
        finished = isinstance(signal.getsignal(signal.SIGTERM), Late)
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if argv is None and finished else handler)


def _dispatch(handler: Any, args: argparse.Namespace) -> int:
    """The command's exit code; its errors said in one line (as JSON with --log-format json)."""
    try:
        code: int = handler(args)
        return code
    except Stop as stop:
        say(str(stop))
        return stop.code
    except InvalidParameterError as exc:
        say(f"error: {as_flags(str(exc))}")
        return EXIT_USAGE
    except (InputError, ConfigurationError, BudgetError) as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    except BatchsumError as exc:
        say(f"error: {exc}")
        return EXIT_FATAL
