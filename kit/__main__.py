"""``python -m kit <command> ...``: the same as the ``kit`` script."""

import sys

from kit.cli import main

sys.exit(main())
