"""Where a rate budget or an answer store lives (``Location``): parsed once where a setting enters (a
flag, a keyword, the environment) and carried as a value to what opens it, reads it or shows it.

The one module that knows how a location is spelled: the kinds' words (``none``, ``process``,
``machine``), ``sqlite:///PATH``, the Redis schemes, a store's ``?prefix=NAME``, the machine's files in
the user's cache folder, and the one line that refuses a location, the same from every door.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from .errors import BudgetError, InvalidParameterError, redact_location
from .redis_url import client_problem

__all__ = ["Location", "BUDGET", "STORE", "NO_STORE", "KINDS", "REDIS_FORM", "machine_file"]

BUDGET, STORE = "budget", "store"  # what a location is for
NONE, PROCESS, MACHINE, FILE, REDIS = "none", "process", "machine", "file", "redis"  # what it names
KINDS = "machine, none, sqlite:///PATH or redis://HOST:PORT/DB"
REDIS_FORM = "redis://[:PASSWORD@]HOST:PORT/DB[?prefix=NAME]"
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")  # a location with one of these names a Redis
_SQLITE = "sqlite://"  # then the file's absolute path: sqlite:///PATH
_FILES = {BUDGET: "budget.sqlite", STORE: "answers.sqlite"}  # the machine's, in the user's cache folder
_ERRORS: dict[str, type[Exception]] = {BUDGET: BudgetError, STORE: InvalidParameterError}
_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,64}")


def machine_file(role: str) -> Path:
    """The machine's file for a budget (``budget.sqlite``) or a store (``answers.sqlite``), in the
    user's cache folder (``platformdirs``; honours ``$XDG_CACHE_HOME``), read when it is asked for."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("batchsum", appauthor=False)) / _FILES[role]


