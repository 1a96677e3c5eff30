"""The stable path of batchsum's exceptions and redaction: ``batchsum.errors``. The code lives in
``batchsum.service.errors``; these are the same objects, under the names it exports."""

from .service.errors import *  # noqa: F403  (every name it exports, as the same objects)
from .service.errors import __all__ as __all__
