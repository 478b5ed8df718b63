"""``python -m embforge.cli``."""

import sys

from embforge.cli import main

sys.exit(main())
