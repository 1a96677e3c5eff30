"""Every command and code block of README.md and docs/*.md runs here, against the local service.

The blocks are collected from the Markdown: fenced blocks tagged ``bash``, ``sh``, ``console`` or
``python`` are code; any other tag (``text``, ``json``, ...) is not, and an untagged fence is an error.
One test per block, named ``PAGE:LINE`` (the line of its opening fence). ``docs/architecture.md`` and
``docs/interface.md`` are not collected (the first holds diagrams only; the second's curl example
needs a ``batchsum serve`` that never exits, and is covered by ``docs/local-service.md``'s).

- **Not run**: a block whose last non-blank line before the fence is ``*Not run: <reason>.*`` is
  skipped with its reason (``-ra`` lists them); ``test_not_run_blocks`` counts and prints them. A
  block that cannot run here (an object store, a remote scheduler or Redis, a crontab or script file,
  ``batchsum serve``, a ``pip install``, Airflow, Spark, Ray) must carry the marker, or
  ``test_every_block_is_run_or_marked`` fails.
- **Where**: each page gets its own working folder (a temporary one) holding copies of
  ``examples/`` and ``notebooks/``; its blocks run there in the order they appear, so a block can
  use what an earlier block of its page wrote. Running one block alone first runs the blocks before
  it on its page. Pages are independent, so a few run at once (``WORKERS``), in the background; each
  block's test waits for its result.
- **bash/sh** blocks run with ``bash -e -o pipefail``; **console** blocks run their ``$ `` lines the
  same way (the other lines are output). **python** blocks of one page run in one Python process,
  one namespace, in order (top-level ``await`` is a syntax error here, as in a script).
- **Against what**: one ``LocalService(rpm=6000)`` for the module. ``BATCHSUM_API_KEY`` and
  ``BATCHSUM_BASE_URL`` name it, so a block aimed at the live service runs against it, and
  ``BATCHSUM_RPM=6000`` is its plan. ``export BATCHSUM_API_KEY=...`` placeholder lines are dropped,
  so the test's key stands. ``XDG_CACHE_HOME`` and ``HOME`` point into the temporary folder (the
  machine budget and remembered limits live there), ``PATH`` starts with this interpreter's folder
  (the venv's ``bin``: ``batchsum``, ``python``), ``PYTHONPATH`` with this checkout.
- **README's install command** (``python3 -m venv .venv && .venv/bin/pip install ... &&
  .venv/bin/batchsum ...``) runs only its ``batchsum`` part, with the venv's ``batchsum``.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from batchsum.local import LocalService
from tests.support import need

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in ("architecture.md", "interface.md")),
]
CODE = {"bash", "sh", "console", "python"}
SHELL = {"bash", "sh", "console"}
BIN = Path(sys.executable).parent  # the venv's bin: batchsum, python
TIMEOUT = 120  # seconds for one block (they take a second or two)
README_LINES = 200
WORKERS = 3  # pages run at once: their blocks wait on subprocesses and the service as much as on a core

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
NOT_RUN = re.compile(r"^\*Not run:(.*)\*\s*$")
PLACEHOLDER_KEY = re.compile(r"^\s*export BATCHSUM_API_KEY=(\.\.\.|<[^>]*>)\s*(#.*)?$")
INSTALL = re.compile(r"^.*&&\s*\.venv/bin/(batchsum\b.*)$", re.DOTALL)
# What cannot run here: a block that matches one of these must be marked *Not run: ...*.
TOOLS = {"curl": "curl", "timeout": "coreutils", "node": "nodejs"}  # programs blocks call, beyond bash and the venv
CANNOT_RUN = {
    r"\b(s3|gs|abfs)://": "an object store",
    r"\b(redis|rediss|unix)://": "a Redis server",
    r"\btcp://": "a remote scheduler",
    r"^#!": "a script file",
    r"crontab": "a crontab",
    r"\bbatchsum serve\b": "a server that never exits",
    r"\bpip install\b": "an install",
    r"\bairflow\b": "Airflow",
    r"\bpyspark\b|batchsum\.spark\b": "a Spark session",
    r"\bbatchsum\.ray\b|\bimport ray\b": "Ray",
}


@dataclass
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Page:
    name: str
    blocks: list[Block]  # its code blocks, in order
    markers: list[int]  # lines of *Not run* markers
    used_markers: set[int]
    untagged: list[int]  # lines of fences without a language


def parse(path: Path) -> Page:
    """The fenced blocks of one Markdown page, with the *Not run* marker before each."""
    name = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    page = Page(name, [], [], set(), [])
    i = 0
    while i < len(lines):
        if NOT_RUN.match(lines[i]):
            page.markers.append(i + 1)
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, lang = opening.group(2), opening.group(3).lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if not lang:
            page.untagged.append(start + 1)
            continue
        if lang not in CODE:
            continue
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = NOT_RUN.match(lines[before]) if before >= 0 else None
        reason = None
        if marker:
            reason = marker.group(1).strip().rstrip(".").strip()
            page.used_markers.add(before + 1)
        page.blocks.append(Block(name, start + 1, lang, "\n".join(body) + "\n", reason))
    return page


PARSED = {page.name: page for page in map(parse, PAGES)}
BLOCKS = [block for page in PARSED.values() for block in page.blocks]


def shell_script(block: Block) -> str:
    """What bash runs for a shell block: its commands, the placeholder key exports dropped."""
    if block.lang == "console":
        commands: list[str] = []
        continued = False
        for line in block.code.splitlines():
            if continued:
                commands.append(line)
            elif line.startswith("$ "):
                commands.append(line[2:])
            else:
                continue
            continued = line.rstrip().endswith("\\")
        code = "\n".join(commands) + "\n"
    else:
        code = block.code
    install = INSTALL.match(code.strip())
    if install and "pip install" in code:
        code = f"{BIN}/{install.group(1)}\n"  # only the summarize part: no venv made, nothing installed
    return "".join(line + "\n" for line in code.splitlines() if not PLACEHOLDER_KEY.match(line))


def cannot_run(block: Block) -> list[str]:
    """What in an unmarked block cannot run here (README's install command is run in part)."""
    code = block.code
    install = INSTALL.match(code.strip())
    if install and "pip install" in code:
        code = install.group(1)
    return [why for pattern, why in CANNOT_RUN.items() if re.search(pattern, code, re.MULTILINE)]


def missing_tool(block: Block) -> str | None:
    """A program the block calls that this machine lacks (the venv provides the rest)."""
    for tool, package in TOOLS.items():
        if block.lang in SHELL and re.search(rf"(^|[|;&(]\s*){tool}\b", block.code, re.MULTILINE):
            if shutil.which(tool) is None:
                return f"{tool} (apt-get install {package})"
    return None


WORKER = r"""
import json, os, sys, traceback
channel = os.fdopen(os.dup(1), "w")  # answers go here; the blocks' own output goes to the log
os.dup2(2, 1)
namespace = {"__name__": "__main__"}
for request in sys.stdin:
    request = json.loads(request)
    print(f"--- {request['name']}", flush=True)
    try:
        exec(compile(request["code"], request["file"], "exec"), namespace)
        answer = {"ok": True}
    except BaseException:
        answer = {"ok": False, "error": traceback.format_exc()}
    sys.stdout.flush()
    sys.stderr.flush()
    channel.write(json.dumps(answer) + "\n")
    channel.flush()
"""


class PythonSession:
    """One Python process for a page's python blocks: one namespace, blocks sent in order."""

    def __init__(self, folder: Path, env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self.log: IO[bytes] = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-c", WORKER],
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )

    def run(self, block: Block) -> str | None:
        """None when the block ran; else what went wrong, with its output."""
        start = self.log_path.stat().st_size
        # Blank lines first, so that a traceback's line numbers are the Markdown's.
        request = {"name": block.id, "file": str(ROOT / block.page), "code": "\n" * block.line + block.code}
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            return "the page's Python process has ended:\n" + self.output(start)
        ready, _, _ = select.select([self.process.stdout], [], [], TIMEOUT)
        if not ready:
            self.close()
            return f"no answer in {TIMEOUT} s:\n" + self.output(start)
        answer = self.process.stdout.readline()
        if not answer:
            return "the page's Python process has ended:\n" + self.output(start)
        result = json.loads(answer)
        return None if result["ok"] else f"{result['error']}\noutput:\n{self.output(start)}"

    def output(self, start: int) -> str:
        self.log.flush()
        with self.log_path.open("rb") as log:
            log.seek(start)
            return log.read().decode(errors="replace")[-4000:]

    def end(self) -> None:
        """Ask the process to end (its input closes); ``close`` waits for it."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass

    def close(self) -> None:
        self.end()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


@dataclass
class Workspace:
    """The module's environment, and the pages' blocks running in the background: ``WORKERS`` pages
    at a time (they are independent: each has its own folder and Python process), each page's blocks
    in order. A test waits for its block's result."""

    root: Path
    env: dict[str, str]
    results: dict[str, str | None] = field(default_factory=dict)  # block id -> what went wrong, or None
    done: dict[str, threading.Event] = field(default_factory=dict)
    sessions: dict[str, PythonSession] = field(default_factory=dict)
    pool: ThreadPoolExecutor | None = None

    def start(self, selected: list[Block]) -> None:
        """Run every page up to its last selected block (a block never runs without the ones before it)."""
        last: dict[str, int] = {}
        for block in selected:
            last[block.page] = max(last.get(block.page, -1), PARSED[block.page].blocks.index(block))
        self.done = {block.id: threading.Event() for block in BLOCKS}
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="docs-page")
        for page, upto in last.items():
            self.pool.submit(self.run_page, PARSED[page], upto)

    def run_page(self, page: Page, upto: int) -> None:
        folder = self.root / "pages" / page.name.replace("/", "__")
        folder.mkdir(parents=True)
        for shipped in ("examples", "notebooks"):
            shutil.copytree(ROOT / shipped, folder / shipped)
        for block in page.blocks[: upto + 1]:
            if block.not_run is not None or missing_tool(block):
                self.done[block.id].set()  # its test skips
                continue
            try:
                self.results[block.id] = self.execute(block, folder)
            except Exception as exc:  # the harness, not the block: still a result, never a hang
                self.results[block.id] = f"the test could not run it: {exc!r}"
            self.done[block.id].set()

    def check(self, block: Block) -> None:
        """Fail, naming the block's line, when it did not run cleanly."""
        if not self.done[block.id].wait(TIMEOUT * len(BLOCKS)):
            pytest.fail(f"{block.id} was never run", pytrace=False)
        error = self.results[block.id]
        if error is not None:
            page = PARSED[block.page].blocks
            before = [b.id for b in page[: page.index(block)] if self.results.get(b.id)]
            note = f" (earlier blocks of the page failed: {', '.join(before)})" if before else ""
            pytest.fail(f"{block.id} ({block.lang}) failed{note}:\n{error}", pytrace=False)

    def execute(self, block: Block, folder: Path) -> str | None:
        if block.lang == "python":
            if block.page not in self.sessions:
                log = self.root / f"{block.page.replace('/', '__')}.python.log"
                self.sessions[block.page] = PythonSession(folder, self.env, log)
            return self.sessions[block.page].run(block)
        script = shell_script(block)
        try:
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", script],
                cwd=folder,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return f"no end in {TIMEOUT} s:\n{script}"
        if done.returncode == 0:
            return None
        return f"exit code {done.returncode} from:\n{script}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        for session in self.sessions.values():
            session.end()  # all at once: each takes a moment to stop its threads
        for session in self.sessions.values():
            session.close()


