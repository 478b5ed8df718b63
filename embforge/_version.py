"""The package's version, on the ground floor: modules that stamp it (saved folders, model cards) import it from
here, never from the package face ``embforge/__init__.py``, which names the upper floors."""

from __future__ import annotations

__version__ = "0.1.0"
