"""The stable path of ``RunSpec`` and the options table: ``batchsum.options`` (``OPTIONS``,
``EXCEPTIONS``, ``Secret``, ``ClientSettings``, ...). The code lives in ``batchsum.run.spec``; these
are the same objects, under the names it exports."""

from .run.spec import *  # noqa: F403  (every name it exports, as the same objects)
from .run.spec import __all__ as __all__
