"""The stable path of the notebook apps: ``batchsum.widgets``. The code lives in
``batchsum.app.widgets``; these are the same objects, under the names it exports. Needs the
``notebook`` extra."""

from .app.widgets import *  # noqa: F403  (every name it exports, as the same objects)
from .app.widgets import __all__ as __all__
