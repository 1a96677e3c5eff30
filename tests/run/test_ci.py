"""CI runs every test: no marker, keyword or file is left out by pytest's options or by `.ci/run`'s
last command, the README's test command; before it, `.ci/run` runs the README's fast lane."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEAVING_OUT = ("-m", "-k", "--deselect", "--ignore", "--ignore-glob", "--lf", "--last-failed", "-x", "--exitfirst")


def _pytest_options() -> list[str]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the project's CI runs 3.11
        import tomli as tomllib
    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    return shlex.split(options.get("addopts", ""))


def _ci_command() -> str:
    """The command `.ci/run` ends with, its continuation lines joined."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace("\\\n", " ")
    last = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")][-1]
    return " ".join(last.split())


def _pytest_runs(command: str) -> list[str]:
    """Each ``.venv/bin/python -m pytest ...`` of a chain of commands joined by ``&&``."""
    return [part.strip() for part in command.split("&&") if "-m pytest" in part]


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _readme_command() -> str:
    """The README's test command: the bash block after "run the tests"."""
    after = _readme().split("run the tests", 1)[1]
    block = re.search(r"```bash\n(.+?)\n```", after, re.DOTALL)
    assert block is not None
    return " ".join(block.group(1).split())


def _readme_fast_lane() -> str:
    """The README's fast lane: the command named after "the fast lane"."""
    found = re.search(r"the fast lane, `([^`]+)`", " ".join(_readme().split()))
    assert found is not None
    return found.group(1)


def test_pytests_own_options_leave_no_test_out():
    options = _pytest_options()
    assert not [option for option in options if option.split("=")[0] in LEAVING_OUT], options


def test_ci_runs_the_readmes_fast_lane_first_then_its_test_command_which_leaves_no_test_out():
    ci, readme, fast = _ci_command(), _readme_command(), _readme_fast_lane()
    runs = _pytest_runs(ci)
    assert len(runs) == 2 and runs[0] == fast, runs  # the fast lane first: a broken edit fails in a minute
    assert ci.replace(f" && {fast}", "", 1) == readme  # and then the README's test command, whole
    assert " -m pytest " in fast and shlex.split(fast.split("-m pytest", 1)[1])[-2:] == ["-m", "not slow"]
    pytest_args = shlex.split(runs[-1].split("-m pytest", 1)[1])
    assert not [arg for arg in pytest_args if arg.split("=")[0] in LEAVING_OUT], pytest_args