@pytest.fixture(scope="module")
def workspace(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("docs")
    (root / "home").mkdir()
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("BATCHSUM_") and not name.lower().endswith("_proxy")
    }
    service = LocalService(rpm=6000).start()
    env.update(
        BATCHSUM_API_KEY=service.key,
        BATCHSUM_BASE_URL=service.url,
        BATCHSUM_RPM="6000",
        XDG_CACHE_HOME=str(root / "cache"),
        HOME=str(root / "home"),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        PYTHONDONTWRITEBYTECODE="1",
    )
    space = Workspace(root, env)
    selected = [
        item.callspec.params["block"]
        for item in request.session.items
        if hasattr(item, "callspec") and isinstance(item.callspec.params.get("block"), Block)
    ]
    try:
        space.start(selected)
        yield space
    finally:
        space.close()
        service.stop()


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_block(block: Block, workspace: Workspace) -> None:
    if block.not_run is not None:
        pytest.skip(f"{block.id} not run: {block.not_run}")
    if tool := missing_tool(block):
        need(f"{tool} for {block.id}", ".ci/run installs it")
    workspace.check(block)


def test_not_run_blocks() -> None:
    """Every block that is not run says why, visibly; the list is printed (``pytest -s``)."""
    skipped = [block for block in BLOCKS if block.not_run is not None]
    for block in skipped:
        assert block.not_run, f"{block.id}: a *Not run* marker needs a reason"
    ran = len(BLOCKS) - len(skipped)
    print(f"\n{ran} code blocks run, {len(skipped)} not run:")
    for block in skipped:
        print(f"  {block.id} ({block.lang}): {block.not_run}")
    assert ran >= 30, "the pages' code blocks were not found"


