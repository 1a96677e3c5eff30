"""The summarize commands: ``batchsum summarize`` (a dataset into an output file, paced, journaled,
resumable, stopped by a signal with every answer kept) and ``batchsum text`` (one text)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from ..pacing.budgets.quota import utc
from ..run.spec import RunSpec
from ..service.errors import (
    APIError,
    AuthenticationError,
    BrokenInputError,
    BudgetError,
    InputError,
    JournalError,
    NotPremiumError,
    QuotaSpent,
    RequestCapReached,
    explain,
    redact_location,
)
from .console import EXIT_FATAL, EXIT_OK, EXIT_USAGE, Stop, say
from .signals import StopOnSignal

__all__ = ["summarize_command", "text_command"]


def _remove_empty_journal(path: Path) -> None:
    """A journal this run created and that holds no answer (the key was refused at once)."""
    from ..data.journal import Journal

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
    from ..data.datasets import default_journal

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
        from .._imports import own_arrow, own_collector

        own_arrow()
        own_collector()


def summarize_command(args: argparse.Namespace) -> int:
    _own_process(args)
    from ..data.datasets import DatasetInput, DatasetOutput, check_output
    from ..data.results import check_output_columns
    from ..run.run import Run, dry_run

    # Everything that can be refused is checked before any file is created or anything is sent.
    spec = RunSpec.from_args(args, key_required=not args.dry_run).replace(door="cli")
    if args.log_format == "json":
        spec = spec.replace(progress=False)
    source = DatasetInput(args.inputs, args.column, format=args.format)
    target = check_output(args.output, source)
    journal_path = _journal_path(args, target, source)
    spec = spec.replace(journal=str(journal_path))
    shown = redact_location(target.spec)  # the output as shown: without credentials
    if source.schema is not None:  # the result columns' names are free in the input (a dry run says so too)
        check_output_columns(source.schema.names, spec.output_column, hint="--output-column NAME")
    if args.dry_run:
        print(dry_run(spec, source.texts()))
        return EXIT_OK
    journal_path.parent.mkdir(parents=True, exist_ok=True)  # the cache folder, for a remote output's journal
    journal_existed = journal_path.exists()
    if spec.client.local:
        say("using the local reference service (extractive summaries made on this machine)")
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
    stop = StopOnSignal(say, command=getattr(args, "signals", None))

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
            say(f"stopped: {explain(exc)}; nothing was kept, so fix the key or the plan and run the command again")
        else:
            say(f"stopped after {stats.done} rows: {explain(exc)}; {run.new_answers} new answers kept; {resume}")
        return EXIT_FATAL
    except QuotaSpent as exc:
        command = shlex.join(["batchsum", *getattr(args, "argv", [])])
        say(
            f"stopped: {exc}. {target.spec} holds every row (the {exc.remaining} not sent: failed, not_sent); "
            f"{run.new_answers} new answers are kept in {journal_path}. The same command continues once a quota "
            f"resets ({utc(exc.resets_at)}): {command}"
        )
        return EXIT_FATAL
    except RequestCapReached as exc:
        command = shlex.join(["batchsum", *getattr(args, "argv", [])])
        say(
            f"stopped: {exc}. {target.spec} holds every row (the {exc.remaining} not sent: failed, not_sent); "
            f"{run.new_answers} new answers are kept in {journal_path}, so no text is paid for twice. "
            f"To continue, run the same command again: {command}"
        )
        return EXIT_FATAL
    except BudgetError as exc:
        if not run.opened:
            raise  # refused before anything was sent: a usage error
        command = shlex.join(["batchsum", *getattr(args, "argv", [])])
        say(
            f"stopped: {exc}; {stats.done} rows were done; {run.new_answers} new answers kept in {journal_path}. "
            f"Once the budget answers, the same command continues: {command}"
        )
        return EXIT_FATAL
    except JournalError as exc:
        say(
            f"stopped: {exc}. {shown} holds the {stats.yielded} rows finished so far, with every answer "
            f"received; free space (or pass another --journal), then run the same command again to resume"
        )
        return EXIT_FATAL
    except BrokenInputError as exc:
        say(
            f"stopped: {exc}. {shown} holds the {stats.yielded} rows read and finished before it broke; "
            f"{run.new_answers} new answers are kept in {journal_path}, so a rerun pays for none of them again: "
            "mend or replace the input, then run the same command again"
        )
        return EXIT_FATAL
    except InputError as exc:
        if not run.opened:
            raise  # refused before anything was sent: a usage error
        # What the input or the output refused once the run was under way (the output's final rename,
        # a remote output's put): every answer is journaled, so this is a stop, not a usage error.
        say(f"stopped: {exc}; {stats.done} rows were done; {run.new_answers} new answers kept; {resume}")
        return EXIT_FATAL
    except (KeyboardInterrupt, asyncio.CancelledError):
        why = "terminated (SIGTERM)" if stop.received == signal.SIGTERM else "interrupted"
        say(
            f"{why}: {stats.done} rows were done ({stats.ok} ok); {run.new_answers} new answers kept in "
            f"the journal, with those that arrived while stopping; {resume}"
        )
        return stop.code
    late = f" (a {signal.Signals(stop.late).name} came after every row was done)" if stop.late else ""
    say(f"wrote {shown}: {stats.account()}{late}")
    unreachable = stats.failed_by_code["connection_error"] + stats.failed_by_code["timeout"]
    if unreachable:
        say(
            f"{unreachable} rows could not reach the service at {redact_location(run.base_url)} after {spec.client.max_retries} "
            "retries each: check --base-url and the network, then run the same command again"
        )
    not_sent = stats.failed_by_code["not_sent"]
    if not_sent:
        why = "not in the sample: the same command without --sample sends them" if spec.sample else "see its message"
        say(f"{not_sent} rows were not sent ({spec.output_column}_error not_sent; {why})")
    if stats.failed - not_sent:
        say(
            f"{stats.failed - not_sent} rows failed (see the {spec.output_column}_error column); "
            f"running the same command again retries the transient ones"
        )
    return EXIT_OK


def text_command(args: argparse.Namespace) -> int:
    if args.text == "-" and sys.stdin.isatty():
        raise Stop(
            EXIT_USAGE,
            'error: no text given: pass it as an argument (batchsum text "...") or on standard '
            "input (batchsum text < article.txt)",
        )
    from ..run.run import bind
    from ..service.client import Client

    spec = bind(RunSpec.from_args(args))
    text = sys.stdin.read() if args.text == "-" else args.text
    with Client(**spec.client.client_kwargs()) as client:
        try:
            print(client.summarize(text, *spec.params))
        except APIError as exc:
            raise Stop(EXIT_FATAL, f"error: {explain(exc, client.base_url)}") from None
    return EXIT_OK
