"""A journal's side file: answers the journal could not take (a full disk, a read-only remount, a
quota), kept as JSON Lines beside it, or in the user's cache folder, until the next run takes them in."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from .results import Answer

__all__ = ["SideFile"]


class SideFile:
    """The side file of the journal at ``journal``: answers by their fingerprint as stored."""

    __slots__ = ("journal",)

    def __init__(self, journal: Path) -> None:
        self.journal = journal

    def places(self) -> list[Path]:
        """Where it goes: beside the journal, or in the user's cache folder (named after the
        journal's real path) when the journal's folder cannot take it either."""
        import hashlib

        import platformdirs

        path = self.journal
        digest = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:16]
        cache = Path(platformdirs.user_cache_dir("batchsum", appauthor=False)) / "unsaved"
        return [path.with_name(path.name + ".unsaved.jsonl"), cache / f"{path.name}.{digest}.jsonl"]

    def keep(self, answers: list[tuple[str, Answer]]) -> str | None:
        """Add ``answers`` to the first place that takes them, synced: where they went, or None when
        nowhere could take them."""
        lines = "".join(json.dumps([key, *answer]) + "\n" for key, answer in answers).encode()
        for target in self.places():
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(target, flags, 0o600)
                try:
                    os.write(fd, lines)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                continue
            return str(target)
        return None

    def kept(self) -> Iterator[tuple[Path, list[tuple[str, Answer]]]]:
        """Each place that holds answers, with them (remove it once they are journaled)."""
        for target in self.places():
            try:
                text = target.read_text(encoding="utf-8")
            except OSError:
                continue
            answers = []
            for line in text.splitlines():
                try:
                    key, *fields = json.loads(line)
                    answers.append((str(key), Answer(*fields)))
                except (ValueError, TypeError):
                    continue  # a line cut short by the fault that made it: its answer is paid again
            yield target, answers
