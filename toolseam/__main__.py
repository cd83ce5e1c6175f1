"""``python -m toolseam``: the same as the ``toolseam`` command."""

import sys

from .frontends.cli import main

sys.exit(main())
