"""``python -m sidecar`` is the ``sidecar`` command."""

import sys

from sidecar.cli import main

sys.exit(main())
