"""One place that imports optional dependencies and says which extra installs them."""

from __future__ import annotations

import importlib
from types import ModuleType

# module name -> the extra of embforge that installs it
_EXTRAS = {
    "faiss": "faiss",
    "bm25s": "bm25",
    "onnx": "onnx",
    "onnxruntime": "onnx",
    "fastapi": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
    "orjson": "serve",
    "prometheus_client": "serve",
    "sklearn": "eval",
    "matplotlib": "eval",
    "pytrec_eval": "eval",
    "datasets": "data",
    "pyarrow": "parquet",
    "pyarrow.parquet": "parquet",
    "qdrant_client": "qdrant",
    "mteb": "mteb",
    "peft": "peft",
    "fast_plaid.search": "plaid",
    "openvino": "openvino",
    "nncf": "openvino",
    "model2vec": "static",
    "skeletoken": "static",
}


def require(module: str) -> ModuleType:
    """Import ``module`` or fail with the ``pip install embforge[extra]`` command that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        extra = _EXTRAS.get(module, "all")
        raise ImportError(
            f"{module!r} is needed for this feature but is not installed. "
            f"Install it with: pip install 'embforge[{extra}]'"
        ) from err
