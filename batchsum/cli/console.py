"""What the command says and how it leaves: the exit codes, ``Stop`` (leave with a code and a
line), ``say`` (a line on stderr, or a JSON event with ``--log-format json``) and ``JsonLogs``."""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = [
    "EXIT_FATAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "JsonLogs",
    "Stop",
    "say",
]

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class Stop(Exception):
    """Leave with an exit code and a one-line message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


_json_logs = False  # --log-format json: stderr carries JSON events only


def say(message: str) -> None:
    if _json_logs:
        logging.getLogger("batchsum").info("%s", message, extra={"event": "message"})
        return
    print(f"batchsum: {message}", file=sys.stderr, flush=True)


class JsonLogs:
    """``--log-format json``: the ``batchsum`` logger's records as JSON lines on stderr, and nothing
    else there (no bar, no human lines) while the command runs."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._handler: logging.Handler | None = None
        self._saved: tuple[int, bool] = (logging.NOTSET, True)

    def __enter__(self) -> JsonLogs:
        global _json_logs
        if self.enabled:
            from ..run.logs import json_handler

            logger = logging.getLogger("batchsum")
            self._saved = (logger.level, logger.propagate)
            self._handler = json_handler(sys.stderr)
            logger.addHandler(self._handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
            _json_logs = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        global _json_logs
        if self._handler is not None:
            logger = logging.getLogger("batchsum")
            logger.removeHandler(self._handler)
            logger.setLevel(self._saved[0])
            logger.propagate = self._saved[1]
            _json_logs = False