def test_every_block_is_run_or_marked() -> None:
    """No block is left out quietly: every fence is tagged, a block that cannot run here is marked,
    and every marker belongs to a code block."""
    problems = []
    for page in PARSED.values():
        problems += [f"{page.name}:{line}: an untagged fence (tag it, e.g. text)" for line in page.untagged]
        problems += [
            f"{page.name}:{line}: a *Not run* marker that is not right before a code block"
            for line in page.markers
            if line not in page.used_markers
        ]
        for block in page.blocks:
            if block.not_run is None and (why := cannot_run(block)):
                problems.append(f"{block.id}: needs {', '.join(why)}: mark it *Not run: <reason>.*")
    assert not problems, "\n".join(problems)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings (outside code fences)."""
    found: set[str] = set()
    fence = None
    for line in path.read_text(encoding="utf-8").splitlines():
        opening = FENCE.match(line)
        if opening:
            fence = None if fence else opening.group(2)[0]
            continue
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading and fence is None:
            base = name = slug(heading.group(1))
            count = 1
            while name in found:
                name = f"{base}-{count}"
                count += 1
            found.add(name)
    return found


def test_links() -> None:
    """Every relative link and picture in the pages points at a file that exists, and at a heading
    that exists in a Markdown page."""
    broken = []
    for path in PAGES:
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(f"{path.name}: {target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{path.name}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; at most {README_LINES}"
