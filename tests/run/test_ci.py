"""CI runs every test: no marker, keyword or file is left out by pytest's options or by `.ci/run`,
and the README's test command is the one `.ci/run` runs."""

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


def _readme_command() -> str:
    """The README's test command: the bash block after "run the tests"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split("run the tests", 1)[1]
    block = re.search(r"```bash\n(.+?)\n```", after, re.DOTALL)
    assert block is not None
    return " ".join(block.group(1).split())


def test_pytests_own_options_leave_no_test_out():
    options = _pytest_options()
    assert not [option for option in options if option.split("=")[0] in LEAVING_OUT], options


def test_ci_runs_the_readmes_test_command_and_leaves_no_test_out():
    ci, readme = _ci_command(), _readme_command()
    assert ci == readme
    pytest_args = shlex.split(ci.split("-m pytest", 1)[1])
    assert not [arg for arg in pytest_args if arg.split("=")[0] in LEAVING_OUT], pytest_args