@dataclass(frozen=True, repr=False)
class Location:
    """A budget's or a store's place (``role``), as one value: its ``kind`` (``none``: a store that
    keeps nothing; ``process``: a budget in this process only, what ``budget="none"`` means;
    ``machine``: the machine's file in the user's cache folder; ``file``: ``sqlite:///PATH``; ``redis``),
    its ``text`` as checked (the scheme in lower case), a Redis' ``url`` as its client reads it and
    its ``prefix`` (``NAME:``; a budget is never prefixed, the store that follows it is). Made by
    ``parse`` (a setting as it enters) or ``at`` (a file); plain data that pickles to a worker, its
    secrets in ``text`` and ``url`` only: its ``repr`` and ``str`` show neither (``shown``)."""

    role: str
    kind: str
    text: str
    url: str = ""
    prefix: str = ""
    withheld: bool = False  # its credentials taken out (``without_secrets``): it cannot be opened

    @classmethod
    def parse(cls, value: object, role: str, source: str | None = None) -> Location:
        """``value`` as a ``role`` location (``BUDGET``, ``STORE``), from ``source`` (None: the option,
        ``--budget, budget=``; else the variable it came from). A store refuses ``process``. The
        error (``BudgetError`` for a budget, ``InvalidParameterError`` for a store) is one line naming
        the value without its credentials, and where it came from."""
        where = source or f"--{role}, {role}="
        error = _ERRORS[role]
        if not isinstance(value, str):
            more = ", or a Budget object" if role == BUDGET else ""
            raise error(f"invalid {role} {value!r} ({where}): use {KINDS}{more}")
        spelled = value.strip()
        lowered = spelled.lower()
        if lowered in (NONE, MACHINE) or (lowered == PROCESS and role == BUDGET):
            kind = PROCESS if lowered == NONE and role == BUDGET else lowered  # a budget's none: this process
            return cls(role, kind, lowered)
        if lowered.startswith(_SQLITE + "/") and len(spelled) > len(_SQLITE) + 1:
            return cls(role, FILE, _SQLITE + spelled[len(_SQLITE) :])
        if lowered.startswith(_REDIS_SCHEMES):
            return cls._redis(spelled, role, where)
        shown = re.sub(r"[^/@]*@", "***@", redact_location(spelled))  # a mistyped URL's credentials too
        raise error(f"unknown {role} {shown!r} ({where}): use {KINDS}")

    @classmethod
    def _redis(cls, spelled: str, role: str, where: str) -> Location:
        """A Redis URL: its ``prefix`` taken out (redis-py never sees it), the rest as its client reads it."""
        scheme, mark, rest = spelled.partition("://")
        text = scheme.lower() + mark + rest
        head, ask, query_text = text.partition("?")
        query = parse_qsl(query_text, keep_blank_values=True)
        names = [value for name, value in query if name == "prefix"]
        why: str | None = None
        if len(names) > 1 or (names and not _PREFIX.fullmatch(names[0])):
            why = f"invalid prefix {names[-1]!r} (one name of letters, digits, '.', '_' or '-', at most 64)"
        url = text  # as written when it has no prefix (unix:///PATH stays whole)
        if names:
            others = urlencode([(name, value) for name, value in query if name != "prefix"])
            url = head + (ask + others if others else "")
        why = why or client_problem(url)
        if why is not None:
            raise _ERRORS[role](f"invalid {role} {redact_location(text)!r} ({where}): {why}; use {REDIS_FORM}")
        return cls(role, REDIS, text, url, names[0] + ":" if names else "")

    @classmethod
    def of(cls, value: object, role: str, source: str | None = None) -> Location:
        """``value`` as a ``role`` location: a ``Location`` as it is (another role's: its text read for
        this one), a text parsed as from ``source`` (``parse``; a caller that names a place itself)."""
        if isinstance(value, Location):
            return value if value.role == role else cls.parse(value.text, role, source)
        return cls.parse(value, role, source)

    @classmethod
    def machine(cls, role: str) -> Location:
        """The default: the machine's (``machine``)."""
        return cls(role, MACHINE, MACHINE)

    @classmethod
    def at(cls, path: Any, role: str) -> Location:
        """The SQLite file at ``path`` (absolute), as ``sqlite:///PATH`` names it."""
        return cls(role, FILE, _SQLITE + str(path))

    @property
    def none(self) -> bool:
        """A store that keeps nothing (``store="none"``)."""
        return self.kind == NONE

    @property
    def process(self) -> bool:
        """A budget in this process only (``budget="none"``): nothing outside it sees it."""
        return self.kind == PROCESS

    @property
    def is_machine(self) -> bool:
        """The machine's own file in the user's cache folder (``machine``, the default)."""
        return self.kind == MACHINE

    @property
    def on_disk(self) -> bool:
        """A SQLite file on one machine's disk (the machine's, ``sqlite:///PATH``): not shared beyond it."""
        return self.kind in (MACHINE, FILE)

    @property
    def redis(self) -> bool:
        """A Redis (every machine that reaches it)."""
        return self.kind == REDIS

    @property
    def file(self) -> Path | None:
        """The SQLite file it names (``machine``: the machine's, read now; ``sqlite:///PATH``), else None."""
        if self.kind == MACHINE:
            return machine_file(self.role)
        if self.kind == FILE:
            return Path(self.text[len(_SQLITE) :])
        return None

    @property
    def shown(self) -> str:
        """Its text without credentials: how every message, report and repr names it."""
        return redact_location(self.text)

    @property
    def place(self) -> str:
        """Where it is for a person: ``this machine (PATH)`` for the machine's, else ``shown``."""
        return f"this machine ({self.file})" if self.kind == MACHINE else self.shown

    def pinned(self) -> Location:
        """The machine's made the file it names here (the same file on every worker, whatever their
        cache folder); any other as it is."""
        return Location.at(self.file, self.role) if self.kind == MACHINE else self

    def as_store(self) -> Location:
        """A budget's place as the store that follows it (a Redis budget's: the same Redis, its prefix)."""
        return dataclasses.replace(self, role=STORE)

    def without_secrets(self) -> Location:
        """This place without its credentials, for a copy that may be serialized (a lazy plan): marked
        ``withheld`` when it had some, so that it is never opened with ``***`` for a password."""
        if self.shown == self.text:
            return self
        return dataclasses.replace(self, text=self.shown, url=redact_location(self.url), withheld=True)

    def __repr__(self) -> str:
        return f"Location({self.role}={self.shown!r})"

    def __str__(self) -> str:
        return self.shown


NO_STORE = Location(STORE, NONE, NONE)  # a store that keeps nothing (``store="none"``)
