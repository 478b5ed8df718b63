"""Where the bundled data sets live: ``$EMBFORGE_DATA``, else ``../shared/data`` beside the working directory."""

from __future__ import annotations

import os
from pathlib import Path


def data_root(override: str | os.PathLike | None = None) -> Path:
    """The folder holding the offline data sets (``stsb_en/``, ``mrpc/``, ...).

    Order: the ``override`` argument, the ``EMBFORGE_DATA`` environment variable, then ``../shared/data``
    relative to the current directory or to this source tree.
    """
    if override:
        return Path(override)
    env = os.environ.get("EMBFORGE_DATA")
    if env:
        return Path(env)
    for base in (Path.cwd(), Path(__file__).resolve().parents[1]):
        candidate = base.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return Path.cwd().parent / "shared" / "data"
