"""The public API is listed once, in docs/api.md: each public module's ``__all__`` is exactly its list
there, every name resolves, and the import paths users type keep working with the same objects after
the package moved into folders by layer."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def listed() -> dict[str, list[str]]:
    """Module -> the names docs/api.md lists under its heading."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in API.read_text().splitlines():
        heading = re.fullmatch(r"## `([\w.]+)`", line)
        if heading:
            current = sections.setdefault(heading[1], [])
        elif current is not None and (item := re.match(r"- `(\w+)`: ", line)):
            current.append(item[1])
    return sections


SECTIONS = listed()
OPTIONAL = {
    "batchsum.spark": "pyspark",
    "batchsum.dask": "dask",
    "batchsum.polars": "polars",
    "batchsum.ray": "ray",
    "batchsum.duckdb": "duckdb",
}


def test_the_page_lists_every_public_module():
    assert list(SECTIONS) == [
        "batchsum",
        "batchsum.spark",
        "batchsum.dask",
        "batchsum.polars",
        "batchsum.ray",
        "batchsum.duckdb",
        "batchsum.widgets",
        "batchsum.local",
        "batchsum.options",
        "batchsum.errors",
    ]


@pytest.mark.parametrize("name", list(SECTIONS))
def test_all_is_exactly_the_documented_list_and_every_name_resolves(name):
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name])
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(SECTIONS[name]), "docs/api.md and __all__ disagree"
    assert len(set(module.__all__)) == len(module.__all__)
    for item in module.__all__:
        assert getattr(module, item) is not None


def test_the_stable_paths_give_the_same_objects_as_their_homes():
    import batchsum
    import batchsum.errors
    import batchsum.options
    import batchsum.widgets
    from batchsum.app import widgets
    from batchsum.run import spec
    from batchsum.service import errors

    for shim, home in ((batchsum.options, spec), (batchsum.errors, errors), (batchsum.widgets, widgets)):
        for item in shim.__all__:
            assert getattr(shim, item) is getattr(home, item), (shim.__name__, item)
    assert batchsum.RunSpec is spec.RunSpec and batchsum.AuthenticationError is errors.AuthenticationError


def test_the_console_script_and_python_m_batchsum_run_the_command_line():
    from importlib.metadata import entry_points

    (script,) = [point for point in entry_points(group="console_scripts") if point.name == "batchsum"]
    assert script.value == "batchsum.cli:main" and callable(script.load())
    for command in (
        [sys.executable, "-m", "batchsum", "--version"],
        [sys.executable, "-m", "batchsum.cli", "--version"],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "batchsum" in done.stdout + done.stderr, done
