"""Work done when another package is first imported: ``after_import("pandas", register)`` runs
``register`` once pandas has been imported (at once when it already is), so that ``import batchsum``
need not import pandas (the command line starts in a tenth of the time) while ``df.batchsum`` still
works whichever of the two a notebook imports first."""

from __future__ import annotations

import contextlib
import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

__all__ = ["after_import", "own_arrow", "own_collector"]

log = logging.getLogger("batchsum")
_lock = threading.Lock()


class _Watch:
    """Finds ``name`` as every other finder would, and wraps its loader to call back after it ran. (A
    meta path finder needs only ``find_spec``: ``importlib.abc`` and what it imports are not loaded.)"""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once, and out of the way of the real search below
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, callback = spec.loader, self.callback
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _call(callback)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _call(callback: Callable[[], Any]) -> None:
    try:
        callback()
    except Exception:  # noqa: BLE001 - never break the other package's import
        log.warning("batchsum could not register itself with a package just imported", exc_info=True)


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Call ``callback`` once module ``name`` is imported: now when it is, else right after its import."""
    with _lock:
        if name not in sys.modules:
            sys.meta_path.insert(0, _Watch(name, callback))
            return
    _call(callback)


def own_arrow() -> None:
    """pyarrow as a process of batchsum's own wants it (the command line), never in a process that is
    not ours (a notebook):

    - on Linux, where pyarrow's builds carry jemalloc, Arrow's memory comes from it, named before
      pyarrow loads (``ARROW_DEFAULT_MEMORY_POOL``; once loaded, the default pool has taken its
      arenas): jemalloc gives freed memory back; with the default, mimalloc, a rerun's peak was about
      50 MB higher (``benchmarks/scale.py``). The user's own setting wins;
    - pyarrow imports pandas (about 40 MB and a third of a second) at its first conversion of Python
      values, only to ask whether they are pandas objects: it looks once while pandas is hidden,
      remembers there is none, and pandas is never loaded (here pyarrow would believe pandas missing
      for good, which only a process that never hands Arrow data to pandas can afford);
    - httpx is loaded without its own command line (click, rich, pygments)."""
    if sys.platform.startswith("linux") and "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    if "httpx" not in sys.modules:
        with _hidden("click"):  # httpx's own command line (click, rich, pygments): never used here
            import httpx  # noqa: F401
    if "pandas" not in sys.modules:
        import pyarrow as pa

        with _hidden("pandas"):
            pa.array([0])


@contextlib.contextmanager
def _hidden(name: str) -> Iterator[None]:
    """While inside, an import of ``name`` (not yet imported) fails as if it were not installed."""
    hide = _Hidden(name)
    sys.meta_path.insert(0, hide)
    try:
        yield
    finally:
        sys.meta_path.remove(hide)


class _Hidden:
    """Makes an import of ``name`` fail, as if it were not installed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == self.name:
            raise ModuleNotFoundError(f"{fullname} is hidden from this process", name=fullname)
        return None


COLLECT_EVERY = 50_000  # new container objects between the collector's youngest passes, in batchsum's own process


def own_collector() -> None:
    """The cyclic garbage collector as a process of batchsum's own wants it (the command line), never
    in a process that is not ours: what the imports made is frozen out of its passes (it lives as
    long as the process), and its youngest pass runs every ``COLLECT_EVERY`` new objects rather than
    700. A run makes a few small tuples per row (results, answers), none of them in a cycle: with the
    default, a 200,000-row rerun spent about 7% of its work in the collector (``benchmarks/scale.py``).
    Cycles are still collected, at the same rates between the generations."""
    import gc

    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(COLLECT_EVERY, middle, oldest)
