"""The ``batchsum`` command: ``summarize`` Parquet files, summarize one ``text``, ``serve`` locally,
``gateway`` for any HTTP client of a key.

Exit codes (docs/cli.md's table): 0 the run finished (per-row failures are in the output), 1 stopped
after it began (wrong key, expired plan, a journal that cannot be written, an input broken midway, the
request cap reached, the rate budget lost, an output that cannot be written at the end; service
unreachable for a single text), 2 bad usage or input (nothing sent), 130 interrupted (SIGINT), 143
terminated (SIGTERM; after two signals, the last one's code). Every stop says how to resume.

The command lives by idea: ``parser`` (the commands and their flags), ``summarize`` (a dataset, one
text), ``show`` (report, journal, limits, store), ``top`` (the keys on a budget, live), ``serve`` (the
local service), ``gateway`` (the interface served to any HTTP client, paced), ``signals`` (how a signal stops a run) and ``console`` (what the command says, its exit
codes); this module runs the command.
"""

from __future__ import annotations

import argparse
import io
import os
import select
import sys
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
from .signals import CommandSignals
from .summarize import summarize_command, text_command
from .top import top_command

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
        "top": top_command,
        "gateway": _gateway,
    }
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    args.own_process = argv is None
    # Outside a run, SIGINT (and SIGTERM) stop the command with their exit code; in its own process the
    # command never hands a signal back to its default disposition (see signals.CommandSignals).
    signals = args.signals = CommandSignals(say, own_process=args.own_process)
    try:
        with signals, JsonLogs(getattr(args, "log_format", "human") == "json"):
            try:
                return _dispatch(handlers[args.command], args)
            except BrokenPipeError:  # the reader stopped early (``batchsum limits | head -1``): not an error
                if not _stdout_gone():
                    raise
                _quiet_stdout()
                return EXIT_OK
            except KeyboardInterrupt:
                name = "terminated (SIGTERM)" if signals.code == EXIT_TERMINATED else "interrupted"
                say(f"{name}; what was done is kept")
                return signals.code
    except KeyboardInterrupt:  # a signal while the logs were being put back
        return signals.code


def _gateway(args: argparse.Namespace) -> int:
    from .gateway import gateway_command  # the web stack, loaded when the gateway runs

    return gateway_command(args)


def _stdout_gone() -> bool:
    """Is standard output a pipe whose reader is gone (the broken pipe was ours, not a socket's)?"""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))  # a pipe with no reader
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no file behind it, or no poll
        return False


def _quiet_stdout() -> None:
    """Standard output to /dev/null: what is still buffered for a closed pipe is not written again at
    exit (Python would say "Exception ignored ... BrokenPipeError")."""
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):  # no file behind stdout (a test's capture)
        pass


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
