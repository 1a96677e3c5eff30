"""The run's events on the standard ``logging`` module, under the ``batchsum`` logger, and a formatter
that writes each as one JSON object (``--log-format json``), so a scheduler can read stderr line by line.

Events (the record's ``event`` attribute; its fields in ``fields``): ``start``, ``pause``,
``resume``, ``pace``, ``progress`` (at an interval), ``stop`` (the run stopped: a signal, the request
cap, a refused key, a broken input), ``error`` (it failed otherwise), ``end`` (always, last, with the
counts). Every event is logged at INFO (a stop is the run doing what it was asked, and the CLI says
it in its own words in human mode; logging's last-resort handler would print it twice): an
application's own handlers receive them, and pick them out by ``record.event``. Nothing here holds a secret: the fields are counts, times and the options
as ``RunSpec.describe()`` gives them.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

__all__ = ["LOGGER", "event", "JsonFormatter", "json_handler"]

LOGGER = "batchsum"

log = logging.getLogger(LOGGER)


def event(name: str, message: str, **fields: Any) -> None:
    """Log the event ``name`` with a line for a person (``message``) and its ``fields``."""
    log.info("%s", message, extra={"event": name, "fields": fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``event`` (``message`` for a
    record that is not an event), ``message`` and the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", "message"),
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({key: value for key, value in fields.items() if key not in out})
        if record.exc_info and record.exc_info[1] is not None:
            out["exception"] = type(record.exc_info[1]).__name__
        return json.dumps(out, ensure_ascii=False, default=str)


def json_handler(stream: Any) -> logging.Handler:
    """A handler writing JSON lines to ``stream`` (the CLI's stderr)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    return handler
