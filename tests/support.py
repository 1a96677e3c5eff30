"""What the tests share that is not a fixture: the local service's test keys, texts, free ports, a
redis-server of a test's own, and the waits (each a guard against a hang, never a timing)."""

from __future__ import annotations

import codecs
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest

# The session's local service (tests/conftest.py ``service``) knows these three keys, one per plan.
KEY = "test-key-premium-0123456789"
BASIC_KEY = "test-key-basic-0123456789"
EXPIRED_KEY = "test-key-expired-0123456789"

T = TypeVar("T")


def article(words: int, seed: int = 0) -> str:
    """A text of exactly ``words`` words in sentences of about twelve."""
    vocabulary = (
        "river council budget school market station harbour bridge museum garden library festival "
        "factory railway hospital stadium theatre college village airport"
    ).split()
    out = []
    for i in range(words):
        word = vocabulary[(i * 7 + seed * 13 + i // 12) % len(vocabulary)]
        out.append(word.capitalize() if i % 12 == 0 else word)
        if i == 0:
            out[0] = f"Case{seed}"  # every seed its own text
        if i % 12 == 11 or i == words - 1:
            out[-1] += "."
    return " ".join(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Read at import, before tests/conftest.py's ``clean_environ`` takes BATCHSUM_* away from each test.
_SERVERS_REQUIRED = os.environ.get("BATCHSUM_TEST_SERVERS") == "required"


def need(what: str, install: str) -> None:
    """Skip for want of a real server, with what to install; CI sets BATCHSUM_TEST_SERVERS=required
    so that a missing server fails there instead of hiding."""
    message = f"needs {what}: {install}"
    if _SERVERS_REQUIRED:
        pytest.fail(message)
    pytest.skip(message)


# The columns every door adds to its rows, in their order (docs/cli.md, "Result columns").
RESULT_COLUMNS = [
    "summary",
    "summary_status",
    "summary_error",
    "summary_message",
    "summary_http_status",
    "summary_attempts",
    "summary_requests",
]


def summarize_args(source: Path | str, output: Path | str, *flags: object) -> list[str]:
    """``summarize SOURCE -o OUTPUT --column text FLAGS...``: the words after ``batchsum``."""
    return ["summarize", str(source), "-o", str(output), "--column", "text", *map(str, flags)]


def summarize_argv(source: Path | str, output: Path | str, *flags: object) -> list[str]:
    """``batchsum summarize SOURCE -o OUTPUT --column text FLAGS...`` in a Python process of its own."""
    return [sys.executable, "-m", "batchsum.cli", *summarize_args(source, output, *flags)]


def refuse_the_final_rename(monkeypatch: pytest.MonkeyPatch, name: str = "out.parquet") -> None:
    """The rename that puts the output ``name`` in place refused, as a folder made read-only refuses it
    (root, who runs CI here, writes to read-only folders, so chmod cannot produce it)."""
    real = os.replace

    def refuse(src, dst, *args, **kwargs):
        if str(dst).endswith(name):
            raise PermissionError(13, "Permission denied")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", refuse)


# -- waits: for a condition, never for a timer ----------------------------------------------------


def wait_for(
    condition: Callable[[], T],
    seconds: float = 120.0,
    what: str | Callable[[], object] = "the condition",
    *,
    every: float = 0.02,
    alive: subprocess.Popen | None = None,
) -> T:
    """Wait until ``condition()`` gives something true, and return it. ``seconds`` is a guard against
    a hang, never a timing: past it the test fails naming ``what`` it waited for (a callable is asked
    then, for what it says). With ``alive``, the process the condition waits on: its end first fails
    at once, with what it wrote."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if alive is not None and alive.poll() is not None:
            raise AssertionError(
                f"the process ended (exit {alive.returncode}) before {_said(what)}: {alive.communicate()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {seconds:g} s waiting for {_said(what)}")
        time.sleep(every)
    return found


def wait_for_count(
    service, count: int, what: str = "requests", seconds: float = 120.0, *, alive: subprocess.Popen | None = None
) -> int:
    """Wait until the local service counted ``count`` ``what`` (a key of its stats: requests,
    answered), and return how many it counted then."""
    wait_for(lambda: service.stats()[what] >= count, seconds, f"{count} {what} at the service", alive=alive)
    return service.stats()[what]


def interrupt_after(service, count: int, seconds: float = 120.0) -> dict[str, int]:
    """SIGINT to this process, as Ctrl-C sends it, from a thread once the local service counted
    ``count`` requests; how many it had counted then is put in the dict returned, under "at"."""
    counted: dict[str, int] = {}

    def interrupt() -> None:
        counted["at"] = wait_for_count(service, count, seconds=seconds)
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: to the process, whose main thread hears it

    threading.Thread(target=interrupt, daemon=True).start()
    return counted


def _said(what: str | Callable[[], object]) -> str:
    return what if isinstance(what, str) else str(what())


def stderr_until(proc: subprocess.Popen, words: str, seconds: float = 120.0) -> list[str]:
    """The lines ``proc`` wrote to stderr (a pipe) until one held ``words``, and any read with it;
    fails if the process closes stderr first or says nothing of it in ``seconds`` (a guard against a
    hang). What comes later is left to ``communicate()``."""
    return _lines_until(proc.stderr, "stderr", words, seconds)


def stdout_until(proc: subprocess.Popen, words: str, seconds: float = 120.0) -> list[str]:
    """The same as ``stderr_until``, on ``proc``'s stdout (a server's first line: its address)."""
    return _lines_until(proc.stdout, "stdout", words, seconds)


def _lines_until(pipe: IO[Any] | None, name: str, words: str, seconds: float) -> list[str]:
    """Read from the pipe's descriptor, never through the buffered stream: a line held in that buffer
    would never wake the selector again."""
    assert pipe is not None, f"{name} is not a pipe"
    fd, decoder = pipe.fileno(), codecs.getincrementaldecoder("utf-8")(errors="replace")
    lines: list[str] = []
    partial, deadline = "", time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not any(words in line for line in lines):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"gave up after {seconds:g} s waiting for a line with {words!r}: {lines + [partial]}"
                )
            if selector.select(timeout=0.1):
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"{name} ended with no line with {words!r}: {lines + [partial]}")
                *complete, partial = (partial + decoder.decode(chunk)).split("\n")
                lines.extend(line + "\n" for line in complete)
    return lines + [partial] if partial else lines


# -- a redis-server of a test's own -----------------------------------------------------------------


class RedisServer:
    """A real redis-server (Debian's package) on a free loopback port, nothing saved: stopped with
    SIGKILL (its data gone) and started again, empty, on the same port."""

    def __init__(self, folder: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            need("a real redis-server", "apt-get install redis-server (Debian's package)")
        self.exe, self.folder, self.port = str(exe), folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        redis = pytest.importorskip("redis")
        argv = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = process = subprocess.Popen(
            [*argv, "--dir", str(self.folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

        def answers() -> bool:
            try:
                return bool(redis.Redis.from_url(self.url).ping())
            except redis.ConnectionError:
                return False

        wait_for(answers, 30, "redis-server to answer", every=0.05, alive=process)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


# -- what runs leave behind -------------------------------------------------------------------------


def budget_ledger(budget: str, key: str, base_url: str):
    """``key``'s ledger on ``budget``: every process's starts of the last two minutes, by the tick."""
    import asyncio

    from batchsum import Client
    from batchsum.pacing.budgets.budget import open_budget

    with Client(api_key=key, base_url=base_url) as client:
        identity = client.identity

    async def read():
        opened = open_budget(budget, identity)
        try:
            return await opened.ledger(120)
        finally:
            await opened.aclose()

    return asyncio.run(read())


def runs_on_the_key(service, key: str = KEY) -> set[tuple[str, str]]:
    """The runs on ``key``'s machine budget now, as (run id, member): a job's partitions or actors are
    one run, each of them a member; a run that ends leaves."""
    import asyncio

    from batchsum import Client
    from batchsum.pacing.budgets.budget import open_budget

    with Client(api_key=key, base_url=service.url) as client:
        identity = client.identity

    async def read() -> set[tuple[str, str]]:
        budget = open_budget("machine", identity)
        try:
            return {(entry.run_id, entry.member) for entry in await budget.runs()}
        finally:
            await budget.aclose()

    return asyncio.run(read())


def ticks_before(now: float, seconds: float) -> list[float]:
    """Each tenth of a second in the ``seconds`` before ``now``: where a window may begin."""
    return [now - seconds + i / 10 for i in range(int(seconds * 10))]


def report_when(path: Path | str, done: Callable[[dict], bool], seconds: float = 60.0) -> dict:
    """The report at ``path`` once ``done`` holds for it. A shared job's parts are each written beside
    it before they are merged in: a part on disk is not yet in the merged file."""

    def read() -> dict:
        try:
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def finished() -> dict | None:
        report = read()
        return report if report and done(report) else None

    return wait_for(finished, seconds, lambda: f"the report to be done: {read()}")


def merged_report(path: Path | str, parts: int, seconds: float = 60.0) -> dict:
    """The merged report of a shared job at ``path`` once it holds ``parts`` parts."""
    return report_when(path, lambda report: report.get("partitions") == parts, seconds)
