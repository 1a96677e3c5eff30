"""``python -m batchsum.cli``: the ``batchsum`` command."""

import sys

from batchsum.cli import main

sys.exit(main())
