"""``python -m lah``: the same as the ``lah`` command."""

import sys

from lah.cli import main

sys.exit(main())
