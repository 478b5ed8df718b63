"""The embedding server: ``create_app(...)`` builds a FastAPI app; nothing is loaded or started at import.

Modules: ``config`` (ServeConfig), ``batcher`` (dynamic micro-batching), ``prometheus`` (metrics text),
``store`` (documents in SQLite, ``database``, + the vector index beside them, ``vectors``), ``memory_store`` (the
in-memory documents of sparse and multi-vector models), ``serving`` (the per-kind serving record and its lookup;
``dense`` is the dense kind's), ``models`` (the served models), ``requests`` (request bodies), ``middleware`` (the
request gate), ``auth`` (the API key as a security dependency), ``app`` (the endpoints), ``runner`` (load models, run uvicorn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from embforge.serve.app import create_app

        return create_app
    if name == "ServeConfig":
        from embforge.serve.config import ServeConfig

        return ServeConfig
    raise AttributeError(name)
