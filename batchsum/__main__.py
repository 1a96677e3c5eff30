"""``python -m batchsum``: the ``batchsum`` command."""

from batchsum.cli import main

raise SystemExit(main())
