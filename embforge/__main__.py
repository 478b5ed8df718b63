"""``python -m embforge`` — the ``embforge`` command; also what ``torchrun ... -m embforge train ...`` runs."""

from __future__ import annotations

import sys

from embforge.cli import main

if __name__ == "__main__":
    sys.exit(main())
